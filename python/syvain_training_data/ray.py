"""Ray Data: read a split as a ``ray.data.Dataset``, write a Dataset through ``DatasetSaver``.

Needs the ``ray`` extra (``pip install 'syvain-training-data[ray]'``); without it, importing this
module raises ModuleNotFoundError naming the extra and the install command.

- :func:`read_dataset` / :class:`SyvainDatasource`: one read task per shard, or per record range
  of ``records_per_task`` records, reading with the package's own readers (``iter_shard``).
  Blocks are pyarrow tables (:func:`records_to_block` is the one place that builds them).
- :class:`SyvainDatasink`: ``ds.write_datasink(sink)`` saves deterministic shards and commits
  the manifest once, on the driver, after every write task succeeded. Shard IDs are
  ``{write task index}-{piece index}-{digest of the piece's rows}``: a re-run whose write tasks
  get the same rows in the same places reuses the shards an interrupted run completed, and rows
  that differ get another ID instead of a finished shard that holds other records.

Secrets: the datasource and the sink reach Ray workers as cloudpickles, which hold no secret
(Ray keeps them in its object store, which may spill to disk) unless the ``StorageConfig`` was
built with ``picklable_secret=True``; otherwise each worker takes it from its own
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``: the environment of its node's ``ray start``
(a local cluster started by ``ray.init()`` inherits the driver's). With an explicit secret that
is not picklable, the datasource and the sink first ask one task per node whether its workers
have the secret of that access key (when constructed on a running Ray, and again when Ray Data
plans their tasks), and raise ValueError in the driver, before any read or write task, if one
does not (see README "Deriving a dataset on Ray").
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from syvain_training_data.extras import missing_extra

try:
    import pyarrow as pa
    import ray.data
    from ray.data.block import Block, BlockAccessor, BlockMetadata
    from ray.data.context import DataContext
    from ray.data.datasource import Datasink, Datasource, ReadTask, WriteResult
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ModuleNotFoundError as error:  # pragma: no cover - exercised without the extra
    raise missing_extra("syvain_training_data.ray needs Ray Data", "ray", error) from error

from syvain_training_data.loading.selection import select_shards
from syvain_training_data.manifest import DataManifest, DataManifestDataFormat, ManifestShard
from syvain_training_data.manifest import parse_manifest as _parse_manifest
from syvain_training_data.manifest import read_manifest_bytes as _read_manifest_bytes
from syvain_training_data.publish import DatasetSaver, encode_segment
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig, _secret_from_environment
from syvain_training_data.uris import check_shard_scheme

__all__ = [
    "SyvainDatasink",
    "SyvainDatasource",
    "WriteSummary",
    "check_workers_have_secret",
    "read_dataset",
    "records_to_block",
]

#: Records per block a read task yields (blocks are pyarrow tables of up to this many rows).
BLOCK_RECORDS: Final = 4096
#: Rows converted to dicts at a time when a write task hands a piece to the saver.
_ROWS_PER_BATCH: Final = 1024


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def records_to_block(records: list[Mapping[str, Any]]) -> pa.Table:
    """One Ray block from decoded records: a pyarrow table whose columns are every key any of
    the records has, in first-seen order (missing keys are null). Raises ValueError (from
    pyarrow) for values Arrow cannot hold in one column, such as an int in one record and a str
    in another."""
    keys = list(dict.fromkeys(key for record in records for key in record))
    if not keys:  # records without keys: a table of no columns that keeps the row count
        return pa.Table.from_struct_array(pa.array(records))
    # One array per column: far faster than inferring one struct array.
    return pa.table({key: pa.array([record.get(key) for record in records]) for key in keys})


@ray.remote(num_cpus=0, max_retries=0)
def _workers_have_secret(access_key_id: str | None, needs_token: bool) -> bool:
    """On a worker: whether its environment pairs ``access_key_id`` with a secret (and has a
    session token, when ``needs_token``); the answer is a bool, the secret never leaves the
    worker."""
    if needs_token and not os.environ.get("AWS_SESSION_TOKEN"):
        return False
    return _secret_from_environment(access_key_id) is not None


# (job, node, access key id, session token needed) whose workers were found to have the secret.
_NODES_WITH_SECRET: set[tuple[str, str, str | None, bool]] = set()


def check_workers_have_secret(storage_config: StorageConfig, uris: Iterable[str]) -> None:
    """Raises ValueError, in the driver and before any read or write task, when a config with an
    explicit secret that is not picklable would reach Ray workers that cannot authenticate:
    a node whose workers' ``AWS_ACCESS_KEY_ID`` does not name the config's access key or that
    have no ``AWS_SECRET_ACCESS_KEY``. Asks one task per alive node (a yes is cached for the
    job). Nothing to ask when none of ``uris`` is an ``s3://`` URI, for a config without a
    secret or with ``picklable_secret=True``, or when Ray is not running yet (the datasource
    and the sink ask again when Ray Data plans their tasks, never starting Ray themselves)."""
    if storage_config.secret_access_key is None or storage_config.picklable_secret:
        return
    if not ray.is_initialized() or not any(uri.startswith("s3://") for uri in uris):
        return
    job = ray.get_runtime_context().get_job_id()
    key = storage_config.access_key_id
    needs_token = storage_config.session_token is not None
    nodes = [
        node["NodeID"]
        for node in ray.nodes()  # type: ignore[no-untyped-call]  # (ray leaves it untyped)
        if node["Alive"] and (job, node["NodeID"], key, needs_token) not in _NODES_WITH_SECRET
    ]
    answers = ray.get(
        [
            _workers_have_secret.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(key, needs_token)
            for node in nodes
        ]
    )
    missing = [node for node, has in zip(nodes, answers, strict=True) if not has]
    _NODES_WITH_SECRET.update(
        (job, node, key, needs_token) for node in nodes if node not in missing
    )
    if missing:
        raise ValueError(
            f"The Ray workers of {len(missing)} of {len(nodes)} node(s) have no secret access "
            f"key for access key id {key!r}, and Ray tasks get this StorageConfig without its "
            "secret (Ray's pickles hold none: its object store may spill them to disk). Set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN with a session "
            "token) in the environment of every node's "
            "`ray start` (a local cluster started by ray.init() inherits the driver's), or "
            "build the StorageConfig with picklable_secret=True where you trust every place a "
            "pickle can go, Ray's spill files included"
        )


@dataclass(frozen=True)
class _RecordRange:
    shard: ManifestShard
    start: int
    stop: int


def _read_range(
    data_format: DataManifestDataFormat,
    part: _RecordRange,
    storage_config: StorageConfig,
) -> Iterator[Block]:
    records: list[Mapping[str, Any]] = []
    for record in iter_shard(
        data_format, part.shard, storage_config=storage_config, start=part.start, stop=part.stop
    ):
        records.append(record)
        if len(records) == BLOCK_RECORDS:
            yield _block_of(records, part)
            records = []
    if records:
        yield _block_of(records, part)


def _block_of(records: list[Mapping[str, Any]], part: _RecordRange) -> pa.Table:
    try:
        return records_to_block(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ValueError(
            f"Records {part.start}..{part.stop} of shard {part.shard.uri} do not fit one Arrow "
            f"table (a Ray block): {error}"
        ) from None


class SyvainDatasource(Datasource):
    """The records of one split, a curriculum stage or a union of stages, as Ray read tasks.

    The manifest is read once, here, on the driver; its shards are confined to its scheme
    unless ``allow_mixed_schemes`` (SPEC section 4). Read tasks depend only on the manifest and
    ``records_per_task`` (never on the cluster size), so a pipeline's blocks are the same on
    every run.

    Raises what ``load_manifest`` raises, and the selection errors of ``SplitDataLoader.load``
    (unknown split or stage, both stage arguments, ...); ValueError for a ``records_per_task``
    that is not a positive int or a shard of another scheme, and for an explicit secret the Ray
    workers could not authenticate with (:func:`check_workers_have_secret`).
    """

    def __init__(
        self,
        manifest_uri: str,
        split: str,
        *,
        curriculum_stage: str | None = None,
        curriculum_stages: list[str] | tuple[str, ...] | None = None,
        storage_config: StorageConfig | None = None,
        records_per_task: int | None = None,
        allow_mixed_schemes: bool = False,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # (ray leaves it untyped)
        _check_positive("records_per_task", records_per_task)
        self.storage_config = storage_config or StorageConfig()
        check_workers_have_secret(self.storage_config, [manifest_uri])
        manifest = _parse_manifest(
            _read_manifest_bytes(manifest_uri, storage_config=self.storage_config), manifest_uri
        )
        shards = select_shards(manifest, split, curriculum_stage, curriculum_stages)[0]
        for shard in shards:
            check_shard_scheme(manifest_uri, shard.uri, allow_mixed_schemes=allow_mixed_schemes)
        check_workers_have_secret(self.storage_config, [shard.uri for shard in shards])
        self.manifest_uri = manifest_uri
        self.data_format: DataManifestDataFormat = manifest.data_format
        self.ranges = [
            _RecordRange(shard, start, min(start + step, shard.records))
            for shard in shards
            for step in [records_per_task or shard.records]
            for start in range(0, shard.records, step)
        ]

    def get_name(self) -> str:
        return "Syvain"

    def estimate_inmemory_data_size(self) -> int:
        """The stored (compressed) bytes of the selected records: a lower bound."""
        return sum(_range_bytes(part) for part in self.ranges)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
    ) -> list[ReadTask]:
        """One task per range, whatever ``parallelism`` asks (see the class docstring).
        Raises ValueError first if the workers could not authenticate
        (:func:`check_workers_have_secret`)."""
        check_workers_have_secret(self.storage_config, [part.shard.uri for part in self.ranges])
        return [
            ReadTask(
                functools.partial(_read_range, self.data_format, part, self.storage_config),
                BlockMetadata(
                    num_rows=part.stop - part.start,
                    size_bytes=_range_bytes(part),
                    input_files=(part.shard.uri,),
                    exec_stats=None,
                ),
                per_task_row_limit=per_task_row_limit,
            )
            for part in self.ranges
        ]


def _range_bytes(part: _RecordRange) -> int:
    return part.shard.size_bytes * (part.stop - part.start) // part.shard.records


def read_dataset(
    manifest_uri: str,
    split: str,
    *,
    curriculum_stage: str | None = None,
    curriculum_stages: list[str] | tuple[str, ...] | None = None,
    storage_config: StorageConfig | None = None,
    records_per_task: int | None = None,
    allow_mixed_schemes: bool = False,
    **read_args: Any,
) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of the selected records (each a row; blocks are pyarrow tables).

    One read task per shard, or per ``records_per_task`` records of a shard (a large shard is
    read as record ranges, skipping the records before each range without decoding them).
    ``read_args`` go to ``ray.data.read_datasource`` (``concurrency``, ``num_cpus``,
    ``ray_remote_args``, ...). Errors: see :class:`SyvainDatasource`; reading raises what
    ``iter_shard`` raises, and ValueError for records that do not fit one Arrow table.
    """
    source = SyvainDatasource(
        manifest_uri,
        split,
        curriculum_stage=curriculum_stage,
        curriculum_stages=curriculum_stages,
        storage_config=storage_config,
        records_per_task=records_per_task,
        allow_mixed_schemes=allow_mixed_schemes,
    )
    dataset: ray.data.Dataset = ray.data.read_datasource(source, **read_args)
    return dataset


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Written:
    shard_id: str
    records: int
    reused: bool


@dataclass(frozen=True)
class WriteSummary:
    """What one ``write_datasink`` did: shards saved now, shards an earlier (interrupted) run
    had completed and that were reused, records in both, and the committed manifest (None with
    ``commit=False``)."""

    shards_written: int
    shards_reused: int
    records: int
    manifest: DataManifest | None


class SyvainDatasink(Datasink[list[_Written]]):
    """Writes a Dataset as one split (or curriculum stage) of a dataset, through
    :class:`DatasetSaver`, then commits the manifest once: ``ds.write_datasink(sink)``.

    Each write task saves one deterministic shard per piece: all the rows the task received, or
    pieces of ``records_per_shard`` rows (Ray then gives each task at least that many rows).
    Its ID is ``{task index:06d}-{piece index:06d}-{sha256 of the piece's Arrow data, 24 hex}``;
    a re-run reuses every shard whose task got the same rows (SPEC section 5's ``recover``).
    The commit expects exactly this run's shard IDs for the split and stage, so a shard an
    interrupted run left at an ID this run did not produce (its rows or their order changed)
    makes the commit a ValueError naming it rather than a manifest with records twice.

    With ``commit=False`` the sink only saves shards: write several splits or stages of one
    dataset with ``commit=False`` and the last with ``commit=True`` (the commit publishes every
    completed shard under the manifest). After ``write_datasink``, :attr:`summary` tells what
    was written and reused.

    Raises ValueError (from :class:`DatasetSaver`) for an invalid manifest URI, format or names,
    for a ``records_per_shard`` that is not a positive int, and for an explicit secret the Ray
    workers could not authenticate with (:func:`check_workers_have_secret`).
    """

    def __init__(
        self,
        manifest_uri: str,
        *,
        data_format: DataManifestDataFormat = "jsonl.gz",
        split: str,
        curriculum_stage: str | None = None,
        curriculum_metadata: Mapping[str, Any] | None = None,
        storage_config: StorageConfig | None = None,
        records_per_shard: int | None = None,
        commit: bool = True,
    ) -> None:
        _check_positive("records_per_shard", records_per_shard)
        encode_segment(split, "split")
        if curriculum_stage is not None:
            encode_segment(curriculum_stage, "curriculum_stage")
        if curriculum_metadata is not None and curriculum_stage is None:
            raise ValueError("curriculum_metadata requires a curriculum_stage")
        self.saver = DatasetSaver(
            manifest_uri, data_format=data_format, storage_config=storage_config
        )
        check_workers_have_secret(self.saver.storage_config, [manifest_uri])
        self.split = split
        self.curriculum_stage = curriculum_stage
        self.curriculum_metadata = dict(curriculum_metadata) if curriculum_metadata else None
        self.records_per_shard = records_per_shard
        self.commit = commit
        self.summary: WriteSummary | None = None

    def get_name(self) -> str:
        return "Syvain"

    @property
    def min_rows_per_write(self) -> int | None:
        return self.records_per_shard

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """On the driver, before the write tasks: raises ValueError if the workers could not
        authenticate (:func:`check_workers_have_secret`)."""
        check_workers_have_secret(self.saver.storage_config, [self.saver.manifest_uri])

    def write(self, blocks: Iterable[Block], ctx: Any) -> list[_Written]:
        """Saves this task's pieces (``ctx`` is Ray's TaskContext; its ``task_idx`` names them)."""
        written = []
        for index, piece in enumerate(_pieces(blocks, self.records_per_shard)):
            shard_id = f"{ctx.task_idx:06d}-{index:06d}-{_digest(piece)}"
            # ``save`` would reuse a finished shard too; asking first tells reused from new.
            reused = self.saver.recover(
                self.split,
                self.curriculum_stage,
                shard_id=shard_id,
                curriculum_metadata=self.curriculum_metadata,
            )
            shard = reused or self.saver.save(
                self.split,
                self.curriculum_stage,
                _rows(piece),
                curriculum_metadata=self.curriculum_metadata,
                shard_id=shard_id,
            )
            written.append(_Written(shard_id, shard.records, reused is not None))
        return written

    def on_write_complete(self, write_result: WriteResult[list[_Written]]) -> None:
        written = [item for task in write_result.write_returns for item in task]
        manifest = None
        if self.commit:
            self.saver.expect_shards(
                self.split, self.curriculum_stage, [item.shard_id for item in written]
            )
            manifest = self.saver.commit_manifest()
        self.summary = WriteSummary(
            shards_written=sum(not item.reused for item in written),
            shards_reused=sum(item.reused for item in written),
            records=sum(item.records for item in written),
            manifest=manifest,
        )


def _pieces(blocks: Iterable[Block], records_per_shard: int | None) -> Iterator[list[pa.Table]]:
    """The rows of ``blocks`` in order, cut into pieces of ``records_per_shard`` rows (the last
    may be shorter), or one piece of them all; empty pieces are left out."""
    piece: list[pa.Table] = []
    rows = 0
    for block in blocks:
        table = BlockAccessor.for_block(block).to_arrow()
        offset = 0
        while offset < table.num_rows:
            take = table.num_rows - offset
            if records_per_shard is not None:
                take = min(take, records_per_shard - rows)
            piece.append(table.slice(offset, take))
            rows += take
            offset += take
            if rows == records_per_shard:
                yield piece
                piece, rows = [], 0
    if rows:
        yield piece


def _digest(piece: list[pa.Table]) -> str:
    """Identifies a piece's rows (schema and Arrow IPC bytes of its batches)."""
    digest = hashlib.sha256()
    for table in piece:
        digest.update(table.schema.serialize())
        for batch in table.to_batches():
            digest.update(batch.serialize())
    return digest.hexdigest()[:24]


def _rows(piece: list[pa.Table]) -> Iterator[dict[str, Any]]:
    for table in piece:
        for batch in table.to_batches(max_chunksize=_ROWS_PER_BATCH):
            yield from batch.to_pylist()

"""`SplitDataLoader`: stream a manifest's splits into torch DataLoaders (SPEC section 6).

The loader reads the manifest once, at construction. ``load`` selects shards (a split, one
curriculum stage, a union of stages, or stages mixed by weight), builds the selection's plan
(:mod:`syvain_training_data.loading.plan`) and returns a DataLoader whose dataset reads this
rank's and worker's part of each epoch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from syvain_training_data.argument_checks import (
    boolean,
    callable_or_none,
    mapping_or_none,
    number,
)
from syvain_training_data.extras import missing_extra

try:
    import torch
except ModuleNotFoundError as error:  # pragma: no cover - exercised without the extra
    raise missing_extra("SplitDataLoader needs PyTorch", "torch", error) from error

from torch.utils.data import DataLoader

from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.formats.shard_index import block_records
from syvain_training_data.loading import arguments, mixing, plan
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading.columns import ColumnDataLoader, ColumnDataset, TensorCollate
from syvain_training_data.loading.dataloader import RecordDataLoader, endless
from syvain_training_data.loading.dataset import (
    DatasetPlan,
    ShardDataset,
    ShardTable,
    stream_tables,
)
from syvain_training_data.loading.selection import select_shards
from syvain_training_data.loading.shard_indexes import has_index, has_page_index
from syvain_training_data.manifest import DataManifest, ManifestShard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import check_shard_scheme

__all__ = ["SplitDataLoader"]

# Arguments that only mean something with worker processes.
_WORKER_ONLY_ARGS = ("persistent_workers", "prefetch_factor", "multiprocessing_context")


# Blocks a window may interleave (the interleaving names a block in 16 bits).
MAX_WINDOW_BLOCKS: Final = 1024


def _block_sizes(
    table: ShardTable, stream_shards: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], ...]:
    """Per stream, the records per block of each of its indexed shards."""
    return tuple(
        tuple(block_records(table.records[i], table.sizes[i]) for i in ids) for ids in stream_shards
    )


def _checked_index_root(index_root: object) -> str | None:
    """``index_root`` (where ``syvain-data index --to`` wrote the indexes), checked."""
    if index_root is None:
        return None
    if not isinstance(index_root, str):
        raise TypeError(f"index_root must be a URI str, not {type(index_root).__name__}")
    scheme = index_root.split("://", 1)[0] if "://" in index_root else ""
    if scheme not in ("s3", "file", "gs"):
        raise ValueError(
            f"index_root must be an s3://, gs:// or file:// prefix, got {index_root!r}"
        )
    return index_root


def _rank_zero_answer(question: Callable[[], bool]) -> bool:
    """``question()`` as rank 0 of an initialised torch.distributed group answers it (sent to
    every rank; an error there is raised on every rank), else as this process does."""
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return question()
    if distributed.get_world_size() == 1:
        return question()
    sent: list[object] = [None]
    failure: BaseException | None = None
    if distributed.get_rank() == 0:
        try:
            sent = [question()]
        except Exception as error:  # every rank must still take part in the broadcast
            failure, sent = error, [f"{type(error).__name__}: {error}"]
    distributed.broadcast_object_list(sent, src=0)
    if failure is not None:
        raise failure
    if not isinstance(sent[0], bool):
        raise RuntimeError(f"Rank 0 could not tell whether the dataset has indexes: {sent[0]}")
    return sent[0]


class SplitDataLoader:
    """Builds DataLoaders over one manifest's splits; see :meth:`load`.

    Created by :meth:`SyvainTrainingData.split_data_loader`, which reads the manifest once.
    """

    def __init__(
        self,
        manifest: DataManifest,
        collate_fn: Callable[[list[Any]], Any] | None,
        dataloader_args: Mapping[str, Any] | None = None,
        *,
        storage_config: StorageConfig | None = None,
        manifest_uri: str | None = None,
        allow_mixed_schemes: bool = False,
    ) -> None:
        """``manifest_uri`` (where the manifest was read) confines its shards to the same
        scheme unless ``allow_mixed_schemes`` (SPEC section 4)."""
        callable_or_none(collate_fn, "collate_fn")
        args = dict(mapping_or_none(dataloader_args, "dataloader_args") or {})
        if "collate_fn" in args:
            raise ValueError("Pass collate_fn to split_data_loader, not dataloader_args")
        for reserved in ("dataset", "sampler", "batch_sampler"):
            if reserved in args:
                raise ValueError(f"{reserved} cannot be set in dataloader_args")
        workers = args.get("num_workers", 0)
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise TypeError(f"num_workers must be an int, not {type(workers).__name__}")
        if workers < 0:
            raise ValueError(f"num_workers must not be negative, got {workers}")
        self.manifest = manifest
        self.manifest_uri = manifest_uri
        self.collate_fn = collate_fn
        self.dataloader_args = args
        self.storage_config = storage_config or StorageConfig()
        self.allow_mixed_schemes = allow_mixed_schemes

    def select_shards(
        self,
        split: str,
        curriculum_stage: str | None = None,
        *,
        curriculum_stages: Sequence[str] | None = None,
    ) -> list[ManifestShard]:
        """The shards ``load`` reads, in order. Raises the ValueErrors listed in :meth:`load`."""
        return self._select(split, curriculum_stage, curriculum_stages)[0]

    def _select(
        self,
        split: str,
        curriculum_stage: str | None,
        curriculum_stages: Sequence[str] | None,
    ) -> tuple[list[ManifestShard], list[list[int]], list[str]]:
        return select_shards(self.manifest, split, curriculum_stage, curriculum_stages)

    def _mixing_weights(
        self,
        split: str,
        stages: list[str],
        mixing_weights: Mapping[str, float] | str,
    ) -> list[float]:
        entry = self.manifest.splits[split]
        if isinstance(mixing_weights, str):
            if mixing_weights != "metadata":
                raise ValueError(
                    f"mixing_weights must be a mapping or 'metadata', not {mixing_weights!r}"
                )
            raw = {stage: entry.curriculum[stage].metadata.get("weight") for stage in stages}
        else:
            if set(mixing_weights) != set(stages):
                raise ValueError(
                    "mixing_weights must name exactly the stages mixed "
                    f"({', '.join(stages)}), got {', '.join(map(str, mixing_weights))}"
                )
            raw = dict(mixing_weights)
        return arguments.check_mixing_weights(stages, [raw[stage] for stage in stages])

    def _plan(self, options: arguments.LoadOptions) -> tuple[DatasetPlan, dict[str, Any]]:
        """The datasets' plan and the DataLoader's arguments of a ``load`` or ``load_tokens``
        call (``batch_size`` and ``drop_last`` still among them); raises its ValueErrors."""
        split, curriculum_stage = options.split, options.curriculum_stage
        curriculum_stages = options.curriculum_stages
        mixing_weights, mixing_stop = options.mixing_weights, options.mixing_stop
        pairs = None
        if options.mixing_schedule is not None:
            if mixing_weights is not None:
                raise ValueError("Pass mixing_weights or mixing_schedule, not both")
            pairs = schedules.entries(options.mixing_schedule)
            stages_given = curriculum_stage is not None or curriculum_stages is not None
            if not stages_given and isinstance(pairs[0][1], Mapping):
                curriculum_stages = list(pairs[0][1])
        if (
            mixing_weights is not None
            and curriculum_stages is None
            and curriculum_stage is None
            and isinstance(mixing_weights, Mapping)
        ):
            curriculum_stages = list(mixing_weights)
        shards, groups, stages = self._select(split, curriculum_stage, curriculum_stages)
        if self.manifest_uri is not None:
            for shard in shards:
                check_shard_scheme(
                    self.manifest_uri, shard.uri, allow_mixed_schemes=self.allow_mixed_schemes
                )
        weights = schedule = None
        if pairs is not None:
            if curriculum_stages is None:
                raise ValueError("mixing_schedule needs curriculum_stages (the stages to mix)")
            if mixing_stop not in mixing.MIX_STOPS:
                raise ValueError(f"mixing_stop must be one of {', '.join(mixing.MIX_STOPS)}")
            schedule = schedules.resolved(
                pairs, lambda entry: self._mixing_weights(split, stages, entry)
            )
            weights = schedule[0][1]
        elif mixing_weights is not None:
            if curriculum_stages is None:
                raise ValueError("mixing_weights needs curriculum_stages (the stages to mix)")
            if mixing_stop not in mixing.MIX_STOPS:
                raise ValueError(f"mixing_stop must be one of {', '.join(mixing.MIX_STOPS)}")
            weights = tuple(self._mixing_weights(split, stages, mixing_weights))
        else:
            groups = [list(range(len(shards)))]
        rank, world_size = arguments.resolve_ranks(options.rank, options.world_size)
        seed = options.seed
        if seed is not None:
            seed = arguments.check_int(seed, "seed")
        shuffle_buffer = options.shuffle_buffer
        window = plan.DEFAULT_WINDOW if shuffle_buffer is None else shuffle_buffer
        window = arguments.check_int(window, "shuffle_buffer")
        if not 0 <= window <= MAX_WINDOW_BLOCKS:
            raise ValueError(
                f"shuffle_buffer must be in [0, {MAX_WINDOW_BLOCKS}] (blocks read together), "
                f"got {window}"
            )
        table, stream_shards, counts = stream_tables(shards, groups)
        index_root = _checked_index_root(options.index_root)
        indexed = self._has_indexes(shards, options.indexes, options.rank is None, index_root)
        shard_format = FORMATS[self.manifest.data_format]
        blockable = shard_format.record_index or shard_format.footer_blocks
        indexable = blockable and seed is not None
        read_plan = plan.ReadPlan(
            streams=counts,
            weights=weights,
            mix_stop=mixing_stop,
            seed=seed,
            window=window if seed is not None else 0,
            equal_batches=options.equal_batches,
            identity=table.identity(),
            blocks=_block_sizes(table, stream_shards) if indexable else None,
            indexed=indexed,
            schedule=schedule,
        )
        args = dict(self.dataloader_args)
        # A worker beyond a rank's records would only idle.
        workers = min(args.get("num_workers", 0), sum(table.records) // world_size)
        args["num_workers"] = workers
        if workers == 0:
            for name in _WORKER_ONLY_ARGS:
                args.pop(name, None)
            if args.get("timeout", 0) > 0:
                args.pop("timeout")
        planned = DatasetPlan(
            data_format=self.manifest.data_format,
            table=table,
            read_plan=read_plan,
            stream_shards=stream_shards,
            storage_config=self.storage_config,
            rank=rank,
            world_size=world_size,
            index_root=index_root,
        )
        return planned, args

    def _has_indexes(
        self,
        shards: Sequence[ManifestShard],
        forced: object,
        ranks_from_torch: bool,
        index_root: str | None,
    ) -> bool:
        """Whether the selection's shards have record offset indexes (msgpack.zstf shards
        written by this package's saver do): ``forced`` (the ``indexes`` option) when given,
        else whether the first shard's index exists, as rank 0 of an initialised
        torch.distributed group finds when the ranks come from it (every rank then orders the
        epoch alike). A shard without a usable index is still read, from its start."""
        if forced is not None and not isinstance(forced, bool):
            raise TypeError(f"indexes must be True, False or None, not {type(forced).__name__}")
        shard_format = FORMATS[self.manifest.data_format]
        if not (shard_format.record_index or shard_format.footer_blocks):
            if forced:
                raise ValueError(
                    f"indexes=True: {self.manifest.data_format} shards have no record offset "
                    "indexes"
                )
            return False
        if forced is not None:
            return forced
        config = self.storage_config
        first = shards[0]
        question: Callable[[], bool]
        if shard_format.footer_blocks:  # the shard's own footer tells
            question = functools.partial(has_page_index, first, config)
        else:
            question = functools.partial(has_index, first, config, index_root)
        if not ranks_from_torch:
            return question()
        return _rank_zero_answer(question)

    def load(
        self,
        split: str,
        curriculum_stage: str | None = None,
        infinite_iter: bool = False,
        *,
        curriculum_stages: Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        equal_batches: bool = False,
        seed: int | None = None,
        shuffle_buffer: int | None = None,
        stateful: bool = False,
        mixing_weights: Mapping[str, float] | str | None = None,
        mixing_schedule: Sequence[tuple[int, Mapping[str, float] | str]] | None = None,
        mixing_stop: str = "first_exhausted",
        columns: Sequence[str] | None = None,
        pad_value: int | float = 0,
        max_length: int | None = None,
        truncate: bool = False,
        log_stats_every: float | None = None,
        indexes: bool | None = None,
        index_root: str | None = None,
        filter: Callable[[Any], Any] | None = None,
        filter_name: str | None = None,
    ) -> Any:
        """A DataLoader over ``split`` (or one stage, or a union of stages kept in stage order
        without repeated shard URIs); with ``infinite_iter``, an endless iterator of batches.

        Work is split by records (SPEC section 6, v2): the selection is one sample space;
        each epoch has an order that depends only on (selection, seed, epoch); rank r of R
        takes a contiguous part of it and its workers split that part, part sizes differing by
        at most one record. Each consumer reads contiguous record ranges of shards.

        Options (defaults keep SPEC section 6 behaviour):
          rank, world_size: this process's part; default from an initialised
            torch.distributed, else (0, 1). Every record is read exactly once per epoch across
            ranks and workers.
          equal_batches: every rank yields the same number of batches; fewer than world_size
            records of the epoch are left out (the last ones of the epoch's order).
          seed: shuffle, deterministic in (seed, epoch), so that every batch mixes the whole
            selection: blocks of records (about 4 MiB of an indexed msgpack.zstf shard, else
            whole shards) are permuted, and the records of ``shuffle_buffer`` consecutive
            blocks (default 64; 0 or 1: one block at a time) are interleaved, each block's
            records staying in order and spread about evenly over the window (a seeded phase
            and jitter). A worker reads a window's blocks at once.
          mixing_weights: curriculum mixing instead of the union: a mapping stage -> weight
            (its keys are the stages when ``curriculum_stages`` is not given), or "metadata"
            for each stage's ``weight`` metadata. Each stage keeps its share of every stretch
            of the epoch's order; the order is then split across ranks and workers like any
            other. A weight is a positive finite int or float (not a bool) that a float
            holds; the weights' sum must be finite and each weight at least 2**-128 of it
            (ValueError naming the stage and the weight otherwise).
          mixing_schedule: mixing weights that change along the epoch, e.g.
            ``[(0, {"web": 3, "code": 1}), (800_000, {"web": 1, "code": 3})]``: each entry's
            weights (as ``mixing_weights``) hold from its position, in records of the epoch's
            mixed order counted across all ranks, until the next entry's; the rules, the
            checks and the resume of :meth:`load_tokens`'s ``mixing_schedule`` (the same plan
            code). Ranks and workers take an even share of each segment in turn, so they all
            cross a boundary together; with ``equal_batches``, each segment's share is equal
            on every rank (fewer than world_size records of each segment are left out).
          mixing_stop: "first_exhausted" (default): the epoch ends where the first stage runs
            out, so the proportions hold throughout; "all_exhausted": exhausted stages leave
            the mix and every record is read once per epoch.
          columns: batches of tensors instead of ``collate_fn``'s: a dict of the chosen
            columns, built in the worker (numbers -> (B,), lists of numbers -> (B, longest)
            padded with ``pad_value`` plus ``{column}_lengths``; strings stay lists), sent in
            bundles through a shared-memory batch ring; ``batch_size`` None means batches of
            one record. The loader's ``collate_fn`` must then be None.
          max_length, truncate: with ``columns``, a list row longer than ``max_length`` is
            cut to it when ``truncate``, else a ValueError naming the column; a padded batch
            holds at most 2**28 values (B x longest) either way, so one long record cannot
            multiply a batch's memory by the batch size.
          log_stats_every: every this many seconds, log the loader's ``stats().summary()``
            (logger ``syvain_training_data.loading.stats``, INFO); the DataLoader's
            ``stats()`` returns the counters at any time.
          indexes: whether the dataset has record offset indexes, which decides whether a
            seeded order cuts shards into blocks (True) or reads whole shards as blocks
            (False). Default None: whether the first shard's ``.index`` object exists (for
            Parquet, whether its footer has an offset index, which our writer adds),
            as rank 0 of an initialised torch.distributed group finds (when the ranks come
            from it), so every rank orders alike; an error other than "not found" is raised,
            never taken for "no". A state remembers the answer, and resuming with the other
            one is a ValueError saying so. What an index holds never changes the order; one
            that does not name its shard's version is not used (SPEC section 6).
          index_root: where the indexes are when not beside the shards: the prefix
            ``syvain-data index --to`` wrote them under (for shards in a bucket you cannot
            write); default None, beside each shard.
          stateful: kept for compatibility; every loader this returns has ``state_dict()`` /
            ``load_state_dict()`` (torchdata's protocol), resuming exactly on any number of
            ranks, workers and any batch size.
          filter, filter_name: keep only the records ``filter(record)`` is true for. The
            predicate runs where records are read (in the DataLoader workers, or the main
            process at 0 workers), before batching; it receives the record as the loader would
            pass it to ``collate_fn`` (the shard's dict), or with ``columns`` the dict of those
            columns only, as ``columns=`` reads them (a list-of-ints column as an int64 tensor,
            the others as Python values, a null leaving its key out). Spawned workers need it
            picklable (a module-level function or a ``functools.partial`` of one); one that
            is not (a lambda) needs a ``filter_name`` and runs only in the main process or in
            forked workers. Every record it keeps is
            yielded exactly once per epoch across ranks and workers, in the epoch's order;
            ``collate_fn`` (default: torch's ``default_collate``) runs in the workers on each
            ``batch_size`` kept records. The loader's state counts source records consumed,
            not records yielded: each batch carries its worker's position, and the state holds
            them (the state model of ``load_tokens``: call ``state_dict()`` on every rank of a
            torch.distributed group, or merge the ranks' states with
            :func:`~syvain_training_data.loading.tokens.merge_token_states`), so it resumes
            exactly on any number of ranks, workers and any batch size. The state names the
            filter (``filter_name``, 1 to 64 characters, or by default ``sha256:`` and a
            digest of the pickled predicate: for a plain function its module and name, for a
            ``functools.partial`` also its arguments; change ``filter_name`` when you change
            what a function keeps), and resuming with another filter, or with none, is a
            ValueError naming both. ``len()`` of a filtered loader is a TypeError (how many
            records pass is known only once the epoch is read), and ``equal_batches=True``
            with a filter is a ValueError: ranks keep different numbers of records, so equal
            batch counts would need them to talk while reading. A predicate that raises fails
            the pass with a RuntimeError naming the shard and the record.

        Raises:
            ValueError: unknown split ("Unknown split 'x'; available splits: a, b") or stage
                ("... available stages: ..."), both stage arguments, ``curriculum_stages`` a
                str, empty or with duplicates; bad rank/world_size; a shard on another store
                than the manifest without ``allow_mixed_schemes``.
            RuntimeError: with ``infinite_iter``, "{split} split produced no batches" when an
                epoch yields none.
            TypeError: ``filter`` not callable or not picklable, ``filter_name`` not a str of
                1 to 64 characters.
        """
        from syvain_training_data.loading.filters import record_filter

        boolean(stateful, "stateful")  # kept for compatibility: every loader is stateful
        boolean(truncate, "truncate")
        number(pad_value, "pad_value")
        keep = record_filter(filter, filter_name)
        if keep is not None and equal_batches:
            raise ValueError(
                "equal_batches=True and filter= do not go together: with a filter each rank "
                "keeps a different number of records, so equal batch counts are unknown until "
                "the epoch is read (drop equal_batches, or stop every rank at the fewest "
                "batches yourself)"
            )
        options = arguments.LoadOptions(
            split=split,
            curriculum_stage=curriculum_stage,
            curriculum_stages=curriculum_stages,
            rank=rank,
            world_size=world_size,
            equal_batches=equal_batches,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            mixing_weights=mixing_weights,
            mixing_schedule=mixing_schedule,
            mixing_stop=mixing_stop,
            infinite_iter=infinite_iter,
            log_stats_every=log_stats_every,
            indexes=indexes,
            index_root=index_root,
        )
        planned, args = self._plan(options)
        if columns is None and (max_length is not None or truncate):
            raise ValueError("max_length and truncate apply to load(columns=...) only")
        collate: TensorCollate | None = None
        if columns is not None:
            if self.collate_fn is not None:
                raise ValueError("Pass collate_fn=None to split_data_loader to load columns")
            collate = TensorCollate(columns, pad_value, max_length=max_length, truncate=truncate)
        if keep is not None:
            return _delivered(self._filtered(planned, args, keep, collate, options), options)
        if collate is not None:
            # The workers batch and bundle the records themselves (batch_size None: one each).
            batch_size, drop_last = arguments.batch_args(args)
            columns_dataset = ColumnDataset(
                planned, batch_size=batch_size, drop_last=drop_last, collate=collate
            )
            loader: RecordDataLoader = ColumnDataLoader(
                columns_dataset, log_stats_every=options.log_stats_every, **args
            )
        else:
            batch_size = args.get("batch_size", 1)
            drop_last = bool(args.get("drop_last", False)) and batch_size is not None
            dataset = ShardDataset(
                planned, batch_size=1 if batch_size is None else batch_size, drop_last=drop_last
            )
            loader = RecordDataLoader(
                dataset, collate_fn=self.collate_fn, log_stats_every=options.log_stats_every, **args
            )
        return _delivered(loader, options)

    def _filtered(
        self,
        planned: DatasetPlan,
        args: dict[str, Any],
        keep: Any,
        collate: TensorCollate | None,
        options: arguments.LoadOptions,
    ) -> Any:
        """The DataLoader of a filtered ``load``: its workers filter, batch and collate."""
        from syvain_training_data.loading.filters import FilteredDataLoader, FilteredDataset

        batched = args.get("batch_size", 1) is not None
        batch_size, drop_last = arguments.batch_args(args)
        dataset = FilteredDataset(
            planned,
            batch_size=batch_size,
            drop_last=drop_last and batched,
            keep=keep,
            collate=collate if collate is not None else self.collate_fn,
            columns=None if collate is None else collate.columns,
            batched=batched or collate is not None,
        )
        return FilteredDataLoader(dataset, log_stats_every=options.log_stats_every, **args)

    def load_tokens(
        self,
        split: str,
        curriculum_stage: str | None = None,
        infinite_iter: bool = False,
        *,
        seq_len: int,
        column: str | None = None,
        eos_id: int | None = None,
        curriculum_stages: Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int | None = None,
        shuffle_buffer: int | None = None,
        stateful: bool = False,
        mixing_weights: Mapping[str, float] | str | None = None,
        mixing_schedule: Sequence[tuple[int, Mapping[str, float] | str]] | None = None,
        mixing_stop: str = "first_exhausted",
        log_stats_every: float | None = None,
        documents: bool = False,
        loss_mask_column: str | None = None,
        pack: bool = True,
        pad_id: int | None = None,
        truncate: str = "right",
        indexes: bool | None = None,
        index_root: str | None = None,
        text_column: str | None = None,
        tokenizer: object = None,
        tokenizer_name: str | None = None,
        filter: Callable[[Any], Any] | None = None,
        filter_name: str | None = None,
    ) -> Any:
        """Packed token blocks: a DataLoader of int64 tensors of shape (batch_size, seq_len)
        (with ``infinite_iter``, an endless iterator of them). ``collate_fn`` is not used.

        Records are selected, ordered and split across ranks and workers as by :meth:`load`
        (same arguments). Each consumer concatenates its records' ``column`` (a list of int
        token ids; ``"tokens"`` when not given), or their ``text_column`` tokenized (below),
        with ``eos_id`` after each record when given, in epoch order, and cuts it into blocks
        of ``seq_len`` tokens; ``batch_size`` blocks (from ``dataloader_args``) make a batch,
        the last smaller one dropped with ``drop_last``. Within an epoch no token is yielded
        twice; fewer than ``seq_len`` tokens per consumer are left out.

        ``state_dict()`` holds each worker's position (records consumed, token offset in the
        next), never tokens, and resumes exactly like :meth:`load`'s on any number of ranks,
        workers and any batch size or ``seq_len``; a record cut by a block resumes at its token
        offset. Ranks that form a torch.distributed group gather their positions in
        ``state_dict()`` (call it on every rank); otherwise merge each rank's state with
        :func:`~syvain_training_data.loading.tokens.merge_token_states`. ``stats()`` and
        ``log_stats_every`` are :meth:`load`'s.

        ``mixing_schedule=[(0, {"web": 3, "code": 1}), (800_000, {"web": 1, "code": 3})]``:
        mixing weights that change along the epoch. Each entry's weights (a mapping or
        "metadata", as ``mixing_weights``; every entry names the same stages, and its keys are
        the stages when ``curriculum_stages`` is not given) hold from its position, in records
        of the epoch's mixed order counted across all ranks, until the next entry's; within
        each segment every stage keeps its share of every stretch, as with ``mixing_weights``
        (the one-entry case: same order). At most 64 entries, the first at 0, positions
        strictly ascending; not with ``mixing_weights``. Ranks and workers take an even share
        of each segment in turn, so they all cross a boundary together. A state resumes with
        a schedule edited after the positions its runs consumed (the rest of the epoch follows
        the new weights, laid out as the state's run was; records a new first_exhausted end
        adds beyond that layout's length wait for the next epoch); an edit at or before them
        is a ValueError naming the first difference. States of ``mixing_weights`` loaders
        resume a schedule whose first entry has the same weights.

        Tokenize on the fly: ``text_column="text", tokenizer=tok`` instead of ``column``. Each
        record's ``text_column`` (a str) is tokenized where it is read (in the DataLoader
        workers, or the main process at 0 workers), 256 records per tokenizer call, then packed
        as token ids read from a column would be (``eos_id``, ``documents``, ``pack=False``
        alike; not with ``loss_mask_column``). ``tok`` is a ``tokenizers.Tokenizer``, encoded
        with ``add_special_tokens=False`` (``eos_id`` separates documents), or a picklable
        callable ``list[str] -> list[list[int]]`` given a ``tokenizer_name``. The tokenizer must
        be deterministic: a state counts records and the token offset in the next record, never
        tokens, and resumes exactly on any topology. It names the tokenizer (the sha256 of a
        ``tokenizers.Tokenizer``'s ``to_str()``, or ``tokenizer_name``), so resuming with
        another one is a ValueError naming both.

        Filters: ``filter=pred`` packs only the records ``pred(record)`` is true for, as
        :meth:`load`'s ``filter`` (same checks, ``filter_name`` and refusal of a state made
        with another filter). The predicate receives the whole record as :meth:`load` yields
        it (the shard's dict, every column), in the workers, before tokenizing and packing; a
        filtered token loader therefore reads every column and makes a Python dict per record
        (without a filter only the token or text column is read, as Arrow arrays). A record it
        drops adds nothing to the stream, not even ``eos_id``. The state counts source
        records consumed and the token offset in the next kept one, so it resumes exactly on
        any topology; ``len()`` stays a TypeError, as for every ``load_tokens`` loader.

        Batches are dicts instead of tensors when any of these is given (every one keeps the
        columnar path, the batch ring and exact resume):

        - ``documents=True``: ``"positions"``, (batch, seq_len) int64, each token's index in
          its document (record): 0 at a document's first token, counting on where a document
          continues from the previous block; an ``eos_id`` belongs to the document it ends.
          :func:`~syvain_training_data.loading.documents.cu_seqlens` turns it into
          flash-attention's variable-length arguments.
        - ``loss_mask_column="mask"``: ``"loss_mask"``, (batch, seq_len) bool, packed from each
          record's ``mask`` (a list of 0/1 ints as long as its tokens); an appended ``eos_id``
          has mask 1.
        - ``pack=False``: one record per row instead of packed blocks, truncated to ``seq_len``
          (``truncate="right"``) or refused (``truncate="error"``, ValueError naming the shard
          and record) and right-padded with ``pad_id`` (required); ``"lengths"``, (batch,)
          int64, holds each row's tokens before padding. Padding has mask 0 and positions that
          count on (one sequence per row). States of ``pack=False`` loaders resume only
          ``pack=False`` loaders.

        Raises:
            ValueError: the errors of :meth:`load`; ``seq_len`` not a positive int; ``pad_id``
                missing with ``pack=False`` or given without it; an unknown ``truncate``; a
                record without ``column`` or whose ``column`` is not a list of ints, or whose
                loss mask is not a list of 0/1 of its tokens' length (when read, naming the
                shard and record); ``tokenizer`` without ``text_column`` or the reverse,
                ``text_column`` with ``column`` or ``loss_mask_column``, a callable without
                ``tokenizer_name``; a record whose text is missing or not a str, a tokenizer
                answer that is not one list of ints per text, a token id beyond int64 (when
                read, naming the shard and record).
            TypeError: ``tokenizer`` neither a ``tokenizers.Tokenizer`` nor callable,
                ``text_column`` or ``tokenizer_name`` not a str; ``filter`` not callable or not
                picklable, ``filter_name`` not a str of 1 to 64 characters.
        """
        boolean(stateful, "stateful")  # kept for compatibility: every loader is stateful
        boolean(documents, "documents")
        boolean(pack, "pack")
        from syvain_training_data.loading.filters import record_filter
        from syvain_training_data.loading.text_tokens import text_tokenizer
        from syvain_training_data.loading.tokens import TokenDataLoader, TokenDataset

        text = text_tokenizer(text_column, tokenizer, tokenizer_name, column)
        keep = record_filter(filter, filter_name)
        column = "tokens" if column is None else column
        if text is not None and loss_mask_column is not None:
            raise ValueError(
                "loss_mask_column is for token columns: a mask per token cannot be aligned with "
                "tokens made from text_column"
            )
        seq_len = arguments.check_int(seq_len, "seq_len")
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        if eos_id is not None:
            eos_id = arguments.check_int(eos_id, "eos_id")
        rows = arguments.row_options(pack, pad_id, truncate)
        if loss_mask_column is not None and (
            not isinstance(loss_mask_column, str) or loss_mask_column == column
        ):
            raise ValueError(
                f"loss_mask_column must be a column name other than the token column {column!r}, "
                f"got {loss_mask_column!r}"
            )
        options = arguments.LoadOptions(
            split=split,
            curriculum_stage=curriculum_stage,
            curriculum_stages=curriculum_stages,
            rank=rank,
            world_size=world_size,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            mixing_weights=mixing_weights,
            mixing_schedule=mixing_schedule,
            mixing_stop=mixing_stop,
            infinite_iter=infinite_iter,
            log_stats_every=log_stats_every,
            indexes=indexes,
            index_root=index_root,
        )
        planned, args = self._plan(options)
        batch_size, drop_last = arguments.batch_args(args)
        dataset = TokenDataset(
            planned,
            batch_size=batch_size,
            drop_last=drop_last,
            column=column,
            seq_len=seq_len,
            eos_id=eos_id,
            documents=documents,
            mask_column=loss_mask_column,
            rows=rows,
            text=text,
            keep=keep,
        )
        loader = TokenDataLoader(dataset, log_stats_every=options.log_stats_every, **args)
        return _delivered(loader, options)


def _delivered(loader: DataLoader[Any], options: arguments.LoadOptions) -> Any:
    """What ``load`` and ``load_tokens`` return: ``loader``, or with ``infinite_iter`` an
    endless iterator of its batches."""
    if options.infinite_iter:
        return endless(loader, options.split)
    return loader

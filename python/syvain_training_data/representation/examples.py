"""`iter_representation_examples`: verified OLMo 3 distillation examples (SPEC section 7).

The loader checks the arguments at once, then, on the first ``next()``:

1. reads the data manifest (pinned by the caller's SHA-256), the three index shards and the
   artifact manifest, and checks them against each other (:mod:`.publication`);
2. downloads the prepared metadata of every task of the requested sources in the split and
   selects, per source, the first ``per_source_count`` blocks by block_id (:mod:`.blocks`);
3. for each task holding a selected block, downloads its prepared tensors and its
   representation pair once, checks them, and copies out the selected rows.

Downloads run in one background thread, a few objects ahead of the checks (the bytes still
arrive one object at a time, as in a plain download); the checks of one object overlap the
download of the next.

Every object is downloaded under custody (:mod:`.custody`) into a private temporary directory
that is removed before the first example is yielded, and in every other case (an error, or the
generator closed or dropped before it started). Nothing is yielded until every check of every
selected block has passed: an integrity error never arrives after examples have gone into a
model. The selected examples (about 33 KB each) are held in memory until they are yielded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypedDict, Unpack

import torch

from syvain_training_data.object_check import is_sha256_hex
from syvain_training_data.representation.blocks import (
    PreparedBlocks,
    SelectedBlock,
    read_prepared_metadata,
    select_blocks,
)
from syvain_training_data.representation.custody import Prefetcher, Workspace
from syvain_training_data.representation.layout import (
    SOURCES,
    SPLITS,
    publication_prefix,
)
from syvain_training_data.representation.publication import Pair, load_publication
from syvain_training_data.representation.relations import read_relation_rows
from syvain_training_data.representation.tensor_files import read_input_ids, read_projections
from syvain_training_data.storage import StorageConfig

__all__ = [
    "STATE_KINDS",
    "TEACHER_LAYERS",
    "RepresentationExample",
    "iter_representation_examples",
]

TEACHER_LAYERS: Final = (0, 3, 7, 11, 15, 19, 23, 27, 31)
STATE_KINDS: Final = ("residual_pre", "post_attention", "post_mlp")


@dataclass(frozen=True, eq=False)
class RepresentationExample:
    """One prepared block joined to its teacher projections.

    Fields: ``block_id`` (lowercase hex SHA-256), ``source``, ``split``, ``input_ids`` (int64,
    shape (2048,)), ``relation_positions`` (int64, (32,): projection_offset + 64 i, ascending),
    ``teacher_final_state_projections`` (float16, (32, 256): the teacher's projected state at
    each relation position, in that order). Each tensor owns its memory (no view of a file or of
    a larger buffer). Examples compare by identity (tensors have no single truth value).
    """

    block_id: str
    source: str
    split: str
    input_ids: torch.Tensor
    relation_positions: torch.Tensor
    teacher_final_state_projections: torch.Tensor

    def __repr__(self) -> str:
        return (
            f"RepresentationExample(block_id={self.block_id!r}, source={self.source!r}, "
            f"split={self.split!r}, input_ids=<int64 {list(self.input_ids.shape)}>, "
            f"relation_positions={self.relation_positions.tolist()}, "
            f"teacher_final_state_projections=<float16 "
            f"{list(self.teacher_final_state_projections.shape)}>)"
        )


@dataclass(frozen=True)
class _Request:
    manifest_uri: str
    manifest_sha256: str
    split: str
    sources: tuple[str, ...]
    per_source_count: int
    teacher_layer: int
    state_kind: str


def _check_str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _check_choice(value: object, name: str, choices: Sequence[object]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def _check_request(
    manifest_uri: object,
    manifest_sha256: object,
    split: object,
    sources: object,
    per_source_count: object,
    teacher_layer: object,
    state_kind: object,
) -> _Request:
    publication_prefix(_check_str(manifest_uri, "manifest_uri"))
    digest = _check_str(manifest_sha256, "manifest_sha256")
    if not is_sha256_hex(digest):
        raise ValueError(
            f"manifest_sha256 must be 64 lowercase hex digits, got {manifest_sha256!r}"
        )
    _check_choice(_check_str(split, "split"), "split", SPLITS)
    if isinstance(sources, str | bytes) or not isinstance(sources, list | tuple):
        raise TypeError(
            f"sources must be a list or tuple of source names, not {type(sources).__name__}"
        )
    for source in sources:
        _check_choice(_check_str(source, "each source"), "each source", SOURCES)
    if not sources:
        raise ValueError("sources must name at least one source")
    repeated = sorted({source for source in sources if sources.count(source) > 1})
    if repeated:
        raise ValueError(f"sources must be unique; repeated: {', '.join(repeated)}")
    if isinstance(per_source_count, bool) or not isinstance(per_source_count, int):
        raise TypeError(f"per_source_count must be an int, not {type(per_source_count).__name__}")
    if per_source_count <= 0:
        raise ValueError(f"per_source_count must be positive, got {per_source_count}")
    if isinstance(teacher_layer, bool) or not isinstance(teacher_layer, int):
        raise TypeError(f"teacher_layer must be an int, not {type(teacher_layer).__name__}")
    _check_choice(teacher_layer, "teacher_layer", TEACHER_LAYERS)
    _check_choice(_check_str(state_kind, "state_kind"), "state_kind", STATE_KINDS)
    return _Request(
        manifest_uri=str(manifest_uri),
        manifest_sha256=digest,
        split=str(split),
        sources=tuple(str(source) for source in sources),
        per_source_count=int(per_source_count),
        teacher_layer=int(teacher_layer),
        state_kind=str(state_kind),
    )


class ExampleSelection(TypedDict):
    """The keyword arguments that pick the examples, here and on the client's method."""

    split: str
    sources: Sequence[str]
    per_source_count: int
    teacher_layer: int
    state_kind: str


def iter_representation_examples(
    manifest_uri: str,
    manifest_sha256: str,
    *,
    storage_config: StorageConfig | None = None,
    **selection: Unpack[ExampleSelection],
) -> Iterator[RepresentationExample]:
    """Yields ``per_source_count`` verified examples per source: sources in the given order,
    block_id ascending within each (SPEC section 7).

    The arguments are checked now; the publication is read and verified on the first
    ``next()``, and nothing is yielded until every check has passed.

    Raises:
        TypeError: an argument of the wrong type (``sources`` must be a list or tuple of str;
            ``per_source_count`` and ``teacher_layer`` an int, not a bool).
        ValueError: ``manifest_uri`` not the canonical publication URI, ``manifest_sha256``
            not 64 lowercase hex digits, an unknown split, source, layer or state kind, empty or
            repeated sources, ``per_source_count`` < 1; on iteration, "Source 'x' has N 'split'
            examples; requested K".
        FileNotFoundError: no manifest at ``manifest_uri`` (on iteration).
        RepresentationIntegrityError: any custody or schema check fails (on iteration).
        PermissionError, StorageRetryExhaustedError, OSError: from the store or the local disk.
    """
    request = _check_request(manifest_uri, manifest_sha256, **selection)
    return _examples(request, storage_config or StorageConfig())


def _examples(request: _Request, storage_config: StorageConfig) -> Iterator[RepresentationExample]:
    examples = deque(_load(request, storage_config))
    while examples:
        yield examples.popleft()


def _load(request: _Request, storage_config: StorageConfig) -> list[RepresentationExample]:
    with (
        Workspace() as workspace,
        Prefetcher(workspace, storage_config) as downloads,
    ):
        publication = load_publication(
            request.manifest_uri,
            request.manifest_sha256,
            workspace,
            storage_config=storage_config,
        )
        split = request.split
        pairs = [pair for source in request.sources for pair in publication.prepared(split, source)]
        downloads.plan((pair.metadata, "prepared metadata") for pair in pairs)
        prepared: dict[str, list[PreparedBlocks]] = {source: [] for source in request.sources}
        for pair in pairs:
            path = downloads.take(pair.metadata)
            prepared[pair.source].append(read_prepared_metadata(path, pair))
            path.unlink()
        selection = select_blocks(
            request.split, request.sources, request.per_source_count, prepared
        )
        by_task: dict[str, list[SelectedBlock]] = {}
        for source in request.sources:
            for block in selection[source]:
                by_task.setdefault(block.blocks.pair.task, []).append(block)
        tasks = [
            (blocks, publication.representations(request.split, task))
            for task, blocks in by_task.items()
        ]
        downloads.plan(
            claim
            for blocks, representation in tasks
            for claim in (
                (blocks[0].blocks.pair.tensor, "prepared tensor file"),
                (representation.metadata, "representation metadata"),
                (representation.tensor, "representation tensor file"),
            )
        )
        examples: dict[str, RepresentationExample] = {}
        for blocks, representation in tasks:
            examples.update(_load_task(request, blocks, representation, downloads))
    return [examples[block.block_id] for source in request.sources for block in selection[source]]


def _load_task(
    request: _Request,
    selected: list[SelectedBlock],
    representation: Pair,
    downloads: Prefetcher,
) -> dict[str, RepresentationExample]:
    """The examples of the selected blocks of one task (each artifact downloaded once)."""
    prepared = selected[0].blocks
    path = downloads.take(prepared.pair.tensor)
    input_ids = read_input_ids(path, prepared, [block.row for block in selected])
    path.unlink()
    path = downloads.take(representation.metadata)
    relations = read_relation_rows(
        path,
        representation,
        selected,
        request.teacher_layer,
        request.state_kind,
        representation.tensor_records,
    )
    path.unlink()
    path = downloads.take(representation.tensor)
    projections = read_projections(path, representation, relations)
    path.unlink()
    return {
        block.block_id: RepresentationExample(
            block_id=block.block_id,
            source=block.source,
            split=request.split,
            input_ids=input_ids[block.row],
            relation_positions=torch.tensor(relations[block.block_id].positions, dtype=torch.int64),
            teacher_final_state_projections=projections[block.block_id],
        )
        for block in selected
    }

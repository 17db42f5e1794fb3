"""Sequence packing: ``SplitDataLoader.load_tokens``.

Each consumer (rank, worker) reads its part of the epoch order (the record plan of
:mod:`~syvain_training_data.loading.plan`), concatenates its records' token lists, with
``eos_id`` after each when given, and cuts the result into blocks of ``seq_len`` tokens; a batch
is ``batch_size`` blocks, an int64 tensor of shape (batch, seq_len). Fewer than ``seq_len``
tokens per consumer are left out of an epoch.

Blocks cut records, so what a consumer consumed does not follow from batch counts: every batch
travels with its worker's position after it (records of the part wholly consumed, tokens of
the next), the loader keeps the position of the last batch the training loop received from
each worker, and ``state_dict`` holds those positions (never tokens): the state model of
:mod:`~syvain_training_data.loading.positions`, which filtered record loaders share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from syvain_training_data.errors import ShardDataError
from syvain_training_data.loading import plan, token_plan
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading import state as checks
from syvain_training_data.loading.bundles import BUNDLE_BATCHES, BUNDLE_BYTES, Bundle
from syvain_training_data.loading.dataloader import STATE_VERSION
from syvain_training_data.loading.filters import (
    RecordFilter,
    Tagged,
    check_filter_names,
    tagged_records,
)
from syvain_training_data.loading.list_columns import int_lists
from syvain_training_data.loading.packing import (
    BlockPacking,
    Cut,
    Records,
    RowOptions,
    RowPacker,
    TokenChannels,
    TokenPacker,
    loss_mask,
)
from syvain_training_data.loading.positions import (
    PositionDataset,
    PositionLoader,
    check_read,
    sent,
)
from syvain_training_data.loading.reader import ShardRange, consumer_records
from syvain_training_data.loading.shard_indexes import ShardIndexes
from syvain_training_data.loading.stats import PUBLISH_MASK
from syvain_training_data.loading.text_tokens import (
    TOKENIZE_RECORDS,
    TextTokenizer,
    text_problem,
    tokenizer_refusal,
)
from syvain_training_data.loading.token_state import merge_token_states
from syvain_training_data.loading.transfer import BatchRing
from syvain_training_data.shard import iter_shard

__all__ = ["TokenDataLoader", "TokenDataset", "merge_token_states"]

STATE_KIND = "tokens"
# (batch, worker, records wholly consumed, tokens of the next record consumed)
_Tagged = tuple[torch.Tensor, int, int, int]


class TokenDataset(PositionDataset):
    """A :class:`PositionDataset` whose consumers yield packed token batches, each tagged with
    the worker and its position after it (the loader strips the tags)."""

    state_kind = STATE_KIND
    state_fields = "selection, seed, shuffle, mixing, token column or eos_id"

    def __init__(
        self,
        *args: Any,
        column: str,
        seq_len: int,
        eos_id: int | None,
        documents: bool = False,
        mask_column: str | None = None,
        rows: RowOptions | None = None,
        text: TextTokenizer | None = None,
        keep: RecordFilter | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.column = column
        # Packs only the records it keeps (load_tokens(filter=)), read whole.
        self.keep = keep
        # Tokenizes a text column instead of reading ``column`` (load_tokens(text_column=)).
        self.text = text
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.mask_column = mask_column
        self.rows = rows
        self.channels = TokenChannels(documents, mask_column is not None, rows is not None)

    def fingerprint(
        self, read_plan: plan.ReadPlan | None = None, earlier_release: bool = False
    ) -> str:
        """The selection's digest plus what decides the token stream (``seq_len`` and the batch
        size may change between runs); of ``read_plan`` instead of this dataset's when given
        (the plan's ``earlier_release`` digest: see :meth:`ReadPlan.fingerprint`)."""
        selection = (read_plan or self.read_plan).fingerprint(earlier_release)
        source = self.column if self.text is None else f"text:{self.text.column}:{self.text.name}"
        text = f"{selection}:{STATE_KIND}:{source}:{self.eos_id}"
        if self.keep is not None:
            text += f":filter:{self.keep.name}"
        if self.rows is not None:  # a row per record: no state of packed blocks applies
            text += f":rows:{self.rows.truncate}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def names(self) -> dict[str, str]:
        names = {} if self.text is None else {"tokenizer": self.text.name}
        if self.keep is not None:
            names["filter"] = self.keep.name
        return names

    def check_names(self, state: dict[str, Any]) -> None:
        """ValueError naming both when ``state`` was made with another tokenizer than this
        loader's, or with one where this loader reads a token column (or the reverse)."""
        theirs = state.get("tokenizer")
        if theirs is not None:
            theirs = checks.string(theirs, "tokenizer")
        text = self.text
        if theirs != (None if text is None else text.name):
            raise ValueError(tokenizer_refusal(theirs, text))
        check_filter_names(state, self.keep)

    def __iter__(self) -> Iterator[Bundle]:
        bundles, in_worker = self.pass_bundles(self.bundle)
        return sent(bundles, self.ring) if in_worker else bundles

    def _batches(
        self,
        epoch: int,
        interrupts: Sequence[token_plan.TokenInterrupt],
        worker: int,
        workers: int,
    ) -> Iterator[_Tagged]:
        topology = self.topology(workers)
        segments = self.token_segments if interrupts else None
        layout, cuts = schedules.scheduled_token_layout(
            self.read_plan, epoch, interrupts, segments, topology, self.rank
        )
        part = layout[self.rank][worker]
        counters = self.counters.consumer(worker)
        orders, mixed = self.read_plan.orders(epoch), self.read_plan.mixed(epoch)
        # In plain order (no seed, no mixing) a decoded batch's records are the next
        # records of the part: they reach the packer as one run, with no Python per record.
        in_runs = mixed is None and self.read_plan.seed is None
        open_range = self._open if in_runs else self._open_records
        indexes = self.new_indexes()
        runs: Iterator[Records | int]
        if self.keep is not None:  # whole records, filtered, then packed in runs
            records = consumer_records(
                orders,
                self.stream_shards,
                mixed,
                part,
                lambda r: counters.watch(tagged_records(self, r, indexes)),
                prefetch=self.prefetches,
            )
            runs = self._kept_runs(records, self.keep)
        else:
            runs = consumer_records(
                orders,
                self.stream_shards,
                mixed,
                part,
                lambda r: counters.watch(open_range(r, indexes)),
                prefetch=self.prefetches,
            )
        cut_at = token_plan.cuts_by_index(part, cuts)
        packer: RowPacker | BlockPacking
        if self.rows is not None:
            if cut_at:  # a row-per-record state never cuts a record
                raise ValueError("This loader state cuts a record, which pack=False never does")
            packer = RowPacker(
                self.seq_len,
                self.batch_size,
                self.rows.pad_id,
                self.eos_id,
                self.ring,
                self.channels,
            )
        else:
            blocks = TokenPacker(self.seq_len, self.batch_size, self.ring, self.channels)
            packer = BlockPacking(blocks, self.eos_id, Cut(cut_at, epoch, part))
        return self._packed(runs, packer, epoch, part, worker, counters)

    def _packed(
        self,
        runs: Iterator[Records | int],
        packer: RowPacker | BlockPacking,
        epoch: int,
        part: Sequence[tuple[int, int]],
        worker: int,
        counters: Any,
    ) -> Iterator[_Tagged]:
        index = 0
        try:
            for records in runs:
                if isinstance(records, int):  # records the filter dropped: consumed, not packed
                    count = records
                    if (index ^ (index + count)) & ~PUBLISH_MASK:
                        counters.yielded(index + count)
                    index += count
                    continue
                count = len(records.bounds) - 1
                for batch, whole, offset in packer.pack(index, records):
                    yield batch, worker, whole, offset
                if (index ^ (index + count)) & ~PUBLISH_MASK:
                    counters.yielded(index + count)
                index += count
            check_read(index, part, epoch)
            for batch, whole, offset in packer.finish(self.drop_last):
                yield batch, worker, whole, offset
        finally:
            counters.yielded(index)  # records read (a cut one counts once)

    def _kept_runs(self, records: Iterator[Tagged], keep: RecordFilter) -> Iterator[Records | int]:
        """The consumer's records as runs of consecutive records ``keep`` keeps (at most
        ``TOKENIZE_RECORDS`` each), between counts of consecutive records it drops."""
        uris = self.table.uris
        group: list[Tagged] = []
        dropped = 0
        for shard, number, record in records:
            if keep.keeps(record, uris[shard], number):
                if dropped:
                    yield dropped
                    dropped = 0
                group.append((shard, number, record))
                if len(group) == TOKENIZE_RECORDS:
                    yield self._run(group)
                    group = []
            else:
                if group:
                    yield self._run(group)
                    group = []
                dropped += 1
        if group:
            yield self._run(group)
        if dropped:
            yield dropped

    def _run(self, group: list[Tagged]) -> Records:
        """Consecutive kept records (Python dicts) as one run: their token column, or their
        text tokenized, and their loss mask; errors name each record's shard and number."""
        where = [(self.table.uris[shard], number) for shard, number, _ in group]
        if self.text is not None:
            texts = []
            for (uri, number), (_, _, record) in zip(where, group, strict=True):
                problem = text_problem([record], self.text.column, uri, number)
                if problem is not None:
                    raise problem
                texts.append(record[self.text.column])
            offsets, values = self.text.tokens_of(texts, where)
            mask = None
        else:
            lists = [
                token_list(record, self.column, uri, number, "token column")
                for (uri, number), (_, _, record) in zip(where, group, strict=True)
            ]
            offsets, values = flat_lists(lists, where)
            mask = None
            if self.mask_column is not None:
                masks = [
                    token_list(record, self.mask_column, uri, number, "loss mask column")
                    for (uri, number), (_, _, record) in zip(where, group, strict=True)
                ]
                for k, (ids, flags) in enumerate(zip(lists, masks, strict=True)):
                    uri, number = where[k]
                    if len(flags) != len(ids) or not set(flags) <= {0, 1}:
                        raise ValueError(
                            f"Record {number} of shard {uri} has a loss mask in "
                            f"{self.mask_column!r} that is not {len(ids)} values of 0 or 1 (one "
                            "per token)"
                        )
                mask = flat_lists(masks, where)[1].to(torch.bool)
        if self.rows is not None and self.rows.truncate == "error":
            for k, (uri, number) in enumerate(where):
                self._check_fits(offsets[k : k + 2], uri, number)
        return Records(values, offsets.tolist(), mask)

    def _open(self, shard_range: ShardRange, indexes: ShardIndexes | None) -> Iterator[Records]:
        """A shard range's decoded batches, each as one run (or, tokenizing, a run per
        tokenizer call): the token column's int64 values, the offsets of its records in them
        and their loss mask, sliced from the columnar batches with no Python object per
        token."""
        table_index, start, stop = shard_range
        shard = self.table.shard(table_index)
        if self.text is not None:
            columns = [self.text.column]
        elif self.mask_column is None:
            columns = [self.column]
        else:
            columns = [self.column, self.mask_column]
        batches = self.column_batches(shard, start, stop, indexes, columns)
        record = start
        try:
            for batch in batches:
                for offsets, values, mask in self._token_lists(batch, shard.uri, record):
                    if self.rows is not None and self.rows.truncate == "error":
                        self._check_fits(offsets, shard.uri, record)
                    bounds = offsets.tolist()
                    record += len(bounds) - 1
                    if len(bounds) > 1:
                        yield Records(values, bounds, mask)
        except ShardDataError as error:
            if self.text is None:
                raise
            # The columnar decoder refuses a text column that mixes str with other values
            # without naming the record: the records themselves do.
            records = iter_shard(
                self.data_format, shard, storage_config=self.storage_config, start=record, stop=stop
            )
            problem = text_problem(records, self.text.column, shard.uri, record)
            if problem is None:
                raise
            raise problem from error

    def _token_lists(
        self, batch: Any, uri: str, first: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """(offsets, int64 values, loss mask or None) of a decoded batch's records, whose
        first is record ``first`` of shard ``uri``: the token column's, or the text column's
        tokens, a tokenizer call at a time."""
        if self.text is not None:
            for offsets, values in self.text.token_lists(batch, uri, first):
                yield offsets, values, None
            return
        offsets, values = self._int_lists(batch, uri)
        mask = None
        if self.mask_column is not None:
            mask = loss_mask(batch, self.mask_column, offsets, len(values), uri, first)
        yield offsets, values, mask

    def _open_records(
        self, shard_range: ShardRange, indexes: ShardIndexes | None
    ) -> Iterator[Records]:
        """A shard range's records one by one, each a run of one (the seeded interleaving and
        mixing reorder records)."""
        for values, bounds, mask in self._open(shard_range, indexes):
            for i in range(len(bounds) - 1):
                yield Records(values, bounds[i : i + 2], mask)

    def _check_fits(self, offsets: torch.Tensor, uri: str, first: int) -> None:
        """With ``truncate="error"``: ValueError naming the first record longer than a row."""
        sizes = offsets[1:] - offsets[:-1] + (self.eos_id is not None)
        over = (sizes > self.seq_len).nonzero()
        if len(over):
            k = int(over[0])
            raise ValueError(
                f"Record {first + k} of shard {uri} holds {int(sizes[k])} tokens"
                f"{' with its eos_id' if self.eos_id is not None else ''}, more than seq_len "
                f'{self.seq_len} (pack=False with truncate="error")'
            )

    def _int_lists(self, batch: Any, uri: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets, int64 values) of the token column of a native or pyarrow batch."""
        try:
            return int_lists(batch, self.column)
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(
                f"The token column {self.column!r} of shard {uri} is not a list of int token "
                f"ids in every record ({error})"
            ) from None


def token_list(record: Any, column: str, uri: str, number: int, what: str) -> list[int]:
    """``record[column]``, a list of ints, else a ValueError naming the shard and record."""
    values = record.get(column) if isinstance(record, dict) else None
    if isinstance(values, list | tuple) and all(
        type(value) is int or (isinstance(value, int) and not isinstance(value, bool))
        for value in values
    ):
        return list(values)
    return _not_ints(values, column, uri, number, what)


def _not_ints(values: object, column: str, uri: str, number: int, what: str) -> list[int]:
    raise ValueError(
        f"Record {number} of shard {uri} holds {type(values).__name__} in its {what} "
        f"{column!r}, not a list of ints"
    )


def flat_lists(
    lists: list[list[int]], where: Sequence[tuple[str, int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, int64 values) of int lists, the records ``where`` names (shard URI, record
    number): a value beyond int64 is a ValueError naming its record."""
    lengths = [len(values) for values in lists]
    offsets = torch.zeros(len(lists) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    flat = [value for values in lists for value in values]
    try:
        return offsets, torch.tensor(flat, dtype=torch.int64)
    except (OverflowError, RuntimeError, ValueError):  # torch's words for it vary
        for values, (uri, number) in zip(lists, where, strict=True):
            if any(not -(2**63) <= value < 2**63 for value in values):
                raise ValueError(
                    f"Record {number} of shard {uri} holds a value that does not fit int64"
                ) from None
        raise


class TokenDataLoader(PositionLoader):
    """The DataLoader ``load_tokens`` returns: int64 tensors of shape (batch, seq_len). Each
    pass is the next epoch; ``state_dict`` / ``load_state_dict`` resume exactly on any number of
    ranks, workers and any batch size (see :func:`merge_token_states` for ranks that are not one
    torch.distributed group)."""

    dataset: TokenDataset

    def _new_ring(self) -> None:
        # A slot holds a batch's largest tensor (its tokens); the others take a slot each.
        tensor_bytes = self.dataset.batch_size * self.dataset.seq_len * torch.int64.itemsize
        tensors = self.dataset.channels.tensors
        batch_bytes = tensor_bytes * tensors
        self.dataset.bundle = max(1, min(BUNDLE_BATCHES, BUNDLE_BYTES // batch_bytes))
        in_flight = self._batches_in_flight(self.dataset.bundle) * tensors
        self.dataset.ring = BatchRing.for_batches(self.num_workers, in_flight, tensor_bytes)

    def _check_kind(self, state: object) -> None:
        if (
            not isinstance(state, dict)
            or state.get("version") != STATE_VERSION
            or state.get("kind") != STATE_KIND
        ):
            raise ValueError("Not a token loader state (state_dict of a load_tokens loader)")

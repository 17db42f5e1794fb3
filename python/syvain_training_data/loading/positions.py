"""Loaders whose batches carry their worker's position: ``load_tokens`` and filtered ``load``.

When what a worker yields does not tell how far it read (token blocks cut records; a filter
drops some), every batch travels with its worker and the worker's position after it: (source
records of its part wholly consumed, tokens of the next consumed; always 0 for records). The
loader keeps the position of the last batch the training loop received from each worker, and
``state_dict`` holds those positions (never records or tokens): a state counts source records
consumed, so it resumes exactly on any number of ranks and workers and any batch size
(:func:`~syvain_training_data.loading.token_plan.token_layout` turns it back into what is left).

:class:`PositionDataset` and :class:`PositionLoader` are what the two share; the token loader
(:mod:`~syvain_training_data.loading.tokens`) and the filtered record loader
(:mod:`~syvain_training_data.loading.filters`) add how a consumer makes its batches and what
names the state (tokenizer, filter).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from torch.utils.data import get_worker_info

from syvain_training_data.loading import plan, token_plan, token_state
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading import state as checks
from syvain_training_data.loading.bundles import Bundle, as_is, bundled, in_turn
from syvain_training_data.loading.dataloader import STATE_VERSION, EpochLoader
from syvain_training_data.loading.dataset import ShardDataset
from syvain_training_data.loading.transfer import BatchRing, for_transfer

__all__ = ["PositionDataset", "PositionLoader", "check_read", "sent"]


class PositionDataset(ShardDataset):
    """A :class:`ShardDataset` whose consumers yield bundles of batches, each tagged with the
    worker and its position after it (the loader strips the tags). The loader sets
    ``token_interrupts`` (and ``token_segments``, with a mixing schedule) before a pass."""

    # The state's ``kind`` and what its refusal of another selection lists.
    state_kind: ClassVar[str] = ""
    state_fields: ClassVar[str] = "selection, seed, shuffle or mixing"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.token_interrupts: tuple[token_plan.TokenInterrupt, ...] = ()
        # Set by the loader before it forks workers: how their batches reach it, and how many
        # travel as one DataLoader item.
        self.ring: BatchRing | None = None
        self.bundle = 1

    # The segments a resumed epoch of a mixing schedule is laid out with (its state's; None:
    # the epoch's own), set by the loader with ``token_interrupts``.
    token_segments: tuple[int, ...] | None = None

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("This dataset resumes through its loader's state_dict()")

    def load_state_dict(self, state: Any) -> None:
        raise TypeError("This dataset resumes through its loader's load_state_dict()")

    def fingerprint(
        self, read_plan: plan.ReadPlan | None = None, earlier_release: bool = False
    ) -> str:
        """The digest a state names its selection and stream by (of ``read_plan`` instead of
        this dataset's when given)."""
        raise NotImplementedError

    def names(self) -> dict[str, str]:
        """What a state names beside its selection (the tokenizer, the filter), by field."""
        return {}

    def check_names(self, state: dict[str, Any]) -> None:
        """ValueError naming both when ``state`` was made with another tokenizer or filter."""

    def _batches(
        self, epoch: int, interrupts: Sequence[Any], worker: int, workers: int
    ) -> Iterator[tuple[Any, int, int, int]]:
        """This consumer's batches of a pass, each with its position after it."""
        raise NotImplementedError

    def pass_bundles(self, bundle: int) -> tuple[Iterator[Bundle], bool]:
        """This pass's batches in bundles of ``bundle`` (one in the main process), and whether
        it runs in a DataLoader worker. A persistent worker's copy advances one epoch per
        pass, like the loader."""
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch, interrupts = self.epoch, self.token_interrupts
        self.epoch, self.token_interrupts = epoch + 1, ()
        batches = self._batches(epoch, interrupts, worker, workers)
        return bundled(batches, worker, 1 if info is None else bundle), info is not None


class PositionLoader(EpochLoader[token_plan.TokenInterrupt]):
    """A DataLoader over a :class:`PositionDataset`. Each pass is the next epoch;
    ``state_dict`` / ``load_state_dict`` resume exactly on any number of ranks, workers and any
    batch size (see :func:`~syvain_training_data.loading.token_state.merge_token_states` for
    ranks that are not one torch.distributed group)."""

    dataset: PositionDataset

    def __init__(
        self, dataset: PositionDataset, *, log_stats_every: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(
            dataset,
            log_stats_every=log_stats_every,
            batch_size=None,
            collate_fn=as_is,
            **kwargs,
        )
        # With a mixing schedule: the segments of the resumed epoch (a loaded state's).
        self._segments: tuple[int, ...] | None = None

    def _new_ring(self) -> None:
        """Before new workers start: the dataset's batch ring (and bundle size) for them."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        started = time.perf_counter()
        epoch, interrupts = self._begin_pass()
        self.dataset.token_interrupts = interrupts
        segments = self._segments if interrupts else None
        self.dataset.token_segments, self._segments = segments, None
        if self._starts_workers():  # a ring of their own
            self._new_ring()
        workers = self._topology.workers
        progress: dict[str, Any] = {
            "epoch": epoch,
            "interrupts": interrupts,
            "positions": [(0, 0)] * workers,
            "turn": 0,
            "finished": False,
            "segments": schedules.epoch_layout(self.dataset.read_plan, epoch, segments),
        }
        self._pass = progress
        batches = _tracked(self._worker_batches(), progress, workers, self.dataset.ring)
        return self._passing(self._stats.timed(batches, started))

    def _rank_entry(
        self, progress: dict[str, Any], earlier: token_plan.TokenInterrupt | None
    ) -> list[int]:
        """This rank's [rank, turn, finished, records, offset, ...] in this pass; merged with
        its entry in ``earlier``, the run this pass resumed on the same topology, when given
        (the two runs are then one: see ``token_plan.token_rank_then``)."""
        positions, turn = progress["positions"], progress["turn"]
        if earlier is not None:
            rank = self.dataset.rank
            positions, turn = token_plan.token_rank_then(
                earlier.positions[rank], earlier.turns[rank], positions, turn
            )
        return token_plan.rank_json(self.dataset.rank, positions, turn, progress["finished"])

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: the epoch and, for each interrupted run of it, its topology and per
        rank each worker's position. Consecutive runs on one topology are one entry, so a run
        resumed on its own topology any number of times can always save its state
        (RuntimeError only when one epoch ran on more than ``state.MAX_RUNS`` topologies in
        turn). With an initialised torch.distributed group of the loader's world size, every
        rank must call it (it gathers the ranks' positions); otherwise it holds this rank's, for
        :func:`~syvain_training_data.loading.token_state.merge_token_states`."""
        progress = self._pass
        topology = self._topology
        read_plan = self.dataset.read_plan
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": self.dataset.state_kind,
            "selection": self.dataset.fingerprint(),
            # Named, so that a loader with another tokenizer or filter refuses it.
            **self.dataset.names(),
        }
        if progress is None:
            interrupts = [i.to_json() for i in self._resume]
            segments = self._segments if self._resume else None
            scheduled = schedules.state_fields(read_plan, self._next_epoch, segments)
            return {**state, **scheduled, "epoch": self._next_epoch, "interrupts": interrupts}
        if progress["finished"] and topology.world_size == 1:
            scheduled = schedules.state_fields(read_plan, progress["epoch"] + 1, None)
            return {**state, **scheduled, "epoch": progress["epoch"] + 1, "interrupts": []}
        before: tuple[token_plan.TokenInterrupt, ...] = progress["interrupts"]
        earlier = None
        if before and before[-1].topology == topology:  # this pass resumed that run
            before, earlier = before[:-1], before[-1]
        problem = plan.beyond_bounds([*(i.topology for i in before), topology])
        if problem is not None:
            raise RuntimeError(
                f"This epoch's loader state {problem}; finish the epoch before saving another state"
            )
        entries = token_state.gather_entries(
            self._rank_entry(progress, earlier), topology.world_size
        )
        interrupts = [i.to_json() for i in before]
        return {
            **state,
            **schedules.state_fields(
                self.dataset.read_plan, progress["epoch"], progress["segments"]
            ),
            "epoch": progress["epoch"],
            "interrupts": [*interrupts, [*topology.to_json(), entries]],
        }

    def _resumed_schedule(
        self, state: dict[str, Any], epoch: int, records: int, by_weights: bool
    ) -> tuple[schedules.Schedule, tuple[int, ...]]:
        """A scheduled loader resuming ``state``: (the schedule its runs used, the segments
        they were laid out with), checked field by field. A state of a ``mixing_weights``
        loader (``by_weights``) used this loader's first weights alone, in one segment."""
        read_plan = self.dataset.read_plan
        assert read_plan.schedule is not None
        if by_weights:
            weights = dataclasses.replace(read_plan, schedule=None)
            return read_plan.schedule[:1], (plan.epoch_length(weights, epoch),)
        old = schedules.schedule_from_json(checks.field(state, "schedule"), len(read_plan.streams))
        segments = schedules.segments_from_json(checks.field(state, "segments"), records)
        return old, segments

    def _by_weights(self, state: dict[str, Any], fingerprint: str) -> bool:
        """Whether a scheduled loader resumes a state of the ``mixing_weights`` loader of its
        first entry's weights (``fingerprint``, the state's, is that loader's)."""
        read_plan = self.dataset.read_plan
        if read_plan.schedule is None or "schedule" in state:
            return False
        resumed = dataclasses.replace(read_plan, schedule=None).resumed_by(
            fingerprint, self.dataset.fingerprint
        )
        if resumed is not None and resumed.spread != read_plan.spread:
            self.dataset.read_plan = dataclasses.replace(read_plan, spread=resumed.spread)
        return resumed is not None

    def _check_kind(self, state: object) -> None:
        """ValueError unless ``state`` is a state of this kind of loader."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next pass the rest of the epoch ``state`` was taken in, on this loader's
        topology. Raises ValueError for a state of another version, kind or selection, one
        that lacks some rank's positions, and, naming the field, for a field that is missing,
        of the wrong type or out of bounds (see :mod:`~syvain_training_data.loading.state`):
        every field is checked before anything is computed from it, and the positions against
        the epoch's plan. A state made with another tokenizer or filter is a ValueError naming
        both. With a mixing schedule, ValueError naming the first difference when this
        loader's schedule differs from the state's at or before a position its runs consumed
        (see :mod:`~syvain_training_data.loading.schedule`)."""
        self._check_kind(state)
        self.dataset.check_names(state)
        selection = checks.string(checks.field(state, "selection"), "selection")
        resumed = self.dataset.read_plan.resumed_by(selection, self.dataset.fingerprint)
        ours = resumed is not None
        if resumed is not None:
            self.dataset.read_plan = resumed
        by_weights = not ours and self._by_weights(state, selection)
        if not ours and not by_weights:
            raise ValueError(
                self.dataset.read_plan.refusal(
                    selection,
                    self.dataset.fingerprint,
                    f"This loader state was saved for another {self.dataset.state_fields}",
                )
            )
        epoch = checks.epoch_of(state)
        records = sum(self.dataset.read_plan.totals())
        schedule = self.dataset.read_plan.schedule
        old, segments, boundaries = None, None, None
        if schedule is not None:  # laid out segment by segment, as the state's runs were
            old, segments = self._resumed_schedule(state, epoch, records, by_weights)
            length, boundaries = segments[-1], (0, *segments)
        else:
            length = plan.epoch_length(self.dataset.read_plan, epoch)
        interrupts = token_state.interrupts_from_json(
            checks.field(state, "interrupts"), length, records
        )
        # Runs on one topology at the end are one run: exact, as no run has been laid out
        # after them yet.
        interrupts = plan.merged_tail(interrupts)
        if interrupts and all(interrupts[-1].finished):
            epoch, interrupts = epoch + 1, ()  # every rank had finished the epoch
        elif interrupts:  # positions past a part or back inside a record: ValueError now
            token_plan.token_layout(
                length, interrupts, self._topology, self.dataset.rank, boundaries
            )
            if schedule is not None and old is not None and segments is not None:
                schedules.check_resume(old, schedule, segments, interrupts, self._topology)
        self._segments = segments if interrupts else None
        self._next_epoch, self._resume = epoch, interrupts
        self._pass = None
        self._iterator = None


def check_read(index: int, part: Sequence[tuple[int, int]], epoch: int) -> None:
    """ValueError when a consumer read ``index`` records of a part planned otherwise."""
    expected = sum(stop - start for start, stop in part)
    if index != expected:
        raise ValueError(
            f"Read {index} records of epoch {epoch} where the plan has {expected}: "
            "the data changed since the manifest was written"
        )


def sent(bundles: Iterator[Bundle], ring: BatchRing | None) -> Iterator[Bundle]:
    """In a worker: each bundle's batches ready to leave it (through ``ring`` when they fit)."""
    for worker, last, batches in bundles:
        ready = [(for_transfer(b, ring), *tags) for b, *tags in batches]
        yield worker, last, ready


def _tracked(
    batches: Iterator[Bundle], progress: dict[str, Any], workers: int, ring: BatchRing | None
) -> Iterator[Any]:
    # Positions are those of batches the training loop received: batches workers prefetched
    # but the loop never took are not consumed. ``ring`` is held while its batches arrive.
    positions = list(progress["positions"])
    progress["positions"] = positions
    for batch, worker, whole, offset in in_turn(batches, workers):
        positions[worker] = (whole, offset)
        progress["turn"] = (worker + 1) % workers
        yield batch
    progress["finished"] = True

"""The torch DataLoader that ``SplitDataLoader.load`` returns: epochs, resume state, length.

Its ``state_dict()`` is a few integers: the epoch, and for each interrupted run of that epoch its
topology and the batches each rank had received. Any rank's state resumes every rank of a new
run with any topology (:func:`~syvain_training_data.loading.record_plan.run_layout` turns it
back into the records not yet consumed). Consecutive runs on one topology merge into one entry
(their batches add), so a state grows only when the topology changes; ``load_state_dict`` checks and
bounds every field before using it (:mod:`~syvain_training_data.loading.state`).
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from syvain_training_data.loading import plan, record_plan
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading import state as checks
from syvain_training_data.loading.dataset import ShardDataset
from syvain_training_data.loading.stats import ConsumerSlots, LoaderStats, StatsClock

__all__ = ["EpochLoader", "RecordDataLoader", "endless"]

STATE_VERSION = 2
# Interrupted runs of distinct topologies one state can name (consecutive runs on one topology
# merge into one entry): at most 46 bytes each, inside SPEC's 4 KiB.
MAX_INTERRUPTS = checks.MAX_RUNS


class EpochLoader[InterruptT](DataLoader[Any]):
    """What the loaders of ``load`` and ``load_tokens`` share: each pass is the next epoch (0,
    1, ... unless :meth:`set_epoch` says otherwise), resumed after the interrupted runs a
    ``load_state_dict`` gave (``InterruptT``: how its state names one), with counters for
    :meth:`stats`."""

    dataset: ShardDataset

    def __init__(
        self, dataset: ShardDataset, *, log_stats_every: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(dataset, **kwargs)
        # Created before any worker starts: each worker writes its own row.
        dataset.counters = ConsumerSlots(self.num_workers)
        self._stats = StatsClock(dataset.counters, self.num_workers, log_stats_every)
        self._next_epoch = 0
        self._resume: tuple[InterruptT, ...] = ()
        self._pass: dict[str, Any] | None = None
        # The pass persistent workers run next if left alone (their dataset copies advance).
        self._workers_next: tuple[int, tuple[InterruptT, ...]] | None = None
        # The iterator of the last pass, while it lives.
        self._live: weakref.ReferenceType[Iterator[Any]] | None = None

    @property
    def _topology(self) -> plan.Topology:
        return self.dataset.topology(self.num_workers)

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass (a pending resume is dropped)."""
        self._next_epoch, self._resume = checks.epoch(epoch), ()

    def _begin_pass(self) -> tuple[int, tuple[InterruptT, ...]]:
        """Takes the next pass's epoch and the runs it resumes after; the caller hands them to
        its dataset before the workers start."""
        epoch, interrupts = self._next_epoch, self._resume
        self._next_epoch, self._resume = epoch + 1, ()
        self.dataset.set_epoch(epoch)
        if self.persistent_workers and (
            self._workers_next != (epoch, interrupts) or self._pass_is_live()
        ):
            # The workers would run another pass, or are still running one that goes on
            # beside this one: this pass gets workers (and a ring) of its own.
            self._iterator = None
        self._workers_next = (epoch + 1, ())
        return epoch, interrupts

    def _pass_is_live(self) -> bool:
        """Whether the last pass's iterator is still referenced and not exhausted."""
        live = None if self._live is None else self._live()
        return live is not None and self._pass is not None and not self._pass["finished"]

    def _passing(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, the iterator this pass returns, watched: while it lives unexhausted,
        a new pass does not take over its persistent workers."""
        self._live = weakref.ref(batches)
        return batches

    def _worker_batches(self) -> Iterator[Any]:
        """The DataLoader's iterator of this pass (its workers start here, unless persistent
        ones go on). The dataset's batch ring (``ring``), if any, is retired once that iterator
        is gone (it stops its workers when it goes): the memory of every slot goes back to the
        system but that of batches the training loop still holds, each its own slot's."""
        iterator = super().__iter__()
        ring = getattr(self.dataset, "ring", None)
        if ring is not None and self.num_workers:
            ring.bind(iterator)
        return iterator

    def _starts_workers(self) -> bool:
        """Whether this pass (after :meth:`_begin_pass`) starts new workers: a ring made now
        reaches them."""
        return bool(self.num_workers) and (self._iterator is None or not self.persistent_workers)

    def _batches_in_flight(self, bundle: int) -> int:
        """Batches of one worker in flight at most when it sends ``bundle`` per DataLoader
        item: the bundles the DataLoader prefetches, the one the loader is handing out, and
        the batch the training loop holds (a ring's slots are read in place)."""
        return ((self.prefetch_factor or 2) + 1) * bundle + 1

    def stats(self) -> LoaderStats:
        """Counters since this loader was created, summed over the main process and the
        workers (see :class:`~syvain_training_data.loading.stats.LoaderStats`)."""
        return self._stats.snapshot()


class RecordDataLoader(EpochLoader[plan.Interrupt]):
    """A torch DataLoader over a :class:`ShardDataset`. Each pass is the next epoch;
    ``state_dict`` / ``load_state_dict`` follow torchdata's protocol and resume on any number
    of ranks and workers and any batch size."""

    # With a mixing schedule: the segments the runs of a resumed state were laid out with.
    _segments: tuple[int, ...] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        started = time.perf_counter()
        segments = self._segments if self._resume else None
        epoch, interrupts = self._begin_pass()
        self.dataset.interrupts, self.dataset.segments = interrupts, segments
        progress: dict[str, Any] = {
            "epoch": epoch,
            "interrupts": interrupts,
            "segments": segments,
            "batches": 0,
            "finished": False,
        }
        self._pass = progress
        return self._passing(_counted(self._stats.timed(self._batches(), started), progress))

    def _batches(self) -> Iterator[Any]:
        """This pass's batches as the DataLoader yields them (its workers start here)."""
        return self._worker_batches()

    def __len__(self) -> int:
        """Batches this rank yields in the next pass."""
        segments = self._segments if self._resume else None
        return self.dataset.rank_batches(self.num_workers, self._next_epoch, self._resume, segments)

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data of at most a few hundred bytes (4 KiB at most), holding no records.
        Runs on one topology in a row are one entry: a run resumed on its own topology any
        number of times can always save its state. RuntimeError only when one epoch ran on
        more than ``MAX_INTERRUPTS`` topologies in turn."""
        progress = self._pass
        interrupts: tuple[plan.Interrupt, ...]
        segments: tuple[int, ...] | None = None
        if progress is None:
            epoch, interrupts = self._next_epoch, self._resume
            segments = self._segments if interrupts else None
        elif progress["finished"]:
            epoch, interrupts = progress["epoch"] + 1, ()
        else:
            epoch, segments = progress["epoch"], progress["segments"]
            now = plan.Interrupt(self._topology, progress["batches"])
            interrupts = plan.appended(progress["interrupts"], now)
        problem = plan.beyond_bounds([i.topology for i in interrupts])
        if problem is not None:
            raise RuntimeError(
                f"This epoch's loader state {problem}; finish the epoch before saving another state"
            )
        return {
            "version": STATE_VERSION,
            "selection": self.dataset.read_plan.fingerprint(),
            "epoch": epoch,
            "interrupts": [interrupt.to_json() for interrupt in interrupts],
            **schedules.state_fields(self.dataset.read_plan, epoch, segments),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next pass the rest of the epoch ``state`` was taken in, on this loader's
        topology. Raises ValueError, naming the field, for a state of another version, kind or
        selection, and for a field that is missing, of the wrong type or out of bounds (see
        :mod:`~syvain_training_data.loading.state`); every field is checked before anything is
        computed from it."""
        if not isinstance(state, dict):
            raise ValueError(f"A loader state is a dict, got {checks.describe(state)}")
        version = state.get("version")
        if isinstance(version, bool) or version != STATE_VERSION:
            raise ValueError(f"Unsupported loader state version {checks.describe(version)}")
        if state.get("kind") == "filtered" and "filter" in state:  # this loader has no filter
            from syvain_training_data.loading.filters import filter_refusal

            theirs = checks.string(state["filter"], "filter")
            raise ValueError(filter_refusal(theirs, None))
        if "kind" in state:
            kind = state["kind"]
            if isinstance(kind, str) and kind.isidentifier() and len(kind) <= checks.MAX_STRING:
                raise ValueError(f"This is a {kind} loader state, not a record loader's")
            raise ValueError(f"Not a record loader's state (kind {checks.describe(kind)})")
        selection = checks.string(checks.field(state, "selection"), "selection")
        read_plan = self.dataset.read_plan
        resumed = read_plan.resumed_by(selection, plan.ReadPlan.fingerprint)
        weights_state = resumed is None and "schedule" not in state
        if weights_state and read_plan.schedule is not None:
            # A scheduled loader resumes a state of the mixing_weights loader of its first
            # entry's weights: that epoch was one segment of those weights.
            resumed = dataclasses.replace(read_plan, schedule=None).resumed_by(
                selection, plan.ReadPlan.fingerprint
            )
            if resumed is not None:
                resumed = dataclasses.replace(read_plan, spread=resumed.spread)
        if resumed is None:
            raise ValueError(
                read_plan.refusal(
                    selection,
                    plan.ReadPlan.fingerprint,
                    "This loader state was saved for another selection, seed, shuffle or mixing",
                )
            )
        self.dataset.read_plan = resumed
        epoch = checks.epoch_of(state)
        interrupts = self.dataset.interrupts_from_json(checks.field(state, "interrupts"), epoch)
        segments = self._resumed_segments(state, epoch, interrupts, weights_state)
        # Runs on one topology at the end are one run (states of earlier versions kept an
        # entry per run): exact, as no run has been laid out after them yet.
        interrupts = plan.merged_tail(interrupts)
        if interrupts and not self.dataset.left_in_epoch(
            self.num_workers, epoch, interrupts, segments
        ):
            epoch, interrupts = epoch + 1, ()  # nothing of that epoch is left
        self._segments = segments if interrupts else None
        self._next_epoch, self._resume = epoch, interrupts
        self._pass = None
        self._iterator = None

    def _resumed_segments(
        self,
        state: dict[str, Any],
        epoch: int,
        interrupts: tuple[plan.Interrupt, ...],
        weights_state: bool,
    ) -> tuple[int, ...] | None:
        """With a mixing schedule, the segments the state's runs were laid out with (a
        ``mixing_weights`` state's: one, its epoch's length), checked field by field, after
        checking that this loader's schedule differs from the state's only after every
        position those runs consumed (:func:`~.schedule.check_consumed`); None without one."""
        read_plan = self.dataset.read_plan
        if read_plan.schedule is None:
            return None
        segments: tuple[int, ...]
        if weights_state:
            weights = dataclasses.replace(read_plan, schedule=None)
            old, segments = read_plan.schedule[:1], (plan.epoch_length(weights, epoch),)
        else:
            streams = len(read_plan.streams)
            old = schedules.schedule_from_json(checks.field(state, "schedule"), streams)
            records = sum(read_plan.totals())
            segments = schedules.segments_from_json(checks.field(state, "segments"), records)
        if interrupts and schedules.first_difference(old, read_plan.schedule) is not None:
            left = record_plan.left_positions(
                read_plan, segments[-1], interrupts, self._topology, (0, *segments)
            )
            consumed = schedules.last_consumed(segments[-1], left)
            schedules.check_consumed(old, read_plan.schedule, consumed)
        return segments


def _counted(batches: Iterator[Any], progress: dict[str, Any]) -> Iterator[Any]:
    # Counted as the training loop receives them: batches workers prefetched but the loop
    # never took are not consumed.
    for batch in batches:
        progress["batches"] += 1
        yield batch
    progress["finished"] = True


def endless(loader: DataLoader[Any], split: str) -> Iterator[Any]:
    """Epoch after epoch; RuntimeError("{split} split produced no batches") on an empty one."""
    while True:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        if not produced:
            raise RuntimeError(f"{split} split produced no batches")

"""`SplitDataLoader`: stream a manifest's splits into a torch DataLoader (SPEC section 6).

The loader reads the manifest once, at construction. ``load`` selects shards (a split, one
curriculum stage, or a union of stages), splits them across ranks and DataLoader workers by
shard (worker w of W reads shards w, w+W, ...; rank r of R takes shards r, r+R, ... first), and
streams each shard with :func:`~syvain_training_data.shard.iter_shard`. Options beyond the SPEC
(ranks, equal batches, shuffling, resumption) default to off, which keeps the SPEC behaviour.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from syvain_training_data.manifest import DataManifest, DataManifestDataFormat, ManifestShard
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ModuleNotFoundError as error:  # pragma: no cover - exercised without the extra
    raise ModuleNotFoundError(
        "SplitDataLoader needs PyTorch, the 'torch' extra: "
        "pip install 'syvain-training-data[torch]'",
        name=error.name,
    ) from error

__all__ = ["ShardDataset", "SplitDataLoader", "SyvainDataLoader"]

# Arguments that only mean something with worker processes.
_WORKER_ONLY_ARGS = ("persistent_workers", "prefetch_factor", "multiprocessing_context")
_STATE_VERSION = 1


def _check_index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


def _resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): given explicitly, else from an initialised torch.distributed."""
    if (rank is None) != (world_size is None):
        raise ValueError("Pass both rank and world_size, or neither")
    if rank is None or world_size is None:
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank(), distributed.get_world_size()
        return 0, 1
    rank = _check_index(rank, "rank")
    world_size = _check_index(world_size, "world_size")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return rank, world_size


def _epoch_order(shards: Sequence[ManifestShard], seed: int | None, epoch: int) -> list[int]:
    """Shard indices in the order of this epoch: manifest order, or a seeded permutation."""
    order = list(range(len(shards)))
    if seed is not None:
        random.Random(f"syvain-shard-order:{seed}:{epoch}").shuffle(order)
    return order


def _consumer_shards(
    order: list[int], rank: int, world: int, worker: int, workers: int
) -> list[int]:
    """Rank r of R takes positions r, r+R, ...; worker w of W of those takes every W-th from w.

    So consumer (r, w) reads positions r + R*w + R*W*k: disjoint, and together all of them."""
    return order[rank + world * worker :: world * workers]


class _Prefetch:
    """Iterates ``records``, whose first batch a background thread starts fetching at once.

    The store's reader releases the GIL while it waits, so the request overlaps the current
    shard's decoding; an error surfaces when the records are reached, as without prefetch."""

    def __init__(self, records: Iterator[Any]) -> None:
        self._records = records
        self._first: list[Any] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._prime, daemon=True)
        self._thread.start()

    def _prime(self) -> None:
        try:
            self._first = [next(self._records)]
        except StopIteration:
            pass
        except BaseException as error:  # re-raised in the consumer
            self._error = error

    def __iter__(self) -> Iterator[Any]:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        yield from self._first
        yield from self._records


_END = object()


class _Stream:
    """One consumer's shards of one stage (or of the whole selection), read in order, with the
    next shard prefetched. ``state`` ({"position", "offset"}) is updated before each record is
    handed out, so a state taken between records is exact."""

    def __init__(self, dataset: ShardDataset, part: list[int], state: dict[str, int]) -> None:
        self._dataset = dataset
        self._part = part
        self.state = state
        self._records: Iterator[Any] | None = None

    @property
    def finished(self) -> bool:
        return self.state["position"] >= len(self._part)

    def next(self) -> Any:
        """The next record, or ``_END`` once the stream is exhausted."""
        if self._records is None:
            self._records = self.records()
        return next(self._records, _END)

    def records(self) -> Iterator[Any]:
        state, part, dataset = self.state, self._part, self._dataset
        upcoming: _Prefetch | None = None
        while state["position"] < len(part):
            position = state["position"]
            source = upcoming or _Prefetch(dataset._open(part[position]))
            upcoming = None
            if position + 1 < len(part):
                # Request the next shard's first bytes now, so they arrive while this one is
                # read; one shard ahead at most, so readahead stays bounded.
                upcoming = _Prefetch(dataset._open(part[position + 1]))
            # After a resume the records already delivered are read again and skipped;
            # finished shards are not opened at all.
            for record in itertools.islice(source, state["offset"], None):
                state["offset"] += 1
                yield record
            state["position"], state["offset"] = position + 1, 0


MIX_STOPS = ("first_exhausted", "all_exhausted")


class ShardDataset(IterableDataset[Any]):
    """An IterableDataset over an ordered shard selection, split by rank and worker.

    Each pass is one epoch: every shard of the consumer's part in order (or, with a seed, in a
    per-epoch permutation, then through a bounded shuffle buffer). With ``groups`` and
    ``weights`` (curriculum mixing) each record is drawn from a stage chosen by weight.
    Implements ``state_dict`` / ``load_state_dict`` (torchdata's StatefulDataLoader protocol)
    and ``set_epoch``.
    """

    def __init__(
        self,
        data_format: DataManifestDataFormat,
        shards: Sequence[ManifestShard],
        *,
        storage_config: StorageConfig,
        rank: int = 0,
        world_size: int = 1,
        seed: int | None = None,
        shuffle_buffer: int = 0,
        groups: Sequence[Sequence[int]] | None = None,
        weights: Sequence[float] | None = None,
        mix_stop: str = "first_exhausted",
    ) -> None:
        self.data_format = data_format
        self.shards = tuple(shards)
        self.storage_config = storage_config
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.groups = None if groups is None else tuple(tuple(group) for group in groups)
        self.weights = None if weights is None else tuple(weights)
        self.mix_stop = mix_stop
        self.epoch = 0
        self._resume: dict[str, Any] | None = None
        self._progress: dict[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch of the next pass (it seeds the shard order and shuffle buffer)."""
        self.epoch = _check_index(epoch, "epoch")

    def consumer_shards(self, worker: int, workers: int, epoch: int | None = None) -> list[int]:
        """Indices into ``shards`` that worker ``worker`` of ``workers`` reads in an epoch."""
        return [i for part in self.consumer_parts(worker, workers, epoch) for i in part]

    def consumer_parts(
        self, worker: int, workers: int, epoch: int | None = None
    ) -> list[list[int]]:
        """Per stream (one, or one per mixed stage), the shard indices this consumer reads."""
        epoch = self.epoch if epoch is None else epoch
        if self.groups is None:
            order = _epoch_order(self.shards, self.seed, epoch)
            return [_consumer_shards(order, self.rank, self.world_size, worker, workers)]
        parts = []
        for number, group in enumerate(self.groups):
            order = list(group)
            if self.seed is not None:
                random.Random(f"syvain-shard-order:{self.seed}:{epoch}:{number}").shuffle(order)
            parts.append(_consumer_shards(order, self.rank, self.world_size, worker, workers))
        return parts

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        resume, self._resume = self._resume, None
        epoch = self.epoch if resume is None else resume["epoch"]
        # A persistent worker's copy advances one epoch per pass, like the parent's loader.
        self.epoch = epoch + 1
        label = f"{self.seed}:{epoch}:{self.rank}:{worker}"
        rng = random.Random(f"syvain-buffer:{label}")
        mixer = random.Random(f"syvain-mix:{label}")
        streams = len(self.groups) if self.groups is not None else 1
        progress: dict[str, Any] = {
            "epoch": epoch,
            "streams": [{"position": 0, "offset": 0} for _ in range(streams)],
            "ended": False,
        }
        buffer: list[Any] = []
        if resume is not None:
            progress["streams"] = [dict(stream) for stream in resume["streams"]]
            progress["ended"] = resume["ended"]
            buffer = list(resume["buffer"])
            rng.setstate(resume["rng"])
            mixer.setstate(resume["mixer"])
        # Set now, not when the generator starts: a state taken before the first record must
        # still name this pass.
        self._progress, self._buffer, self._rng, self._mixer = progress, buffer, rng, mixer
        return self._records(progress, worker, workers, buffer, rng, mixer)

    def _records(
        self,
        progress: dict[str, Any],
        worker: int,
        workers: int,
        buffer: list[Any],
        rng: random.Random,
        mixer: random.Random,
    ) -> Iterator[Any]:
        parts = self.consumer_parts(worker, workers, progress["epoch"])
        streams = [
            _Stream(self, part, state)
            for part, state in zip(parts, progress["streams"], strict=True)
        ]
        use_buffer = self.seed is not None and self.shuffle_buffer > 1
        every = list(range(len(streams)))
        if len(streams) == 1 and not use_buffer:
            yield from streams[0].records()  # the common case, without a call per record
            return
        while not progress["ended"]:
            if len(streams) == 1:
                record = streams[0].next()
                if record is _END:
                    break
            else:
                assert self.weights is not None
                # first_exhausted: a draw from an exhausted stage ends the epoch, so the
                # proportions hold throughout; all_exhausted: only live stages are drawn.
                live = every
                if self.mix_stop == "all_exhausted":
                    live = [i for i in every if not streams[i].finished]
                    if not live:
                        break
                chosen = mixer.choices(live, weights=[self.weights[i] for i in live])[0]
                record = streams[chosen].next()
                if record is _END:
                    if self.mix_stop == "first_exhausted":
                        progress["ended"] = True
                    continue
            if not use_buffer:
                yield record
                continue
            if len(buffer) < self.shuffle_buffer:
                buffer.append(record)
                continue
            slot = rng.randrange(len(buffer))
            buffer[slot], record = record, buffer[slot]
            yield record
        progress["ended"] = True
        while buffer:
            slot = rng.randrange(len(buffer))
            buffer[slot], buffer[-1] = buffer[-1], buffer[slot]
            yield buffer.pop()

    def _open(self, index: int) -> Iterator[Any]:
        return iter_shard(self.data_format, self.shards[index], storage_config=self.storage_config)

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset is in its pass: epoch, per stream the shard position
        and records read from that shard, the shuffle buffer (records not yet yielded) and the
        generators' states. A finished pass stays finished when resumed (torchdata asks a
        finished worker again)."""
        progress = self._progress
        if progress is None:
            return {"version": _STATE_VERSION, "epoch": self.epoch, "started": False}
        return {
            "version": _STATE_VERSION,
            "epoch": progress["epoch"],
            "started": True,
            "streams": [dict(stream) for stream in progress["streams"]],
            "ended": progress["ended"],
            "buffer": list(self._buffer),
            "rng": self._rng.getstate(),
            "mixer": self._mixer.getstate(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next pass continue where :meth:`state_dict` was taken.

        Raises ValueError for a state of another version."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"Unsupported loader state version {state.get('version')!r}")
        self._progress = None
        if state["started"]:
            self._resume = dict(state)
        else:
            self._resume = None
            self.epoch = state["epoch"]


class _EpochPasses:
    """Shared by our DataLoaders: each pass advances the dataset's epoch (0, 1, 2, ... unless
    :meth:`set_epoch` says otherwise) and may be capped at a number of batches."""

    dataset: Any
    persistent_workers: bool
    _iterator: Any

    def _init_passes(self, batch_limit: Callable[[int], int] | None) -> None:
        self._batch_limit = batch_limit
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass; with persistent workers a different epoch than the one
        they expect restarts them."""
        epoch = _check_index(epoch, "epoch")
        if epoch != self._next_epoch and self.persistent_workers:
            self._iterator = None
        self._next_epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        assert isinstance(dataset, ShardDataset)
        epoch = self._next_epoch
        dataset.set_epoch(epoch)
        self._next_epoch = epoch + 1
        iterator = super().__iter__()  # type: ignore[misc]
        if self._batch_limit is None:
            return iterator  # type: ignore[no-any-return]
        return itertools.islice(iterator, self._batch_limit(epoch))

    def __len__(self) -> int:
        if self._batch_limit is None:
            return super().__len__()  # type: ignore[misc, no-any-return]
        return self._batch_limit(self._next_epoch)


class SyvainDataLoader(_EpochPasses, DataLoader[Any]):  # type: ignore[misc]
    """The torch DataLoader ``SplitDataLoader.load`` returns (see :class:`_EpochPasses`)."""

    def __init__(
        self, dataset: ShardDataset, *, batch_limit: Callable[[int], int] | None, **kwargs: Any
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._init_passes(batch_limit)


def _stateful_loader_class() -> type:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "stateful=True needs torchdata: pip install torchdata", name=error.name
        ) from error

    class SyvainStatefulDataLoader(_EpochPasses, StatefulDataLoader):  # type: ignore[misc]
        """A torchdata StatefulDataLoader: ``state_dict()`` mid-epoch, ``load_state_dict()`` on
        a fresh loader, and the pass continues with no record lost or repeated."""

        def __init__(
            self,
            dataset: ShardDataset,
            *,
            batch_limit: Callable[[int], int] | None,
            **kwargs: Any,
        ) -> None:
            super().__init__(dataset, **kwargs)
            self._init_passes(batch_limit)

        def state_dict(self) -> dict[str, Any]:
            started = self._iterator is not None
            loader_state = super().state_dict()
            # The epoch of the pass this state is in, and whether that pass has ended.
            epoch = self._next_epoch - 1 if started else self._next_epoch
            finished = bool(started and self._iterator._finished)
            return {"epoch": epoch, "finished": finished, "loader": loader_state}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            super().load_state_dict(state_dict["loader"])
            self._next_epoch = state_dict["epoch"] + (1 if state_dict["finished"] else 0)

    return SyvainStatefulDataLoader


def _batches(records: int, batch_size: int | None, drop_last: bool) -> int:
    if batch_size is None:
        return records
    return records // batch_size if drop_last else -(-records // batch_size)


class SplitDataLoader:
    """Builds DataLoaders over one manifest's splits; see :meth:`load`.

    Created by :meth:`SyvainTrainingData.split_data_loader`, which reads the manifest once.
    """

    def __init__(
        self,
        manifest: DataManifest,
        collate_fn: Callable[[list[Any]], Any],
        dataloader_args: Mapping[str, Any] | None = None,
        *,
        storage_config: StorageConfig | None = None,
        manifest_uri: str | None = None,
    ) -> None:
        args = dict(dataloader_args or {})
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
        """(shards, per stage the indices of its shards, stage names): a shard listed by
        several stages belongs to the first."""
        entry = self.manifest.splits.get(split)
        if entry is None:
            available = ", ".join(sorted(self.manifest.splits))
            raise ValueError(f"Unknown split {split!r}; available splits: {available}")
        if curriculum_stage is not None and curriculum_stages is not None:
            raise ValueError("Pass curriculum_stage or curriculum_stages, not both")
        if curriculum_stages is None:
            if curriculum_stage is None:
                return list(entry.shards), [list(range(len(entry.shards)))], []
            stages = [curriculum_stage]
        else:
            if isinstance(curriculum_stages, str):
                raise ValueError(
                    "curriculum_stages must be a sequence of stage names, not a str "
                    f"({curriculum_stages!r}); use curriculum_stage for one stage"
                )
            stages = list(curriculum_stages)
            if not stages:
                raise ValueError("curriculum_stages must not be empty")
            repeated = sorted({stage for stage in stages if stages.count(stage) > 1})
            if repeated:
                raise ValueError(f"Duplicate curriculum stages: {', '.join(repeated)}")
        selected: list[ManifestShard] = []
        groups: list[list[int]] = []
        seen: set[str] = set()
        for stage in stages:
            found = entry.curriculum.get(stage)
            if found is None:
                available = ", ".join(sorted(entry.curriculum)) or "(none)"
                raise ValueError(
                    f"Unknown curriculum stage {stage!r} in split {split!r}; "
                    f"available stages: {available}"
                )
            group = []
            for shard in found.shards:
                if shard.uri not in seen:
                    seen.add(shard.uri)
                    group.append(len(selected))
                    selected.append(shard)
            groups.append(group)
        return selected, groups, stages

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
        weights = []
        for stage in stages:
            weight = raw[stage]
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight <= 0
            ):
                raise ValueError(
                    f"Curriculum stage {stage!r} needs a positive finite weight, got {weight!r}"
                )
            weights.append(float(weight))
        return weights

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
        shuffle_buffer: int = 0,
        stateful: bool = False,
        mixing_weights: Mapping[str, float] | str | None = None,
        mixing_stop: str = "first_exhausted",
    ) -> Any:
        """A DataLoader over ``split`` (or one stage, or a union of stages kept in stage order
        without repeated shard URIs); with ``infinite_iter``, an endless iterator of batches.

        Options (defaults keep SPEC section 6 behaviour):
          rank, world_size: this process's part; default from an initialised torch.distributed,
            else (0, 1). Parts are by shard: rank r reads positions r, r+R, ...; across ranks and
            workers every record is read exactly once per epoch.
          equal_batches: every rank yields the same number of batches per epoch, the smallest
            any rank would yield; the extra batches at the end of longer ranks' passes are
            dropped (never repeated). Computed from the manifest: no communication.
          seed: shuffle: the shard order is permuted per epoch from (seed, epoch); with
            shuffle_buffer > 1 each worker also shuffles records through a buffer of that size.
          mixing_weights: curriculum mixing instead of the union: a mapping stage -> weight
            (its keys are the stages when ``curriculum_stages`` is not given), or "metadata"
            for each stage's ``weight`` metadata. Each record comes from a stage drawn by
            weight, deterministic from (seed or 0, epoch, rank, worker); each stage's shards
            are split across ranks and workers like a selection of their own.
          mixing_stop: "first_exhausted" (default): the epoch ends at the first draw from a
            stage with no records left, so the proportions hold throughout and the rest of
            the other stages is not read that epoch; "all_exhausted": exhausted stages leave
            the draw, and every record is read once per epoch.
          stateful: return a torchdata StatefulDataLoader (needs torchdata) whose
            ``state_dict()`` / ``load_state_dict()`` resume mid-epoch. The dataset itself
            (``loader.dataset``) follows that protocol, so any StatefulDataLoader works with it.

        Raises:
            ValueError: unknown split ("Unknown split 'x'; available splits: a, b") or stage
                ("... available stages: ..."), both stage arguments, ``curriculum_stages`` a
                str, empty or with duplicates; bad rank/world_size.
            RuntimeError: with ``infinite_iter``, "{split} split produced no batches" when an
                epoch yields none.
        """
        if (
            mixing_weights is not None
            and curriculum_stages is None
            and curriculum_stage is None
            and isinstance(mixing_weights, Mapping)
        ):
            curriculum_stages = list(mixing_weights)
        shards, groups, stages = self._select(split, curriculum_stage, curriculum_stages)
        weights = None
        if mixing_weights is not None:
            if curriculum_stages is None:
                raise ValueError("mixing_weights needs curriculum_stages (the stages to mix)")
            if mixing_stop not in MIX_STOPS:
                raise ValueError(f"mixing_stop must be one of {', '.join(MIX_STOPS)}")
            if equal_batches and mixing_stop == "first_exhausted":
                raise ValueError(
                    "equal_batches needs mixing_stop='all_exhausted' (batch counts are "
                    "known in advance only when every record is read)"
                )
            weights = self._mixing_weights(split, stages, mixing_weights)
            if seed is None:
                seed = 0
        rank, world_size = _resolve_ranks(rank, world_size)
        if seed is not None:
            seed = _check_index(seed, "seed")
        shuffle_buffer = _check_index(shuffle_buffer, "shuffle_buffer")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must not be negative, got {shuffle_buffer}")
        args = dict(self.dataloader_args)
        per_rank = -(-len(shards) // world_size)
        workers = min(args.get("num_workers", 0), per_rank)
        args["num_workers"] = workers
        if workers == 0:
            for name in _WORKER_ONLY_ARGS:
                args.pop(name, None)
            if args.get("timeout", 0) > 0:
                args.pop("timeout")
        dataset = ShardDataset(
            self.manifest.data_format,
            shards,
            storage_config=self.storage_config,
            rank=rank,
            world_size=world_size,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            groups=groups if weights is not None else None,
            weights=weights,
            mix_stop=mixing_stop,
        )
        batch_limit = None
        if equal_batches:
            batch_limit = self._equal_batch_limit(dataset, workers, args)
        loader_class = _stateful_loader_class() if stateful else SyvainDataLoader
        loader = loader_class(dataset, batch_limit=batch_limit, collate_fn=self.collate_fn, **args)
        if infinite_iter:
            return _endless(loader, split)
        return loader

    @staticmethod
    def _equal_batch_limit(
        dataset: ShardDataset, workers: int, args: Mapping[str, Any]
    ) -> Callable[[int], int]:
        batch_size = args.get("batch_size", 1)
        drop_last = bool(args.get("drop_last", False))
        consumers = max(workers, 1)

        def limit(epoch: int) -> int:
            counts = []
            for rank in range(dataset.world_size):
                view = copy.copy(dataset)
                view.rank = rank
                total = 0
                for worker in range(consumers):
                    part = view.consumer_shards(worker, consumers, epoch)
                    records = sum(dataset.shards[index].records for index in part)
                    total += _batches(records, batch_size, drop_last)
                counts.append(total)
            return min(counts)

        return limit


def _endless(loader: SyvainDataLoader, split: str) -> Iterator[Any]:
    while True:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        if not produced:
            raise RuntimeError(f"{split} split produced no batches")

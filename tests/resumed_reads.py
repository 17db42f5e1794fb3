"""One seeded read of a dataset interrupted and resumed on another topology, for the tests of
stores and adopted datasets: the values of ``key`` of every record the two runs yielded."""

from __future__ import annotations

import json
from typing import Any

from syvain_training_data import SyvainTrainingData


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def interrupted_and_resumed(
    client: SyvainTrainingData,
    uri: str,
    key: str,
    *,
    seed: int = 0,
    batches_before: int = 8,
    ranks_after: int = 2,
    **loader_options: Any,
) -> list[Any]:
    """``key`` of each record a one-rank seeded run yields in ``batches_before`` batches of 16,
    then of each record ranks_after ranks (batches of 5) yield resuming its state (through
    JSON, as a checkpoint file would): every record once when the resume is exact."""
    loader = client.split_data_loader(uri, as_list, {"batch_size": 16}, **loader_options)
    run = loader.load("train", seed=seed)
    seen = []
    for index, batch in enumerate(run):
        seen += [record[key] for record in batch]
        if index + 1 == batches_before:
            break
    state = json.loads(json.dumps(run.state_dict()))
    for rank in range(ranks_after):
        resumed = client.split_data_loader(uri, as_list, {"batch_size": 5}, **loader_options).load(
            "train", seed=seed, rank=rank, world_size=ranks_after
        )
        resumed.load_state_dict(state)
        seen += [record[key] for batch in resumed for record in batch]
    return seen

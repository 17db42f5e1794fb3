"""SplitDataLoader's curriculum mixing: proportions, stops, resume and the weights' bounds."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from loader_data import as_list  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading.split_loader import SplitDataLoader  # noqa: E402


@pytest.fixture(scope="module")
def mix_dataset(tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    """Stages a (weight 3) and b (weight 1), two shards of 400 records each."""
    client = SyvainTrainingData()
    uri = f"file://{tmp_path_factory.mktemp('mix')}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="jsonl.gz")
    for stage, weight in (("a", 3), ("b", 1)):
        for part in range(2):
            saver.save(
                "train",
                stage,
                [{"stage": stage, "part": part, "i": i} for i in range(400)],
                curriculum_metadata={"weight": weight},
                shard_id=f"{stage}-{part}",
            )
    saver.commit_manifest()
    return client, uri


def test_mixing_proportions_follow_the_weights(mix_dataset):
    client, uri = mix_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": 16})
    drawn = [r["stage"] for b in loader.load("train", mixing_weights={"a": 1, "b": 1}) for r in b]
    # first_exhausted: the epoch ends at the first draw from an empty stage
    assert Counter(drawn)["a"] <= 800 and Counter(drawn)["b"] <= 800
    assert 800 in Counter(drawn).values()
    assert abs(drawn.count("a") / len(drawn) - 0.5) < 0.05
    weighted = loader.load("train", curriculum_stages=["a", "b"], mixing_weights="metadata")
    stages = [r["stage"] for b in weighted for r in b]
    assert stages.count("a") == 800  # a (weight 3) runs out first
    assert abs(stages.count("a") / len(stages) - 0.75) < 0.04  # 3 sigma at ~1070 draws
    again = loader.load("train", curriculum_stages=["a", "b"], mixing_weights="metadata")
    assert [r["stage"] for b in again for r in b] == stages  # deterministic from the seed


def test_mixing_until_all_exhausted_reads_everything_once(mix_dataset):
    client, uri = mix_dataset
    loader = client.split_data_loader(
        uri, as_list, {"batch_size": 16, "num_workers": 2, "multiprocessing_context": "fork"}
    )
    seen = []
    for rank in range(2):
        dl = loader.load(
            "train",
            mixing_weights={"a": 3, "b": 1},
            mixing_stop="all_exhausted",
            rank=rank,
            world_size=2,
            seed=4,
            shuffle_buffer=32,
        )
        seen += [(r["stage"], r["part"], r["i"]) for b in dl for r in b]
    assert sorted(seen) == [(s, p, i) for s in "ab" for p in range(2) for i in range(400)]


def test_mixing_resumes_mid_epoch(mix_dataset):
    client, uri = mix_dataset
    loader = client.split_data_loader(
        uri, as_list, {"batch_size": 16, "num_workers": 2, "multiprocessing_context": "fork"}
    )

    def load():
        return loader.load("train", mixing_weights={"a": 3, "b": 1}, stateful=True, seed=9)

    def flat(batches):
        return [(r["stage"], r["part"], r["i"]) for b in batches for r in b]

    whole = flat(load())
    first = load()
    it = iter(first)
    before = [next(it) for _ in range(30)]
    state = first.state_dict()
    del it
    resumed = load()
    resumed.load_state_dict(state)
    assert sorted(flat(before) + flat(resumed)) == sorted(whole)


def test_mixing_argument_errors(mix_dataset, local_dataset):
    client, uri = mix_dataset
    loader = client.split_data_loader(uri, as_list)
    with pytest.raises(ValueError, match="exactly the stages"):
        loader.load("train", curriculum_stages=["a"], mixing_weights={"a": 1, "b": 1})
    with pytest.raises(ValueError, match="positive finite weight"):
        loader.load("train", mixing_weights={"a": 1, "b": 0})
    with pytest.raises(ValueError, match="needs curriculum_stages"):
        loader.load("train", mixing_weights="metadata")
    with pytest.raises(ValueError, match="mixing_stop must be one of"):
        loader.load("train", mixing_weights={"a": 1, "b": 1}, mixing_stop="never")
    local_client, local_uri = local_dataset
    no_weights = local_client.split_data_loader(local_uri, as_list)
    with pytest.raises(ValueError, match="'easy' needs a positive finite weight, got None"):
        no_weights.load("train", curriculum_stages=["easy", "hard"], mixing_weights="metadata")


def _mix_manifest(weights: dict[str, Any]) -> Any:
    """A manifest of two stages whose metadata hold ``weights`` (shards never read)."""
    from syvain_training_data import DataManifest

    shards = {
        stage: {"uri": f"file:///nowhere/{stage}.jsonl.gz", "records": 10, "size_bytes": 100}
        for stage in weights
    }
    return DataManifest.model_validate(
        {
            "version": 1,
            "data_format": "jsonl.gz",
            "splits": {
                "train": {
                    "records": 10 * len(weights),
                    "shards": list(shards.values()),
                    "curriculum": {
                        stage: {"records": 10, "shards": [shards[stage]], "metadata": {"weight": w}}
                        for stage, w in weights.items()
                    },
                }
            },
        },
        strict=True,
    )


@pytest.mark.parametrize(
    ("weights", "bad_stage", "shown"),
    [
        ({"a": 1e308, "b": 1e-308}, "b", "1e-308"),
        ({"a": 1e308, "b": 1e308}, "a", "1e+308"),
        ({"a": 1.7e308, "b": 1.7e308, "c": 1.0}, "a", "1.7e+308"),
        ({"a": 1, "b": 10**400}, "b", "1329 bits"),
        ({"a": 10**300, "b": 1}, "b", "1.0"),
        ({"a": True, "b": 1}, "a", "True"),
        ({"a": 1, "b": 0}, "b", "0"),
        ({"a": -2.5, "b": 1}, "a", "-2.5"),
        ({"a": 1, "b": "1"}, "b", "'1'"),
        ({"a": 1, "b": None}, "b", "None"),
    ],
)
def test_extreme_metadata_mixing_weights_are_value_errors_naming_stage_and_weight(
    weights, bad_stage, shown
):
    loader = SplitDataLoader(_mix_manifest(weights), as_list)
    stages = list(weights)
    for mixing_weights in ("metadata", dict(weights)):
        with pytest.raises(ValueError, match=f"stage {bad_stage!r}") as info:
            iter(loader.load("train", curriculum_stages=stages, mixing_weights=mixing_weights))
        assert shown in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_mapping_mixing_weights_are_value_errors(bad):
    loader = SplitDataLoader(_mix_manifest({"a": 1, "b": 2}), as_list)
    with pytest.raises(ValueError, match=f"stage 'b' needs a positive finite weight, got {bad!r}"):
        loader.load("train", curriculum_stages=["a", "b"], mixing_weights={"a": 1, "b": bad})


def test_mixing_weights_far_apart_but_within_bounds_still_mix(tmp_path):
    """Weights 1e30 and 1e-8 (a share of 1e-38, above the 2**-128 bound) load from real
    shards, given in the metadata or as a mapping: first_exhausted ends the epoch when the
    heavy stage runs out, before any record of the light one; all_exhausted then reads the
    light stage too, every record once."""
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="jsonl.gz")
    for stage, weight in (("a", 1e30), ("b", 1e-8)):
        saver.save(
            "train",
            stage,
            [{"stage": stage, "i": i} for i in range(100)],
            curriculum_metadata={"weight": weight},
            shard_id=stage,
        )
    saver.commit_manifest()
    loader = client.split_data_loader(uri, as_list, {"batch_size": 16})
    a_then_b = [("a", i) for i in range(100)] + [("b", i) for i in range(100)]
    for weights in ("metadata", {"a": 1e30, "b": 1e-8}):
        for stop, expected in (("first_exhausted", a_then_b[:100]), ("all_exhausted", a_then_b)):
            mixed = loader.load(
                "train", curriculum_stages=["a", "b"], mixing_weights=weights, mixing_stop=stop
            )
            assert len(mixed) == -(-len(expected) // 16)
            assert [(r["stage"], r["i"]) for b in mixed for r in b] == expected, (weights, stop)

"""load(columns=): one long record cannot multiply a batch's memory by the batch size:
``max_length`` cuts or refuses long rows, and a padded batch is bounded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading import columns  # noqa: E402
from syvain_training_data.loading.columns import TensorCollate  # noqa: E402

LONG = 100_000


def records() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [{"tokens": [i, i + 1], "i": i} for i in range(31)]
    rows.insert(7, {"tokens": list(range(LONG)), "i": 99})
    return rows


@pytest.mark.parametrize("as_tensors", [False, True])
def test_long_rows_are_cut_to_max_length_when_asked(as_tensors):
    batch = records()
    if as_tensors:  # int lists read from Arrow arrays arrive as tensors
        batch = [{**r, "tokens": torch.tensor(r["tokens"])} for r in batch]
    out = TensorCollate(["tokens"], max_length=16, truncate=True)(batch)
    assert out["tokens"].shape == (32, 16)
    assert out["tokens"][7].tolist() == list(range(16))
    assert out["tokens_lengths"].tolist()[6:9] == [2, 16, 2]


def test_a_long_row_is_refused_without_truncate():
    with pytest.raises(ValueError, match=rf"'tokens' has a row of {LONG} values, over max_length"):
        TensorCollate(["tokens"], max_length=16)(records())


def test_a_padded_batch_is_bounded_even_without_max_length(monkeypatch):
    monkeypatch.setattr(columns, "MAX_PADDED_VALUES", 32 * LONG - 1)
    with pytest.raises(ValueError, match=r"would pad 32 rows to 100000 values.*max_length"):
        TensorCollate(["tokens"])(records())
    monkeypatch.setattr(columns, "MAX_PADDED_VALUES", 32 * LONG)
    assert TensorCollate(["tokens"])(records())["tokens"].shape == (32, LONG)


@pytest.mark.parametrize(
    ("max_length", "truncate"), [(0, False), (-1, True), (True, False), (None, True), (2.0, False)]
)
def test_bad_bounds_are_value_errors(max_length, truncate):
    with pytest.raises(ValueError, match="max_length"):
        TensorCollate(["tokens"], max_length=max_length, truncate=truncate)


def test_load_columns_cuts_rows_in_its_workers(tmp_path):
    client = SyvainTrainingData()
    saver = client.dataset_saver(f"file://{tmp_path}/m.json", data_format="msgpack.zstf")
    saver.save("train", None, records(), shard_id="a")
    saver.commit_manifest()
    manifest_uri = f"file://{tmp_path}/m.json"
    loader = client.split_data_loader(
        manifest_uri, None, {"batch_size": 8, "num_workers": 2, "multiprocessing_context": "fork"}
    )
    batches = list(loader.load("train", columns=["tokens", "i"], max_length=4, truncate=True))
    assert sum(len(b["i"]) for b in batches) == 32
    assert max(b["tokens"].shape[1] for b in batches) == 4
    with pytest.raises(ValueError, match="max_length"):
        list(loader.load("train", columns=["tokens"], max_length=4))
    with pytest.raises(ValueError, match="columns"):
        loader.load("train", max_length=4)

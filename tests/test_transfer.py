"""loading/transfer.py: small tensors a worker sends travel by value and come back whole."""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data.loading import transfer  # noqa: E402


def through_pipe(value: object) -> object:
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return pickle.loads(buffer.getvalue())


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(16 * 8, dtype=torch.int64).view(16, 8),
        torch.tensor([True, False, True]),
        torch.linspace(0, 1, 7, dtype=torch.float32),
        torch.empty((3, 0), dtype=torch.int64),
        torch.arange(12, dtype=torch.int32).view(3, 4).t(),  # not contiguous
    ],
)
def test_small_tensors_come_back_equal_and_writable(tensor):
    got = through_pipe(transfer._wrap({"a": tensor, "n": [tensor, 3], "s": "text"}))
    for value in (got["a"], got["n"][0]):
        assert isinstance(value, torch.Tensor)
        assert value.dtype == tensor.dtype and value.shape == tensor.shape
        assert torch.equal(value, tensor)
        if value.numel():
            value.view(-1)[0] = value.view(-1)[1]  # its own, writable memory
    assert got["n"][1] == 3 and got["s"] == "text"


def test_large_tensors_are_left_to_torch():
    large = torch.zeros(transfer.BY_VALUE_BYTES // 8 + 1, dtype=torch.int64)
    assert transfer._wrap(large) is large
    small = torch.zeros(transfer.BY_VALUE_BYTES // 8, dtype=torch.int64)
    assert isinstance(transfer._wrap(small), transfer._ByValue)


def test_the_main_process_keeps_its_batches_as_they_are():
    batch = {"tokens": torch.ones(2, 2)}
    assert transfer.for_transfer(batch) is batch

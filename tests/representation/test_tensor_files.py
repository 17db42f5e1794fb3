"""The safetensors files (``representation/tensor_files.py``): tensor names, dtypes and shapes
of the prepared and the representation files, the shapes the artifact manifest declares, and
finite projections.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from representation_helpers import broken, first_relation_rows, first_selected

pytestmark = pytest.mark.timeout(300)


#: The first selected block's task attribute holding each file's tensors.
PREPARED, PROJECTION = "prepared_tensors", "representation_tensors"
Tensors = dict[str, np.ndarray]


def _retype(name: str, dtype: type) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.update({name: tensors[name].astype(dtype)})


def _narrow(name: str, width: int) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.update({name: np.ascontiguousarray(tensors[name][:, :width])})


def _shift_offset(tensors: Tensors) -> None:
    offsets = tensors["projection_offset"]
    offsets[1] = (offsets[1] + 1) % 64


def _repeat_first_row(tensors: Tensors) -> None:
    tensors["projection"] = np.concatenate([tensors["projection"], tensors["projection"][:1]])


@pytest.mark.parametrize(
    ("tensors", "change", "match"),
    [
        pytest.param(
            PREPARED,
            lambda t: t.update(extra=np.zeros(3, np.int8)),
            "tensors must be exactly",
            id="prepared-extra",
        ),
        pytest.param(
            PREPARED, lambda t: t.pop("qkv_start"), "tensors must be exactly", id="prepared-missing"
        ),
        pytest.param(PREPARED, _retype("input_ids", np.int64), "I32", id="ids-dtype"),
        pytest.param(PREPARED, _narrow("input_ids", 1024), "I32", id="ids-shape"),
        pytest.param(PREPARED, _retype("projection_offset", np.int32), "I16", id="offset-dtype"),
        pytest.param(PREPARED, _shift_offset, "projection_offset\\[1\\]", id="offset-values"),
        pytest.param(
            PROJECTION,
            lambda t: t.update(norm=np.zeros(len(t["projection"]), np.float16)),
            "exactly projection",
            id="projection-extra",
        ),
        pytest.param(PROJECTION, _retype("projection", np.float32), "F16", id="projection-dtype"),
        pytest.param(PROJECTION, _narrow("projection", 128), "F16", id="projection-width"),
        pytest.param(PROJECTION, _repeat_first_row, "rows", id="projection-rows"),
    ],
)
def test_tensor_file_rules(builder, config, tensors, change, match):
    change(getattr(first_selected(builder)[0], tensors))
    broken(builder, config, match)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_projections_must_be_finite(builder, config, value):
    row = first_relation_rows(builder)[9]["projection_row"]
    first_selected(builder)[0].representation_tensors["projection"][row, 17] = value
    broken(builder, config, "not finite")


def test_declared_shapes_must_be_the_files(builder, config):
    def hook(objects: dict[str, bytes]) -> None:
        # Same claims, other bytes: a file whose header disagrees with the inventory.
        task, _ = first_selected(builder)
        from safetensors.numpy import save

        tensors = dict(task.prepared_tensors)
        tensors["qkv_start"] = np.zeros(len(tensors["qkv_start"]) + 1, np.int32)
        objects[task.prepared_uri] = save(tensors)

    broken(builder, config, "qkv_start has shape", objects_hook=hook)


def test_unreadable_safetensors(builder, config):
    task, _ = first_selected(builder)
    broken(
        builder,
        config,
        "unreadable safetensors",
        objects_hook=lambda objects: objects.update({task.representation_uri: b"\xff" * 64}),
    )

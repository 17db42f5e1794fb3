"""The safetensors files (``representation/tensor_files.py``): tensor names, dtypes and shapes
of the prepared and the representation files, the shapes the artifact manifest declares, and
finite projections.
"""

from __future__ import annotations

import numpy as np
import pytest

from representation_fixture import PublicationBuilder
from representation_helpers import broken, first_relation_rows, first_selected

pytestmark = pytest.mark.timeout(300)


def _prepared_tensors(builder: PublicationBuilder) -> dict[str, np.ndarray]:
    return first_selected(builder)[0].prepared_tensors


def _projection(builder: PublicationBuilder) -> dict[str, np.ndarray]:
    return first_selected(builder)[0].representation_tensors


@pytest.mark.parametrize(
    ("tensors", "change", "match"),
    [
        pytest.param(
            _prepared_tensors,
            lambda t: t.update(extra=np.zeros(3, np.int8)),
            "tensors must be exactly",
            id="prepared-extra",
        ),
        pytest.param(
            _prepared_tensors,
            lambda t: t.pop("qkv_start"),
            "tensors must be exactly",
            id="prepared-missing",
        ),
        pytest.param(
            _prepared_tensors,
            lambda t: t.update(input_ids=t["input_ids"].astype(np.int64)),
            "I32",
            id="ids-dtype",
        ),
        pytest.param(
            _prepared_tensors,
            lambda t: t.update(input_ids=np.ascontiguousarray(t["input_ids"][:, :1024])),
            "I32",
            id="ids-shape",
        ),
        pytest.param(
            _prepared_tensors,
            lambda t: t.update(projection_offset=t["projection_offset"].astype(np.int32)),
            "I16",
            id="offset-dtype",
        ),
        pytest.param(
            _prepared_tensors,
            lambda t: t["projection_offset"].__setitem__(1, (t["projection_offset"][1] + 1) % 64),
            "projection_offset\\[1\\]",
            id="offset-values",
        ),
        pytest.param(
            _projection,
            lambda t: t.update(norm=np.zeros(len(t["projection"]), np.float16)),
            "exactly projection",
            id="projection-extra",
        ),
        pytest.param(
            _projection,
            lambda t: t.update(projection=t["projection"].astype(np.float32)),
            "F16",
            id="projection-dtype",
        ),
        pytest.param(
            _projection,
            lambda t: t.update(projection=np.ascontiguousarray(t["projection"][:, :128])),
            "F16",
            id="projection-width",
        ),
        pytest.param(
            _projection,
            lambda t: t.update(projection=np.concatenate([t["projection"], t["projection"][:1]])),
            "rows",
            id="projection-rows",
        ),
    ],
)
def test_tensor_file_rules(builder, config, tensors, change, match):
    change(tensors(builder))
    broken(builder, config, match)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_projections_must_be_finite(builder, config, value):
    row = first_relation_rows(builder)[9]["projection_row"]
    _projection(builder)["projection"][row, 17] = value
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

"""The loader and its examples (``representation/examples.py``): a whole publication read
back through ``iter_representation_examples`` and the client method, the examples' tensors,
downloads, early closes and network faults, and the arguments checked at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from fault_proxy import reset_after
from representation_helpers import FAKE_URI, REQUEST, assert_examples, load
from seaweed import config_for
from syvain_training_data import SyvainTrainingData, _native
from syvain_training_data.representation import iter_representation_examples
from syvain_training_data.testing import storage_policy

pytestmark = pytest.mark.timeout(300)


# --------------------------------------------------------------------------------------------
# The whole publication, read back
# --------------------------------------------------------------------------------------------


def test_loader_returns_the_builders_tensors_in_order(builder, config):
    published = builder.publish(config)
    examples = load(published, config)
    assert_examples(examples, builder)
    # The selection spans both tasks of each source and the yield order is the caller's.
    assert [e.source for e in examples] == ["dolmino"] * 4 + ["common_pile"] * 4
    assert sorted(e.block_id for e in examples[:4]) == [e.block_id for e in examples[:4]]
    assert len({task.name for task, _ in builder.candidates("analysis", "dolmino")[:4]}) == 2


@pytest.mark.parametrize(
    ("split", "sources", "count", "layer", "kind"),
    [
        ("basis_fit", ["common_pile"], 4, 0, "residual_pre"),
        ("validation", ["dolmino", "common_pile"], 1, 7, "post_mlp"),
        ("analysis", ["common_pile", "dolmino"], 6, 0, "post_attention"),
    ],
)
def test_every_split_layer_and_state_kind(builder, config, split, sources, count, layer, kind):
    published = builder.publish(config)
    request = {
        "split": split,
        "sources": sources,
        "per_source_count": count,
        "teacher_layer": layer,
        "state_kind": kind,
    }
    assert_examples(load(published, config, **request), builder, **request)


def test_client_method(builder, config, seaweed):
    published = builder.publish(config)
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    examples = list(
        client.iter_representation_examples(
            published.manifest_uri, published.manifest_sha256, **REQUEST
        )
    )
    assert_examples(examples, builder)


def test_examples_own_their_tensors_and_no_file_stays(builder, config, temp_dir):
    published = builder.publish(config)
    generator = iter_representation_examples(
        published.manifest_uri, published.manifest_sha256, storage_config=config, **REQUEST
    )
    first = next(generator)
    assert os.listdir(temp_dir) == []  # the workspace is gone while examples are alive
    rest = list(generator)
    for example in [first, *rest]:
        for tensor in (
            example.input_ids,
            example.relation_positions,
            example.teacher_final_state_projections,
        ):
            assert tensor.is_contiguous()
            assert tensor.storage_offset() == 0
            # The storage holds exactly this tensor: not a view of a window, file or artifact.
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
            assert tensor.untyped_storage().filename is None
        example.input_ids[0] = -1  # writable, and no one else sees it
    assert "block_id=" in repr(first) and "float16 [32, 256]" in repr(first)


def test_each_needed_artifact_is_downloaded_once(builder, config, monkeypatch):
    published = builder.publish(config)
    downloaded: list[str] = []
    original = _native.download_object

    def counting(storage_: Any, uri: str, *args: Any, **kwargs: Any) -> tuple[int, str]:
        downloaded.append(uri)
        return original(storage_, uri, *args, **kwargs)

    monkeypatch.setattr(_native, "download_object", counting)
    load(published, config)
    assert len(downloaded) == len(set(downloaded))
    selected_tasks = {
        task.name
        for source in REQUEST["sources"]
        for task, _ in builder.candidates("analysis", source)[:4]
    }
    requested = [
        task
        for task in builder.tasks
        if task.split == "analysis" and task.source in REQUEST["sources"]
    ]
    expected = {published.manifest_uri, f"{published.prefix}artifact-manifest-v2.json"}
    for task in requested:
        expected.add(task.prepared_uri.replace(".safetensors", ".parquet"))
        if task.name in selected_tasks:
            expected.add(task.prepared_uri)
            expected.add(task.representation_uri)
            expected.add(task.representation_uri.replace(".safetensors", ".parquet"))
    assert set(downloaded) == expected


def test_early_close_and_unstarted_generators_leave_nothing(builder, config, temp_dir):
    published = builder.publish(config)
    generator = iter_representation_examples(
        published.manifest_uri, published.manifest_sha256, storage_config=config, **REQUEST
    )
    next(generator)
    generator.close()
    assert os.listdir(temp_dir) == []
    unstarted = iter_representation_examples(
        published.manifest_uri, published.manifest_sha256, storage_config=config, **REQUEST
    )
    unstarted.close()
    del unstarted
    assert os.listdir(temp_dir) == []


def test_loader_resumes_through_network_faults(builder, config, seaweed, fault_proxy):
    published = builder.publish(config)
    through_proxy = config_for(seaweed, fault_proxy.endpoint)
    fault_proxy.script(
        # A FIFO queue: the artifact manifest is read before the representation files.
        reset_after(10, method="GET", target="artifact-manifest"),
        reset_after(100_000, method="GET", target="representations.safetensors"),
    )
    with storage_policy(backoff_base_s=0.01, backoff_cap_s=0.05):
        examples = load(published, through_proxy)
    assert_examples(examples, builder)
    assert fault_proxy.faults_applied == 2


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"manifest_uri": FAKE_URI.replace("syvain-data", "other-bucket")}, ValueError),
        ({"manifest_uri": FAKE_URI.replace("ab" * 32, "AB" * 32)}, ValueError),
        ({"manifest_uri": FAKE_URI.replace("publication-v2", "publication-v1")}, ValueError),
        ({"manifest_uri": FAKE_URI + ".bak"}, ValueError),
        ({"manifest_uri": 7}, TypeError),
        ({"manifest_sha256": "AB" * 32}, ValueError),
        ({"manifest_sha256": "ab" * 31}, ValueError),
        ({"manifest_sha256": None}, TypeError),
        ({"split": "train"}, ValueError),
        ({"split": None}, TypeError),
        ({"sources": []}, ValueError),
        ({"sources": ["dolmino", "dolmino"]}, ValueError),
        ({"sources": ["wikipedia"]}, ValueError),
        ({"sources": "dolmino"}, TypeError),
        ({"sources": {"dolmino"}}, TypeError),
        ({"sources": [1]}, TypeError),
        ({"per_source_count": 0}, ValueError),
        ({"per_source_count": -2}, ValueError),
        ({"per_source_count": True}, TypeError),
        ({"per_source_count": 2.0}, TypeError),
        ({"per_source_count": "2"}, TypeError),
        ({"teacher_layer": 1}, ValueError),
        ({"teacher_layer": 32}, ValueError),
        ({"teacher_layer": True}, TypeError),
        ({"teacher_layer": 3.0}, TypeError),
        ({"state_kind": "post_ffn"}, ValueError),
        ({"state_kind": None}, TypeError),
    ],
)
def test_argument_validation_is_immediate(overrides, error):
    arguments = {"manifest_uri": FAKE_URI, "manifest_sha256": "ab" * 32, **REQUEST, **overrides}
    manifest_uri = arguments.pop("manifest_uri")
    manifest_sha256 = arguments.pop("manifest_sha256")
    with pytest.raises(error):
        iter_representation_examples(manifest_uri, manifest_sha256, **arguments)


def test_without_the_extra_the_error_names_it():
    code = (
        "import sys\n"
        "sys.modules['safetensors'] = None\n"
        "import syvain_training_data as package\n"
        "assert issubclass(package.RepresentationIntegrityError, RuntimeError)\n"
        "for heavy in ('numpy', 'torch', 'pyarrow', 'safetensors'):\n"
        "    assert sys.modules.get(heavy) is None, heavy\n"
        "for attempt in (lambda: package.RepresentationExample,\n"
        "                lambda: package.SyvainTrainingData().iter_representation_examples(\n"
        "                    'x', 'y', split='analysis', sources=['dolmino'],\n"
        "                    per_source_count=1, teacher_layer=3, state_kind='post_mlp')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except ModuleNotFoundError as error:\n"
        "        print(error)\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "'representation' extra" in line
        assert "pip install 'syvain-training-data[representation]'" in line

"""The OLMo 3 representation publication, read with full custody checks (SPEC section 7).

Needs the ``representation`` extra (numpy, pyarrow, safetensors, torch):
``pip install 'syvain-training-data[representation]'``. Without it, importing this package
raises ModuleNotFoundError naming the extra and the install command.

Modules, in the order the loader uses them: :mod:`.custody` (HEAD, streamed size and SHA-256,
temporary files), :mod:`.layout` (canonical URI, splits, sources, roles), :mod:`.index` (data
manifest and index shards), :mod:`.artifact_manifest` (the inventory), :mod:`.publication`
(the chain checked into a Publication), :mod:`.blocks` (metadata tables, selection),
:mod:`.relations` (each selected block's representation rows), :mod:`.tensor_files` (input_ids
and projections), :mod:`.examples` (the loader and :class:`RepresentationExample`).
"""

from __future__ import annotations

import importlib

from syvain_training_data.extras import missing_extra

for _module in ("numpy", "pyarrow", "safetensors", "torch"):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as _error:
        raise missing_extra(
            f"The OLMo 3 representation loader needs {_module}", "representation", _error
        ) from _error

from syvain_training_data.errors import RepresentationIntegrityError  # noqa: E402
from syvain_training_data.representation.examples import (  # noqa: E402
    RepresentationExample,
    iter_representation_examples,
)

__all__ = ["RepresentationExample", "RepresentationIntegrityError", "iter_representation_examples"]

"""Publishing datasets (SPEC section 5): one module per job.

- :mod:`.layout`: where shards, descriptors and session records go;
- :mod:`.descriptor`: completion descriptors, their bytes and their checks;
- :mod:`.spool`: encoding a shard into memory or a temporary file, hashed once; size rules;
- :mod:`.upload`: uploading a spool with its format's attributes; ``copy_shard``;
- :mod:`.recovery`: checking the shards a saver finds in the store, and the store scan;
- :mod:`.builder`: the manifest from the shards a saver knows;
- :mod:`.saver`: :class:`DatasetSaver`, which ties them together.
"""

from syvain_training_data.publish.descriptor import DESCRIPTOR_SCHEMA, descriptor_bytes
from syvain_training_data.publish.layout import encode_segment
from syvain_training_data.publish.saver import DatasetSaver
from syvain_training_data.publish.spool import size_limits
from syvain_training_data.publish.upload import copy_shard

__all__ = [
    "DESCRIPTOR_SCHEMA",
    "DatasetSaver",
    "copy_shard",
    "descriptor_bytes",
    "encode_segment",
    "size_limits",
]

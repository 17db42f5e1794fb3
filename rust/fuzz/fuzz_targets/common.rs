//! Shared by the targets: the input's first byte picks how the shard is cut into chunks (as a
//! network stream would deliver it), the second the declared record count.

use bytes::Bytes;
use syvain_core::source::MemorySource;

/// `(source, declared)`, or `None` for an input too short to hold the two bytes.
pub fn split(data: &[u8]) -> Option<(MemorySource, u64)> {
    let (&chunking, rest) = data.split_first()?;
    let (&declared, shard) = rest.split_first()?;
    let chunk = match chunking {
        0 => shard.len().max(1),
        n => usize::from(n),
    };
    let chunks: Vec<Bytes> = shard.chunks(chunk).map(Bytes::copy_from_slice).collect();
    Some((MemorySource::new(chunks), u64::from(declared)))
}

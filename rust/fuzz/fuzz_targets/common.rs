//! Shared by the targets: the input's first byte picks how the shard is cut into chunks (as a
//! network stream would deliver it), the second the declared record count.

use _native::source::MemorySource;
use bytes::Bytes;

pub struct Input {
    pub source: MemorySource,
    pub declared: u64,
}

pub fn split(data: &[u8]) -> Option<Input> {
    let (&chunking, rest) = data.split_first()?;
    let (&declared, shard) = rest.split_first()?;
    let chunk = match chunking {
        0 => shard.len().max(1),
        n => usize::from(n),
    };
    let chunks: Vec<Bytes> = shard.chunks(chunk).map(Bytes::copy_from_slice).collect();
    Some(Input {
        source: MemorySource::new(chunks),
        declared: u64::from(declared),
    })
}

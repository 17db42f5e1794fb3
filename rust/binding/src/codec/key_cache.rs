//! Reuses the Python `str` objects of recurring map keys: records of one shard share their
//! keys, and a reused key also keeps its cached hash for the dict insert.

use pyo3::prelude::*;
use pyo3::types::PyString;

const SLOTS: usize = 1024;
/// Longer keys are rare and cheap to compare badly; they are not cached.
const MAX_KEY_BYTES: usize = 64;

pub struct KeyCache {
    slots: Vec<Option<(Box<str>, Py<PyString>)>>,
}

impl Default for KeyCache {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| None).collect(),
        }
    }
}

impl KeyCache {
    pub fn get<'py>(&mut self, py: Python<'py>, key: &str) -> Bound<'py, PyString> {
        if key.len() > MAX_KEY_BYTES {
            return PyString::new(py, key);
        }
        let slot = &mut self.slots[fnv1a(key.as_bytes()) % SLOTS];
        if let Some((cached, value)) = slot {
            if **cached == *key {
                return value.bind(py).clone();
            }
        }
        let value = PyString::new(py, key);
        *slot = Some((key.into(), value.clone().unbind()));
        value
    }
}

fn fnv1a(bytes: &[u8]) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash as usize
}

//! Shared by the core's integration tests: a scratch directory and a local-store client.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use syvain_core::object_stores::StorageConfig;
use syvain_core::storage::Storage;

/// A directory removed with everything in it when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "syvain-core-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The file:// URI of `name` inside the directory.
    pub fn uri(&self, name: &str) -> String {
        format!("file://{}", self.path(name).display())
    }

    pub fn root(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A client with no S3 endpoint: file:// URIs only.
pub fn local_storage() -> Storage {
    Storage::new(StorageConfig {
        s3_base_url: None,
        region: "us-east-1".into(),
        ..Default::default()
    })
    .expect("local storage")
}

/// Deterministic bytes that do not repeat with a short period.
pub fn sample_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

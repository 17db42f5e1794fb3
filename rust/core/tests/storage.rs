//! The storage paths of the core against the local directory store, with no Python: point
//! operations, the resumable stream, uploads and downloads.

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use object_store::PutPayload;
use sha2::{Digest, Sha256};
use syvain_core::caller::{next_chunk, Uninterrupted};
use syvain_core::download::download_to_file;
use syvain_core::error::NativeError;
use syvain_core::source::ByteSource;
use syvain_core::upload::{self, PutLimits, WriteOptions};

use common::{local_storage, sample_bytes, Scratch};

fn create_only() -> WriteOptions {
    WriteOptions {
        create_only: true,
        ..WriteOptions::default()
    }
}

#[test]
fn put_get_head_list_delete_round_trip() {
    let dir = Scratch::new();
    let storage = local_storage();
    let data = sample_bytes(10_000);
    let uri = dir.uri("a/b/object.bin");
    let payload = PutPayload::from(Bytes::from(data.clone()));
    let (size, etag) = upload::put(&Uninterrupted, &storage, &uri, payload, create_only()).unwrap();
    assert_eq!(size, 10_000);
    assert!(!etag.is_empty());
    assert_eq!(storage.get(&Uninterrupted, &uri).unwrap(), data);
    assert_eq!(
        storage.head(&Uninterrupted, &uri).unwrap(),
        (10_000, etag.clone())
    );
    assert!(storage.exists(&Uninterrupted, &uri).unwrap());
    let listed = storage.list(&Uninterrupted, &dir.uri("a")).unwrap();
    assert_eq!(listed, vec![(uri.clone(), 10_000, etag)]);
    storage.delete(&Uninterrupted, &uri).unwrap();
    storage.delete(&Uninterrupted, &uri).unwrap(); // already gone: no error
    assert!(!storage.exists(&Uninterrupted, &uri).unwrap());
    assert!(matches!(
        storage.get(&Uninterrupted, &uri),
        Err(NativeError::NotFound { .. })
    ));
}

#[test]
fn create_only_refuses_an_existing_object_and_overwrite_replaces_it() {
    let dir = Scratch::new();
    let storage = local_storage();
    let uri = dir.uri("object.bin");
    let put = |bytes: &'static [u8], options| {
        let payload = PutPayload::from(Bytes::from_static(bytes));
        upload::put(&Uninterrupted, &storage, &uri, payload, options)
    };
    put(b"first", create_only()).unwrap();
    assert!(matches!(
        put(b"second", create_only()),
        Err(NativeError::AlreadyExists { .. })
    ));
    put(b"third", WriteOptions::default()).unwrap();
    assert_eq!(storage.get(&Uninterrupted, &uri).unwrap(), &b"third"[..]);
}

#[test]
fn put_file_links_a_local_copy_and_leaves_no_staged_file() {
    let dir = Scratch::new();
    let storage = local_storage();
    let source = dir.path("spool.bin");
    let data = sample_bytes(300_000);
    std::fs::write(&source, &data).unwrap();
    let uri = dir.uri("out/shard.bin");
    let limits = PutLimits::default();
    let put = || {
        upload::put_file(
            &Uninterrupted,
            &storage,
            &uri,
            &source,
            create_only(),
            limits,
        )
    };
    let (size, _) = put().unwrap();
    assert_eq!(size, 300_000);
    assert_eq!(std::fs::read(dir.path("out/shard.bin")).unwrap(), data);
    assert!(matches!(put(), Err(NativeError::AlreadyExists { .. })));
    let names: Vec<_> = std::fs::read_dir(dir.path("out"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("shard.bin")]);
}

#[test]
fn put_file_refuses_a_directory_as_its_source() {
    let dir = Scratch::new();
    let storage = local_storage();
    let result = upload::put_file(
        &Uninterrupted,
        &storage,
        &dir.uri("x"),
        dir.root(),
        WriteOptions::default(),
        PutLimits::default(),
    );
    match result {
        Err(NativeError::Io { reason, .. }) => assert!(reason.contains("a directory"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_stream_hands_over_every_byte_from_any_start() {
    let (_dir, data, uri) = local_object("big.bin", 3 << 20);
    let storage = local_storage();
    for start in [0usize, 1, 65_536, (3 << 20) - 1, 3 << 20] {
        let mut reader = storage
            .stream(&uri, data.len() as u64, None, start as u64, None)
            .unwrap();
        let mut received = Vec::new();
        while let Some(chunk) = next_chunk(&Uninterrupted, &mut reader).unwrap() {
            received.extend_from_slice(&chunk);
        }
        assert_eq!(received, &data[start..], "start {start}");
        assert_eq!(reader.position(), data.len() as u64);
    }
}

#[test]
fn the_stream_fails_closed_on_a_wrong_size_or_a_missing_object() {
    let dir = Scratch::new();
    let storage = local_storage();
    std::fs::write(dir.path("small.bin"), sample_bytes(1000)).unwrap();
    let uri = dir.uri("small.bin");
    let drain = |declared: u64| -> Result<u64, NativeError> {
        let mut reader = storage.stream(&uri, declared, None, 0, None)?;
        let mut total = 0;
        while let Some(chunk) = next_chunk(&Uninterrupted, &mut reader)? {
            total += chunk.len() as u64;
        }
        Ok(total)
    };
    assert_eq!(drain(1000).unwrap(), 1000);
    for declared in [999, 1001] {
        match drain(declared) {
            Err(NativeError::InvalidData { uri: named, .. }) => assert_eq!(named, uri),
            other => panic!("declared {declared}: {other:?}"),
        }
    }
    let missing = dir.uri("missing.bin");
    let opened = storage.stream(&missing, 10, None, 0, None);
    let failed = opened.and_then(|mut reader| next_chunk(&Uninterrupted, &mut reader));
    assert!(
        matches!(failed, Err(NativeError::NotFound { .. })),
        "{failed:?}"
    );
    assert!(matches!(
        storage.stream(&uri, 1000, None, 1001, None),
        Err(NativeError::Config(_))
    ));
}

#[test]
fn a_download_writes_and_hashes_every_byte() {
    let (dir, data, uri) = local_object("object.bin", 2_500_000);
    let storage = local_storage();
    let target = dir.path("copy.bin");
    let download = || {
        let size = data.len() as u64;
        download_to_file(&Uninterrupted, &storage, &uri, &target, size, None, || {
            Ok(false)
        })
    };
    let (size, digest) = download().unwrap();
    assert_eq!(size, data.len() as u64);
    assert_eq!(digest, hex::encode(Sha256::digest(&data)));
    assert_eq!(std::fs::read(&target).unwrap(), data);
    // The target is never replaced.
    let again = download();
    assert!(matches!(again, Err(NativeError::Io { .. })), "{again:?}");
}

#[test]
fn a_cancelled_or_failed_download_leaves_no_file() {
    let dir = Scratch::new();
    let storage = local_storage();
    std::fs::write(dir.path("object.bin"), sample_bytes(1000)).unwrap();
    let target = dir.path("copy.bin");
    let uri = dir.uri("object.bin");
    let cancelled = download_to_file(&Uninterrupted, &storage, &uri, &target, 1000, None, || {
        Ok(true)
    });
    assert!(
        matches!(cancelled, Err(NativeError::Cancelled(_))),
        "{cancelled:?}"
    );
    assert!(!target.exists());
    let short = download_to_file(&Uninterrupted, &storage, &uri, &target, 2000, None, || {
        Ok(false)
    });
    assert!(short.is_err());
    assert!(!target.exists());
}

#[test]
fn local_objects_keep_no_attributes() {
    let dir = Scratch::new();
    let storage = local_storage();
    let uri = dir.uri("typed.json");
    let options = WriteOptions {
        content_type: Some("application/json".into()),
        metadata: HashMap::from([("k".to_string(), "v".to_string())]),
        create_only: false,
    };
    let payload = PutPayload::from(Bytes::from_static(b"{}"));
    upload::put(&Uninterrupted, &storage, &uri, payload, options).unwrap();
    assert_eq!(std::fs::read(dir.path("typed.json")).unwrap(), b"{}");
}

/// Every byte a shard source hands over, or its error.
/// A scratch directory holding `name` with `len` sample bytes: (directory, bytes, URI).
fn local_object(name: &str, len: usize) -> (Scratch, Vec<u8>, String) {
    let dir = Scratch::new();
    let data = sample_bytes(len);
    std::fs::write(dir.path(name), &data).unwrap();
    let uri = dir.uri(name);
    (dir, data, uri)
}

fn drain_source(mut source: Box<dyn ByteSource>) -> Result<Vec<u8>, NativeError> {
    let mut received = Vec::new();
    while let Some(chunk) = source.next_chunk()? {
        received.extend_from_slice(&chunk);
    }
    Ok(received)
}

#[test]
fn a_local_shard_source_reads_every_byte_and_checks_the_size() {
    let (_dir, data, uri) = local_object("shard.bin", 5 << 20);
    let storage = local_storage();
    let mut source = storage
        .shard_source(&uri, data.len() as u64, None, "msgpack.zstf")
        .unwrap();
    let sizes: Vec<usize> = std::iter::from_fn(|| source.next_chunk().unwrap())
        .map(|chunk| chunk.len())
        .collect();
    // The first piece is read by the decoder itself, the rest streamed in growing pieces.
    assert_eq!(sizes[0], 64 << 10);
    assert_eq!(sizes.iter().sum::<usize>(), data.len());
    let all = storage.shard_source(&uri, data.len() as u64, None, "msgpack.zstf");
    assert_eq!(drain_source(all.unwrap()).unwrap(), data);

    let wrong = storage.shard_source(&uri, 10, None, "jsonl.gz").unwrap();
    match drain_source(wrong) {
        Err(NativeError::Shard { format, reason, .. }) => {
            assert_eq!(format, "jsonl.gz");
            assert_eq!(
                reason,
                format!(
                    "size mismatch: the object has {} bytes but size_bytes is 10",
                    5 << 20
                )
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_local_shard_or_a_directory_is_a_missing_object() {
    let dir = Scratch::new();
    let storage = local_storage();
    std::fs::create_dir(dir.path("folder")).unwrap();
    for name in ["missing.bin", "folder"] {
        let uri = dir.uri(name);
        let source = storage
            .shard_source(&uri, 10, None, "msgpack.zstf")
            .unwrap();
        match drain_source(source) {
            Err(NativeError::NotFound { uri: named }) => assert_eq!(named, uri),
            other => panic!("{name}: {other:?}"),
        }
    }
}

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use super::*;
use crate::object_stores::StorageConfig;

const ROWS: usize = 20_000;

/// A file of ROWS rows (id, text) in row groups of `group_rows`, pages of 500 rows, with or
/// without the offset index, dictionary-encoded when `name` says so; returns its path and size.
fn write_file(name: &str, group_rows: usize, page_index: bool) -> (std::path::PathBuf, u64) {
    let path = std::env::temp_dir().join(format!("syvain-parquet-{}-{name}", std::process::id()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", DataType::Utf8, true),
    ]));
    let props = WriterProperties::builder()
        .set_max_row_group_size(group_rows)
        .set_data_page_row_count_limit(500)
        .set_write_batch_size(500)
        .set_dictionary_enabled(name.contains("dictionary"))
        .set_offset_index_disabled(!page_index)
        .build();
    let file = File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
    for first in (0..ROWS).step_by(1000) {
        let ids = Int64Array::from_iter_values((first as i64)..(first as i64 + 1000));
        let texts = StringArray::from_iter_values(
            (first..first + 1000).map(|i| format!("record {i} {}", "x".repeat(i % 97))),
        );
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(texts)]).unwrap();
        writer.write(&batch).unwrap();
    }
    writer.close().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    (path, size)
}

fn request(path: &std::path::Path, size: u64, start: u64, stop: Option<u64>) -> ParquetRequest {
    ParquetRequest {
        uri: format!("file://{}", path.display()),
        size,
        etag: None,
        start,
        stop,
        columns: None,
        batch_rows: Some(777),
        max_batch_values: 1 << 23,
    }
}

/// The ids and texts a read yields, and the bytes it fetched.
fn read(request: ParquetRequest) -> (Vec<i64>, Vec<String>, u64) {
    let storage = Storage::new(StorageConfig::default()).unwrap();
    let mut batches = ParquetBatches::open(&storage, request).unwrap();
    let (mut ids, mut texts) = (Vec::new(), Vec::new());
    while let Some(batch) = batches.next_batch().unwrap() {
        assert!(batch.num_rows() <= 777);
        if let Some(column) = batch.column_by_name("id") {
            ids.extend(column.as_primitive::<Int64Type>().values().iter().copied());
        }
        if let Some(column) = batch.column_by_name("text") {
            if let DataType::Dictionary(_, _) = column.data_type() {
                // Read as a dictionary only where the file dictionary-encodes it.
                let dictionary = column.as_dictionary::<arrow_array::types::Int32Type>();
                let values = dictionary.values().as_string::<i32>();
                for key in dictionary.keys().iter() {
                    texts.push(values.value(key.unwrap() as usize).to_string());
                }
            } else {
                texts.extend(
                    column
                        .as_string::<i32>()
                        .iter()
                        .map(|t| t.unwrap().to_string()),
                );
            }
        }
    }
    (ids, texts, batches.fetched().1)
}

#[test]
fn every_range_yields_exactly_its_rows() {
    for (name, group_rows, page_index) in [
        ("paged", 8_000, true),
        ("unpaged", 8_000, false),
        ("one-group", ROWS, true),
    ] {
        let (path, size) = write_file(name, group_rows, page_index);
        for (start, stop) in [
            (0, Some(ROWS)),
            (0, None),
            (1, Some(2)),
            (7_999, Some(8_001)),
            (12_345, Some(19_999)),
            (19_999, None),
            (5_000, Some(5_000)),
        ] {
            let (ids, texts, _) = read(request(&path, size, start as u64, stop.map(|s| s as u64)));
            let end = stop.unwrap_or(ROWS);
            let want: Vec<i64> = (start as i64..end as i64).collect();
            assert_eq!(ids, want, "{name} [{start}, {stop:?})");
            assert_eq!(texts.len(), want.len());
            for (i, text) in want.iter().zip(&texts) {
                assert!(text.starts_with(&format!("record {i} ")), "{name}: {text}");
            }
        }
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn a_slice_of_a_row_group_fetches_about_its_pages() {
    let (path, size) = write_file("slice", ROWS, true);
    let (_, _, whole) = read(request(&path, size, 0, Some(ROWS as u64)));
    let (ids, _, slice) = read(request(&path, size, 10_000, Some(11_000)));
    assert_eq!(ids.len(), 1000);
    // 1/20 of the rows: their pages (and a page on each side at most), plus the footer.
    assert!(slice * 6 < whole, "slice fetched {slice} of {whole} bytes");
    let (_, _, unpaged_whole) = {
        let (path, size) = write_file("slice-unpaged", ROWS, false);
        let out = read(request(&path, size, 10_000, Some(11_000)));
        std::fs::remove_file(path).unwrap();
        out
    };
    assert!(
        unpaged_whole > whole / 2,
        "without a page index the column chunks are read"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn selected_columns_only_are_decoded_and_fetched() {
    let (path, size) = write_file("columns", 8_000, true);
    let mut wanted = request(&path, size, 0, None);
    wanted.columns = Some(vec!["id".to_string(), "missing".to_string()]);
    let (ids, texts, fetched) = read(wanted);
    assert_eq!(ids.len(), ROWS);
    assert!(texts.is_empty());
    let (_, _, all) = read(request(&path, size, 0, None));
    assert!(
        fetched * 2 < all,
        "ids only fetched {fetched} of {all} bytes"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn hostile_bytes_fail_with_the_shard_named() {
    let (path, size) = write_file("hostile", 8_000, true);
    let good = std::fs::read(&path).unwrap();
    let storage = Storage::new(StorageConfig::default()).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..300 {
        let mut bytes = good.clone();
        for _ in 0..1 + round % 4 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (state >> 33) as usize % bytes.len();
            bytes[at] ^= 1 << (state % 8);
        }
        std::fs::write(&path, &bytes).unwrap();
        let outcome = ParquetBatches::open(&storage, request(&path, size, 3_000, Some(17_000)))
            .and_then(|mut batches| {
                while batches.next_batch()?.is_some() {}
                Ok(())
            });
        if let Err(error) = outcome {
            let message = error.to_string();
            assert!(
                message.contains("Unreadable parquet shard file://"),
                "{message}"
            );
        }
    }
    std::fs::remove_file(path).unwrap();
}

/// Found by the `parquet_read` fuzz target: an embedded Arrow schema whose field has no name
/// (arrow-ipc panicked: `field.name().unwrap()`), and a footer declaring a list of about 10^8
/// row groups in a few bytes (arrow-rs reserved 17 GB for it). Each read fails with the shard
/// named, at once.
#[test]
fn fuzz_findings_are_shard_errors() {
    for input in [
        &include_bytes!("unnamed-arrow-field.fuzz")[..],
        &include_bytes!("huge-list.fuzz")[..],
        &include_bytes!("huge-column-list.fuzz")[..],
    ] {
        let request = ParquetRequest {
            uri: "memory://found.parquet".to_string(),
            size: 0,
            etag: None,
            start: u64::from(input[0]),
            stop: (input[1] != 255).then(|| u64::from(input[0]) + u64::from(input[1])),
            columns: (input[2] & 1 == 1).then(|| vec!["id".to_string(), "text".to_string()]),
            batch_rows: Some(1 + usize::from(input[2] >> 1)),
            max_batch_values: 1 << 16,
        };
        let outcome = ParquetBatches::from_bytes(Bytes::copy_from_slice(&input[3..]), request)
            .and_then(|mut batches| {
                while batches.next_batch()?.is_some() {}
                Ok(())
            });
        let message = outcome.expect_err("refused").to_string();
        let prefix = "Unreadable parquet shard memory://found.parquet: ";
        assert!(message.starts_with(prefix), "{message}");
    }
}

#[test]
fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let path = std::env::temp_dir().join(format!("syvain-parquet-fifo-{}", std::process::id()));
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let storage = Storage::new(StorageConfig::default()).unwrap();
    let outcome = ParquetBatches::open(&storage, request(&path, 100, 0, None));
    std::fs::remove_file(&path).unwrap();
    let message = outcome.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("not a regular file (a FIFO)"), "{message}");
}

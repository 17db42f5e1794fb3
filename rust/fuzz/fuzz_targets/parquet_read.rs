//! Parquet read in place (`codec::parquet_read`) over arbitrary bytes: the footer, its page
//! index and the pages of a row range, decoded with a dictionary hint and a projection. No
//! input may panic past the reader (it turns arrow-rs's panics into errors, so libFuzzer's
//! abort-on-panic hook is replaced by a silent one: a panic the reader does not catch still
//! reaches libfuzzer-sys, which aborts), hang, or make it allocate beyond libFuzzer's limit.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use syvain_core::codec::parquet_read::{ParquetBatches, ParquetRequest};

static QUIET_PANICS: std::sync::Once = std::sync::Once::new();

fuzz_target!(|data: &[u8]| {
    QUIET_PANICS.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let Some((&[start, span, which], file)) = data.split_first_chunk::<3>() else {
        return;
    };
    let request = ParquetRequest {
        uri: "memory://fuzz.parquet".to_string(),
        size: 0,
        etag: None,
        start: u64::from(start),
        stop: (span != 255).then(|| u64::from(start) + u64::from(span)),
        columns: (which & 1 == 1).then(|| vec!["id".to_string(), "text".to_string()]),
        batch_rows: Some(1 + usize::from(which >> 1)),
        max_batch_values: 1 << 16,
    };
    let Ok(mut batches) = ParquetBatches::from_bytes(Bytes::copy_from_slice(file), request) else {
        return;
    };
    let mut rows = 0usize;
    while let Ok(Some(batch)) = batches.next_batch() {
        rows += batch.num_rows();
        if rows > 1 << 20 {
            return;
        }
    }
});

//! Raw deflate decoding through zlib's own API, for the two things flate2 does not expose:
//! entering a stream at a bit offset (`inflatePrime` plus `inflateSetDictionary`) and
//! stopping at every deflate block boundary (`Z_BLOCK`, with the bit position zlib reports in
//! `data_type`). Both are what an access point index of a gzip stream needs (zlib's zran.c).
//!
//! The one unsafe part of the codecs: a boxed `z_stream` (zlib keeps a pointer to it, so it
//! never moves) owned by [`RawInflate`], freed by `inflateEnd` on drop.

use std::alloc::{alloc, dealloc, Layout};
use std::ffi::{c_int, c_uint, c_void};
use std::ptr;

use libz_sys as z;

/// What one [`RawInflate::inflate`] call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub consumed: usize,
    pub produced: usize,
    /// The deflate stream's last block has ended.
    pub stream_end: bool,
    /// (`Z_BLOCK` only) the call stopped right after a block that is not the stream's last:
    /// a place the stream can be entered at.
    pub at_block_boundary: bool,
    /// Bits of the last byte consumed that belong to what follows (0..=7).
    pub unused_bits: u8,
}

/// A raw (headerless) deflate decoder.
pub struct RawInflate {
    stream: Box<z::z_stream>,
}

// SAFETY: the stream is only touched through `&mut self` (no `&self` method reads it), and
// zlib's state has no thread affinity.
unsafe impl Send for RawInflate {}
unsafe impl Sync for RawInflate {}

impl RawInflate {
    /// A decoder of a raw deflate stream with a 32 KiB window.
    pub fn new() -> Result<Self, String> {
        let mut stream = Box::new(z::z_stream {
            next_in: ptr::null_mut(),
            avail_in: 0,
            total_in: 0,
            next_out: ptr::null_mut(),
            avail_out: 0,
            total_out: 0,
            msg: ptr::null_mut(),
            state: ptr::null_mut(),
            zalloc,
            zfree,
            opaque: ptr::null_mut(),
            data_type: 0,
            adler: 0,
            reserved: 0,
        });
        // SAFETY: the stream is initialised above and boxed, so it never moves; the version
        // and size are the library's own.
        let ret = unsafe {
            z::inflateInit2_(
                &mut *stream,
                -15,
                z::zlibVersion(),
                std::mem::size_of::<z::z_stream>() as c_int,
            )
        };
        if ret != z::Z_OK {
            return Err(format!("cannot start a zlib inflater (zlib error {ret})"));
        }
        Ok(Self { stream })
    }

    /// Enters the stream `bits` bits (1..=7) before the next whole byte: the high `bits` bits
    /// of `byte` come first.
    pub fn prime(&mut self, bits: u8, byte: u8) -> Result<(), String> {
        if bits == 0 {
            return Ok(());
        }
        if bits > 7 {
            return Err(format!("{bits} bits cannot precede a byte"));
        }
        let value = c_int::from(byte >> (8 - bits));
        // SAFETY: an initialised stream; zlib checks the arguments.
        let ret = unsafe { z::inflatePrime(&mut *self.stream, c_int::from(bits), value) };
        (ret == z::Z_OK)
            .then_some(())
            .ok_or_else(|| format!("zlib refused {bits} primed bits (error {ret})"))
    }

    /// The 32 KiB (at most) of output that precede the entry point.
    pub fn set_window(&mut self, window: &[u8]) -> Result<(), String> {
        if window.is_empty() {
            return Ok(());
        }
        if window.len() > 32 << 10 {
            return Err(format!("a window of {} bytes is over 32 KiB", window.len()));
        }
        // SAFETY: zlib copies the dictionary (at most 32 KiB, checked) into its own window.
        let ret = unsafe {
            z::inflateSetDictionary(&mut *self.stream, window.as_ptr(), window.len() as c_uint)
        };
        (ret == z::Z_OK)
            .then_some(())
            .ok_or_else(|| format!("zlib refused the window (error {ret})"))
    }

    /// Decodes from `input` into the spare capacity of `out` (at least one byte is reserved).
    /// `by_block`: stop after every deflate block (`Z_BLOCK`). `Err` on a corrupt stream.
    pub fn inflate(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        by_block: bool,
    ) -> Result<Step, &'static str> {
        out.reserve(1);
        let spare = out.spare_capacity_mut();
        let (avail_in, avail_out) = (clamp(input.len()), clamp(spare.len()));
        let stream = &mut *self.stream;
        stream.next_in = input.as_ptr() as *mut u8;
        stream.avail_in = avail_in;
        stream.next_out = spare.as_mut_ptr() as *mut u8;
        stream.avail_out = avail_out;
        let flush = if by_block { z::Z_BLOCK } else { z::Z_NO_FLUSH };
        // SAFETY: next_in/next_out point at `avail_in` readable and `avail_out` writable bytes
        // that outlive the call; zlib writes only inside them.
        let ret = unsafe { z::inflate(stream, flush) };
        let consumed = (avail_in - stream.avail_in) as usize;
        let produced = (avail_out - stream.avail_out) as usize;
        stream.next_in = ptr::null_mut();
        stream.next_out = ptr::null_mut();
        // SAFETY: zlib initialised exactly `produced` bytes of the spare capacity.
        unsafe { out.set_len(out.len() + produced) };
        let data_type = stream.data_type;
        match ret {
            z::Z_OK | z::Z_BUF_ERROR | z::Z_STREAM_END => Ok(Step {
                consumed,
                produced,
                stream_end: ret == z::Z_STREAM_END,
                at_block_boundary: by_block
                    && ret != z::Z_STREAM_END
                    && data_type & 128 != 0
                    && data_type & 64 == 0,
                unused_bits: (data_type & 7) as u8,
            }),
            _ => Err(super::gzip::CORRUPT),
        }
    }
}

impl Drop for RawInflate {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, ended once here.
        unsafe { z::inflateEnd(&mut *self.stream) };
    }
}

fn clamp(len: usize) -> c_uint {
    len.min(c_uint::MAX as usize) as c_uint
}

const ALIGN: usize = std::mem::align_of::<usize>();

/// zlib's allocator: Rust's, with the size kept in a header for `zfree`.
extern "C" fn zalloc(_opaque: *mut c_void, items: c_uint, size: c_uint) -> *mut c_void {
    let Some(bytes) = (items as usize)
        .checked_mul(size as usize)
        .and_then(|n| n.checked_add(ALIGN))
    else {
        return ptr::null_mut();
    };
    let Ok(layout) = Layout::from_size_align(bytes, ALIGN) else {
        return ptr::null_mut();
    };
    // SAFETY: a non-zero size (the header); the size is stored for `zfree`.
    unsafe {
        let base = alloc(layout) as *mut usize;
        if base.is_null() {
            return ptr::null_mut();
        }
        *base = bytes;
        (base as *mut u8).add(ALIGN) as *mut c_void
    }
}

extern "C" fn zfree(_opaque: *mut c_void, address: *mut c_void) {
    if address.is_null() {
        return;
    }
    // SAFETY: `address` came from `zalloc`, which put the allocation's size before it.
    unsafe {
        let base = (address as *mut u8).sub(ALIGN) as *mut usize;
        dealloc(
            base as *mut u8,
            Layout::from_size_align_unchecked(*base, ALIGN),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut c = Compress::new(Compression::new(6), false);
        let mut out = Vec::with_capacity(data.len() + 1024);
        c.compress_vec(data, &mut out, FlushCompress::Finish)
            .unwrap();
        out
    }

    /// Lines of pseudo-random words: many deflate blocks.
    fn text(n: usize) -> Vec<u8> {
        let mut state = 7u64;
        let mut out = String::new();
        for i in 0..n {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            out.push_str(&format!("{{\"i\": {i}, \"w\": \"{:x}\"}}\n", state >> 20));
        }
        out.into_bytes()
    }

    /// Every block boundary of a stream: (bit offset, output offset).
    fn boundaries(data: &[u8]) -> Vec<(u64, usize)> {
        let mut z = RawInflate::new().unwrap();
        let (mut input, mut out, mut found) = (0, Vec::with_capacity(1 << 20), Vec::new());
        loop {
            let step = z.inflate(&data[input..], &mut out, true).unwrap();
            input += step.consumed;
            if step.stream_end {
                return found;
            }
            if step.at_block_boundary && !out.is_empty() {
                found.push((input as u64 * 8 - u64::from(step.unused_bits), out.len()));
            }
            out.reserve(1 << 16);
        }
    }

    #[test]
    fn enters_at_every_block_boundary() {
        let plain = text(20_000);
        let data = deflate(&plain);
        let points = boundaries(&data);
        assert!(points.len() > 3, "{} blocks", points.len());
        for (bit, out) in points {
            let mut z = RawInflate::new().unwrap();
            let (byte, bits) = ((bit / 8) as usize, (bit % 8) as u8);
            let mut input = byte;
            if bits > 0 {
                z.prime(8 - bits, data[byte]).unwrap();
                input += 1;
            }
            z.set_window(&plain[out.saturating_sub(32 << 10)..out])
                .unwrap();
            let mut rest = Vec::with_capacity(plain.len());
            loop {
                let step = z.inflate(&data[input..], &mut rest, false).unwrap();
                input += step.consumed;
                if step.stream_end {
                    break;
                }
                rest.reserve(1 << 16);
            }
            assert_eq!(rest, &plain[out..]);
        }
    }

    #[test]
    fn refuses_what_zlib_cannot_take() {
        let mut z = RawInflate::new().unwrap();
        assert!(z.prime(8, 0).is_err());
        assert!(z.set_window(&vec![0; (32 << 10) + 1]).is_err());
        let mut out = Vec::new();
        assert_eq!(
            z.inflate(&[0xff; 16], &mut out, false),
            Err(super::super::gzip::CORRUPT)
        );
    }
}

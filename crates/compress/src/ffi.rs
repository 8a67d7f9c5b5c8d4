//! The only `unsafe` in ferofs: calls into the bundled C codecs (liblz4, liblzma).
//! Every function here takes and returns safe Rust types; each unsafe block states why
//! it is sound. Audit this file when touching it.
#![allow(unsafe_code)]

#[cfg(feature = "lz4")]
pub mod lz4 {
    use std::os::raw::{c_char, c_int, c_void};
    // Linked from the static liblz4 that lz4-sys builds from its bundled sources.
    use lz4_sys as _;

    extern "C" {
        fn LZ4_compress_destSize(
            src: *const c_char,
            dst: *mut c_char,
            src_size: *mut c_int,
            target_dst_size: c_int,
        ) -> c_int;
        fn LZ4_sizeofStateHC() -> c_int;
        fn LZ4_compress_HC_destSize(
            state: *mut c_void,
            src: *const c_char,
            dst: *mut c_char,
            src_size: *mut c_int,
            target_dst_size: c_int,
            level: c_int,
        ) -> c_int;
        fn LZ4_decompress_safe_partial(
            src: *const c_char,
            dst: *mut c_char,
            src_size: c_int,
            target_output_size: c_int,
            dst_capacity: c_int,
        ) -> c_int;
    }

    fn clamp_int(n: usize) -> c_int {
        c_int::try_from(n).unwrap_or(c_int::MAX)
    }

    /// LZ4 (fast) fixed-output compression: (consumed, written); written 0 on failure.
    pub fn compress_dest_size(src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let mut consumed = clamp_int(src.len().min(0x7E00_0000));
        // SAFETY: src is valid for `consumed` bytes (clamped to its length), dst for
        // dst.len() bytes; liblz4 writes at most target_dst_size bytes and updates
        // `consumed` to the input it used.
        let n = unsafe {
            LZ4_compress_destSize(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                &mut consumed,
                clamp_int(dst.len()),
            )
        };
        (
            usize::try_from(consumed).unwrap_or(0),
            usize::try_from(n).unwrap_or(0),
        )
    }

    /// LZ4HC state: an aligned heap buffer of LZ4_sizeofStateHC() bytes.
    pub struct HcState {
        buf: Vec<u64>,
    }

    impl HcState {
        pub fn new() -> Self {
            // SAFETY: a pure function returning the state size.
            let size = unsafe { LZ4_sizeofStateHC() };
            let words = usize::try_from(size).unwrap_or(0).div_ceil(8);
            HcState {
                buf: vec![0u64; words],
            }
        }

        pub fn compress_dest_size(
            &mut self,
            src: &[u8],
            dst: &mut [u8],
            level: i32,
        ) -> (usize, usize) {
            let mut consumed = clamp_int(src.len().min(0x7E00_0000));
            // SAFETY: the state buffer has LZ4_sizeofStateHC() bytes, 8-byte aligned
            // (liblz4 requires pointer alignment); the HC function initialises it. src
            // and dst are valid for the sizes passed.
            let n = unsafe {
                LZ4_compress_HC_destSize(
                    self.buf.as_mut_ptr().cast(),
                    src.as_ptr().cast(),
                    dst.as_mut_ptr().cast(),
                    &mut consumed,
                    clamp_int(dst.len()),
                    level,
                )
            };
            (
                usize::try_from(consumed).unwrap_or(0),
                usize::try_from(n).unwrap_or(0),
            )
        }
    }

    impl Default for HcState {
        fn default() -> Self {
            Self::new()
        }
    }

    /// Decode at least `dst.len()` bytes if the stream holds them (partial decoding);
    /// returns the bytes produced, or None for a corrupt stream.
    pub fn decompress_partial(src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let cap = clamp_int(dst.len());
        // SAFETY: LZ4_decompress_safe_partial never reads past src_size bytes of src
        // nor writes past dst_capacity bytes of dst, whatever the input.
        let n = unsafe {
            LZ4_decompress_safe_partial(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                clamp_int(src.len()),
                cap,
                cap,
            )
        };
        usize::try_from(n).ok()
    }
}

#[cfg(feature = "lzma")]
pub mod lzma {
    use liblzma_sys::*;

    /// An lzma_stream that is always ended.
    struct Stream(lzma_stream);

    impl Stream {
        fn new() -> Self {
            // SAFETY: LZMA_STREAM_INIT is an all-zero lzma_stream (pointers null,
            // counters zero); liblzma documents zero-initialisation as valid.
            Stream(unsafe { std::mem::zeroed() })
        }
    }

    impl Drop for Stream {
        fn drop(&mut self) {
            // SAFETY: lzma_end accepts a zeroed or initialised stream and frees its state.
            unsafe { lzma_end(&mut self.0) };
        }
    }

    /// MicroLZMA: fill `dst` from a prefix of `src`. Returns (consumed, written) or None.
    pub fn microlzma_encode(
        src: &[u8],
        dst: &mut [u8],
        level: u32,
        dict_size: u32,
    ) -> Option<(usize, usize)> {
        // SAFETY: lzma_options_lzma is plain data; lzma_lzma_preset fills it.
        let mut opts: lzma_options_lzma = unsafe { std::mem::zeroed() };
        // SAFETY: opts is a valid, writable options struct.
        if unsafe { lzma_lzma_preset(&mut opts, level) } != 0 {
            return None;
        }
        opts.dict_size = dict_size;
        let mut s = Stream::new();
        // SAFETY: s.0 is a valid stream; opts outlives the call (liblzma copies it).
        if unsafe { lzma_microlzma_encoder(&mut s.0, &opts) } != LZMA_OK {
            return None;
        }
        s.0.next_in = src.as_ptr();
        s.0.avail_in = src.len();
        s.0.next_out = dst.as_mut_ptr();
        s.0.avail_out = dst.len();
        // SAFETY: next_in/next_out point into live slices of the given lengths, which
        // outlive the stream (dropped at the end of this function).
        let r = unsafe { lzma_code(&mut s.0, LZMA_FINISH) };
        if r != LZMA_STREAM_END {
            return None;
        }
        Some((
            usize::try_from(s.0.total_in).ok()?,
            usize::try_from(s.0.total_out).ok()?,
        ))
    }

    /// Decode a MicroLZMA stream of exactly `src.len()` bytes into `dst` (exactly
    /// `dst.len()` bytes when `exact`, else at most that many).
    pub fn microlzma_decode(
        src: &[u8],
        dst: &mut [u8],
        exact: bool,
        dict_size: u32,
    ) -> Option<usize> {
        let mut s = Stream::new();
        // SAFETY: s.0 is a valid stream; sizes are plain integers.
        let r = unsafe {
            lzma_microlzma_decoder(
                &mut s.0,
                src.len() as u64,
                dst.len() as u64,
                u8::from(exact),
                dict_size,
            )
        };
        if r != LZMA_OK {
            return None;
        }
        s.0.next_in = src.as_ptr();
        s.0.avail_in = src.len();
        s.0.next_out = dst.as_mut_ptr();
        s.0.avail_out = dst.len();
        // SAFETY: as in microlzma_encode: the slices outlive the stream.
        let r = unsafe { lzma_code(&mut s.0, LZMA_FINISH) };
        if r != LZMA_STREAM_END && r != LZMA_OK {
            return None;
        }
        usize::try_from(s.0.total_out).ok()
    }
}

//! The only `unsafe` in ferofs: calls into the bundled C codecs (liblz4, liblzma, and
//! libzstd's buffer-less block API), and one tunable of glibc's malloc.
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
        fn LZ4_decompress_safe(
            src: *const c_char,
            dst: *mut c_char,
            src_size: c_int,
            dst_capacity: c_int,
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

    /// LZ4HC state: an 8-byte-aligned heap buffer of LZ4_sizeofStateHC() bytes (empty
    /// if liblz4 reported no size, in which case compression is refused).
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
            if self.buf.is_empty() {
                return (0, 0);
            }
            let mut consumed = clamp_int(src.len().min(0x7E00_0000));
            // SAFETY: the state buffer has at least LZ4_sizeofStateHC() bytes (non-empty,
            // checked above), 8-byte aligned (liblz4 requires pointer alignment); the HC
            // function initialises it. src is valid for `consumed` bytes (clamped to its
            // length), dst for at least target_dst_size bytes; liblz4 writes no more.
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

    /// Decode a whole stream of exactly `src.len()` bytes into `dst`; returns the bytes
    /// produced, or None for a corrupt stream or one that does not fit `dst`.
    pub fn decompress_full(src: &[u8], dst: &mut [u8]) -> Option<usize> {
        if src.len() > c_int::MAX as usize || dst.len() > c_int::MAX as usize {
            return None;
        }
        // SAFETY: LZ4_decompress_safe never reads past src_size bytes of src nor
        // writes past dst_capacity bytes of dst, whatever the input; both sizes are the
        // slices' own lengths (checked to fit a c_int above).
        let n = unsafe {
            LZ4_decompress_safe(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                clamp_int(src.len()),
                clamp_int(dst.len()),
            )
        };
        usize::try_from(n).ok()
    }

    /// Decode the first `dst.len()` bytes (or fewer if the stream ends first); returns
    /// the bytes produced, or None for a corrupt stream.
    pub fn decompress_partial(src: &[u8], dst: &mut [u8]) -> Option<usize> {
        if src.len() > c_int::MAX as usize || dst.len() > c_int::MAX as usize {
            return None;
        }
        let cap = clamp_int(dst.len());
        // SAFETY: LZ4_decompress_safe_partial never reads past src_size bytes of src
        // nor writes past dst_capacity bytes of dst, whatever the input; both sizes are
        // the slices' own lengths (checked to fit a c_int above).
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

    /// An `lzma_stream` owned by Rust: zero-initialised (`LZMA_STREAM_INIT`), reusable
    /// across coder initialisations (liblzma keeps its allocations when the next coder
    /// has the same shape), ended on drop. Between calls its buffer pointers are null.
    pub struct Stream(lzma_stream);

    // SAFETY: liblzma has no thread affinity; a stream may be used from any one thread
    // at a time, which `&mut self` on every method guarantees. The buffer pointers are
    // reset to null after each call, so no borrowed slice is referenced across threads.
    unsafe impl Send for Stream {}

    impl Stream {
        pub fn new() -> Self {
            // SAFETY: LZMA_STREAM_INIT is an all-zero lzma_stream (null pointers, zero
            // counters, null allocator = malloc); all fields are integers or pointers.
            Stream(unsafe { std::mem::zeroed() })
        }

        /// Run the initialised coder once with LZMA_FINISH over `src` into `dst`;
        /// returns liblzma's status and (total_in, total_out).
        fn finish(&mut self, src: &[u8], dst: &mut [u8]) -> (lzma_ret, usize, usize) {
            let s = &mut self.0;
            s.next_in = src.as_ptr();
            s.avail_in = src.len();
            s.next_out = dst.as_mut_ptr();
            s.avail_out = dst.len();
            // SAFETY: the stream holds an initialised coder (callers check the init
            // result); next_in/next_out point into live slices of the given lengths,
            // borrowed for the duration of this call only, and liblzma never accesses
            // more than avail_in / avail_out bytes of them.
            let r = unsafe { lzma_code(s, LZMA_FINISH) };
            let (used_in, used_out) = (src.len() - s.avail_in, dst.len() - s.avail_out);
            s.next_in = std::ptr::null();
            s.avail_in = 0;
            s.next_out = std::ptr::null_mut();
            s.avail_out = 0;
            (r, used_in, used_out)
        }

        /// Decode a MicroLZMA stream of exactly `src.len()` bytes into `dst`: exactly
        /// `dst.len()` bytes when `exact`, else at most that many. Returns the bytes
        /// produced, or None for a corrupt stream.
        pub fn microlzma_decode(
            &mut self,
            src: &[u8],
            dst: &mut [u8],
            exact: bool,
            dict_size: u32,
        ) -> Option<usize> {
            // SAFETY: the stream is valid; the arguments are plain integers. liblzma
            // bounds its own allocation by dict_size (callers cap it at 8 MiB).
            let r = unsafe {
                lzma_microlzma_decoder(
                    &mut self.0,
                    src.len() as u64,
                    dst.len() as u64,
                    lzma_bool::from(exact),
                    dict_size,
                )
            };
            if r != LZMA_OK {
                return None;
            }
            match self.finish(src, dst) {
                (r, _, used_out) if r == LZMA_STREAM_END || r == LZMA_OK => Some(used_out),
                _ => None,
            }
        }
    }

    impl Default for Stream {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Drop for Stream {
        fn drop(&mut self) {
            // SAFETY: lzma_end accepts a zeroed or initialised stream and frees its
            // internal state; the stream is not used afterwards.
            unsafe { lzma_end(&mut self.0) };
        }
    }

    /// A MicroLZMA encoder: LZMA1 options plus a reused stream.
    pub struct Encoder {
        opts: lzma_options_lzma,
        stream: Stream,
    }

    // SAFETY: the only pointer in `opts` is `preset_dict`, which stays null (no preset
    // dictionary); the stream is Send (above).
    unsafe impl Send for Encoder {}

    impl Encoder {
        /// Options for `preset` (0..=9, optionally | LZMA_PRESET_EXTREME) with this
        /// dictionary size; None if liblzma rejects the preset.
        pub fn new(preset: u32, dict_size: u32) -> Option<Self> {
            // SAFETY: lzma_options_lzma is plain data (integers, enums, and a
            // preset-dict pointer for which null means none), so all-zero is a valid
            // value; lzma_lzma_preset then fills it.
            let mut opts: lzma_options_lzma = unsafe { std::mem::zeroed() };
            // SAFETY: `opts` is a valid, writable options struct.
            if unsafe { lzma_lzma_preset(&mut opts, preset) } != 0 {
                return None;
            }
            opts.dict_size = dict_size;
            opts.preset_dict = std::ptr::null();
            Some(Encoder {
                opts,
                stream: Stream::new(),
            })
        }

        /// Fill `dst` from a prefix of `src`. Returns (consumed, written), or None if
        /// liblzma refuses.
        pub fn encode(&mut self, src: &[u8], dst: &mut [u8]) -> Option<(usize, usize)> {
            // SAFETY: the stream is valid (zeroed or previously initialised); liblzma
            // copies what it needs from `opts` during the call.
            if unsafe { lzma_microlzma_encoder(&mut self.stream.0, &self.opts) } != LZMA_OK {
                return None;
            }
            match self.stream.finish(src, dst) {
                (r, used_in, used_out) if r == LZMA_STREAM_END => Some((used_in, used_out)),
                _ => None,
            }
        }
    }

    pub use liblzma_sys::LZMA_PRESET_EXTREME;
}

#[cfg(feature = "zstd")]
pub mod zstd {
    //! libzstd's buffer-less streaming API: one frame compressed piece by piece, each
    //! call consuming its whole piece and ending its blocks, so the caller sees the
    //! exact output after every piece (what `ZSTD_compressStream2` hides in its
    //! buffers). Used to fill a pcluster in one pass instead of compressing
    //! ever-longer prefixes again (see `zstd_codec`).
    use std::ffi::c_void;
    use std::ptr::NonNull;
    use zstd_sys::{
        ZSTD_CCtx, ZSTD_adjustCParams, ZSTD_compressBegin_advanced, ZSTD_compressBound,
        ZSTD_compressContinue, ZSTD_compressEnd, ZSTD_createCCtx, ZSTD_frameParameters,
        ZSTD_freeCCtx, ZSTD_getCParams, ZSTD_isError, ZSTD_parameters,
    };

    /// `ZSTD_CONTENTSIZE_UNKNOWN`.
    const SIZE_UNKNOWN: u64 = u64::MAX;

    /// A compression context of its own (not shared with the one-shot API's).
    pub struct Frames {
        cctx: NonNull<ZSTD_CCtx>,
    }

    // SAFETY: a ZSTD_CCtx has no thread affinity; `Frames` owns it exclusively and every
    // use goes through `&mut self`, so moving it to another thread is sound.
    unsafe impl Send for Frames {}

    impl Drop for Frames {
        fn drop(&mut self) {
            // SAFETY: the pointer came from ZSTD_createCCtx and is freed once, here.
            unsafe {
                ZSTD_freeCCtx(self.cctx.as_ptr());
            }
        }
    }

    /// The frame parameters of one pcluster: no content size (EROFS knows it), no
    /// checksum, no dictionary id.
    #[derive(Clone, Copy)]
    pub struct Setup {
        pub level: i32,
        /// At most the window declared in the image's config record.
        pub window_log: u32,
        /// The input expected to fit: picks libzstd's parameter row for that size, as
        /// a one-shot call on that input would.
        pub size_hint: u64,
    }

    impl Frames {
        pub fn new() -> Option<Self> {
            // SAFETY: allocates a context or returns null.
            NonNull::new(unsafe { ZSTD_createCCtx() }).map(|cctx| Frames { cctx })
        }

        /// Start a frame over `src`; its pieces are consecutive slices of `src` from
        /// its start. Starting a frame forgets every earlier one.
        pub fn frame<'a>(&'a mut self, src: &'a [u8], setup: Setup) -> Option<Frame<'a>> {
            let len = src.len() as u64;
            // SAFETY: pure functions on plain structs.
            let cparams = unsafe {
                let mut c = ZSTD_getCParams(setup.level, setup.size_hint.max(1), 0);
                c.windowLog = setup.window_log;
                // Shrinks the window (and the tables with it) to the input when the
                // whole input is smaller; never grows anything.
                ZSTD_adjustCParams(c, len.max(1), 0)
            };
            let params = ZSTD_parameters {
                cParams: cparams,
                fParams: ZSTD_frameParameters {
                    contentSizeFlag: 0,
                    checksumFlag: 0,
                    noDictIDFlag: 1,
                },
            };
            // SAFETY: the context is valid; no dictionary (null, 0). Beginning a frame
            // resets the context's window, so no pointer into an earlier frame's input
            // is used again.
            let r = unsafe {
                ZSTD_compressBegin_advanced(
                    self.cctx.as_ptr(),
                    std::ptr::null(),
                    0,
                    params,
                    SIZE_UNKNOWN,
                )
            };
            // SAFETY: pure function on a return code.
            if unsafe { ZSTD_isError(r) } != 0 {
                return None;
            }
            Some(Frame {
                frames: self,
                src,
                pos: 0,
            })
        }
    }

    /// A frame being written. It borrows its whole input for its whole life: libzstd
    /// keeps pointers to earlier pieces (the match window) between calls.
    pub struct Frame<'a> {
        frames: &'a mut Frames,
        src: &'a [u8],
        pos: usize,
    }

    impl Frame<'_> {
        /// Input consumed so far.
        pub fn pos(&self) -> usize {
            self.pos
        }

        /// Compress the next `len` bytes of the input (clamped to what is left) into
        /// `out`, which then holds exactly the bytes written (its capacity made the
        /// worst case first if less, without zeroing or copying it: a piece of very
        /// compressible input may be a 32 MiB segment, whose bound would otherwise be
        /// made resident for about a pcluster of output), ending the frame after them
        /// if `end`. Returns the bytes written (the frame header comes with the first
        /// piece), or None on a codec error (the frame is then unusable).
        pub fn piece(&mut self, len: usize, end: bool, out: &mut Vec<u8>) -> Option<usize> {
            let len = len.min(self.src.len() - self.pos);
            let piece = &self.src[self.pos..self.pos + len];
            // SAFETY: pure function. 64 bytes more for the frame header and the end
            // block, which the bound of a piece does not count.
            let need = unsafe { ZSTD_compressBound(len) }.saturating_add(64);
            out.clear();
            if out.capacity() < need {
                // Freed before the new one is taken, and not grown in place: growing
                // copies the old capacity over (zstd 3 at 1 MiB pclusters, `-j 8`:
                // about 14 MiB a worker made resident that way for a pcluster of output).
                *out = Vec::new();
                out.reserve_exact(need);
            }
            // SAFETY: `piece` lies in `src`, which this frame borrows for its whole life,
            // right after the previous piece, so the window libzstd keeps (pointers to
            // earlier pieces) stays valid and unmodified; `out`'s buffer is writable for
            // out.capacity() bytes, at least the worst case, and libzstd writes no more
            // than the capacity it is given (it never reads the destination).
            let r = unsafe {
                let f = if end {
                    ZSTD_compressEnd
                } else {
                    ZSTD_compressContinue
                };
                f(
                    self.frames.cctx.as_ptr(),
                    out.as_mut_ptr().cast::<c_void>(),
                    out.capacity(),
                    piece.as_ptr().cast::<c_void>(),
                    len,
                )
            };
            // SAFETY: pure function on a return code.
            if unsafe { ZSTD_isError(r) } != 0 || r > out.capacity() {
                return None;
            }
            // SAFETY: libzstd initialised the first `r` bytes of the buffer, within
            // its capacity (checked above).
            unsafe { out.set_len(r) };
            self.pos += len;
            Some(r)
        }
    }
}

/// glibc's allocator, for the builder's threads: the codecs' buffers and the workers'
/// results are its biggest users.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub mod malloc {
    use std::os::raw::c_int;

    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    /// `M_ARENA_MAX` in glibc's malloc.h.
    const M_ARENA_MAX: c_int = -8;

    /// Let glibc create at most `n` arenas from now on; false if it refused.
    pub fn set_arena_max(n: u32) -> bool {
        let n = c_int::try_from(n).unwrap_or(c_int::MAX);
        // SAFETY: mallopt takes two integers and returns one; M_ARENA_MAX only stores
        // the bound that later arena creation reads, and is valid at any time.
        unsafe { mallopt(M_ARENA_MAX, n) == 1 }
    }
}

//! Longest-prefix search for codecs without a destSize API (DEFLATE, Zstandard).
//!
//! `try_len(n, out)` compresses the first `n` bytes into `out` (sized to the codec's
//! worst-case bound, so it always succeeds) and returns the exact compressed size. We
//! look for the largest `n` whose size fits `cap`, to within a small tolerance (0.4 %
//! of the input, at least 64 bytes): secant steps from the measured ratio, bisection
//! when a step leaves the bracket. Typically 2-4 trials. Incompressible input stops
//! after one or two trials: if even `cap` bytes do not shrink by a block's worth,
//! nothing fits usefully and the caller stores the data uncompressed.

const MAX_TRIALS: usize = 24;

/// Returns (consumed, written); (0, 0) when compression does not help.
pub fn longest_prefix(
    src_len: usize,
    dst: &mut [u8],
    ratio_hint: &mut f64,
    min_gain: usize,
    scratch: &mut Vec<u8>,
    bound: impl Fn(usize) -> usize,
    mut try_len: impl FnMut(usize, &mut [u8]) -> Option<usize>,
) -> (usize, usize) {
    let cap = dst.len();
    if src_len == 0 || cap == 0 {
        return (0, 0);
    }
    // Bracket: (lo, w_lo) fits, (hi, w_hi) does not.
    let (mut lo, mut w_lo) = (0usize, 0usize);
    let (mut hi, mut w_hi) = (src_len + 1, usize::MAX);
    let mut best = (0usize, 0usize);
    let mut guess = (((cap as f64) * ratio_hint.max(1.0)) as usize).clamp(1, src_len);
    for _ in 0..MAX_TRIALS {
        scratch.resize(bound(guess).max(cap), 0);
        let Some(w) = try_len(guess, scratch) else {
            return best;
        };
        if w <= cap {
            (lo, w_lo) = (guess, w);
            best = (guess, w);
            dst[..w].copy_from_slice(&scratch[..w]);
            if guess == src_len {
                break;
            }
        } else {
            (hi, w_hi) = (guess, w);
            if best.0 == 0 && guess <= cap + min_gain {
                // Not even this much input shrinks usefully: store uncompressed.
                return (0, 0);
            }
        }
        if hi - lo <= (lo / 256).max(64) {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let next = if w_hi == usize::MAX {
            // No upper sample yet: extrapolate from the ratio seen, at least double.
            let est = (guess as f64 * (cap as f64 * 0.997) / w.max(1) as f64) as usize;
            est.max(lo + (lo - lo / 2).max(1)).min(src_len)
        } else {
            // Interpolate between the bracket's ends toward a size of `cap`.
            let span = (w_hi.min(usize::MAX / 2) - w_lo) as f64;
            let t = if span > 0.0 {
                (cap - w_lo) as f64 / span
            } else {
                0.5
            };
            let est = lo + ((hi - lo) as f64 * t * 0.995) as usize;
            // Guard against slow convergence: stay well inside the bracket.
            let q = (hi - lo) / 8;
            if est <= lo + q.min(est.saturating_sub(lo)) && est <= lo || est >= hi {
                mid
            } else {
                est.clamp(lo + 1, hi - 1)
            }
        };
        guess = if next > lo && next < hi { next } else { mid };
        if best.0 == 0 && guess < cap + min_gain && cap + min_gain < hi {
            guess = (cap + min_gain).min(src_len);
        }
    }
    if best.0 > 0 {
        *ratio_hint = best.0 as f64 / cap as f64;
    }
    best
}

//! Longest-prefix search for codecs without a destSize API (DEFLATE, Zstandard).
//!
//! `try_len(n, out) -> Some(written)` compresses the first `n` bytes into `out` (None
//! when it does not fit). We look for the largest `n` that fits, to within a small
//! tolerance (0.4 % of the input, at least 64 bytes): a secant step from the measured
//! compression ratio, then bisection. Typically 3-6 trials; at most `MAX_TRIALS`. The
//! final output is the best fitting trial, copied into `dst`.

const MAX_TRIALS: usize = 16;

/// Returns (consumed, written).
pub fn longest_prefix(
    src_len: usize,
    dst: &mut [u8],
    ratio_hint: &mut f64,
    scratch: &mut Vec<u8>,
    mut try_len: impl FnMut(usize, &mut [u8]) -> Option<usize>,
) -> (usize, usize) {
    let cap = dst.len();
    if src_len == 0 || cap == 0 {
        return (0, 0);
    }
    scratch.resize(cap, 0);
    let (mut lo, mut hi) = (0usize, src_len + 1); // lo fits (0 trivially), hi does not
    let mut best = (0usize, 0usize);
    let mut guess = ((cap as f64) * ratio_hint.max(1.0)) as usize;
    guess = guess.clamp(1, src_len);
    for _ in 0..MAX_TRIALS {
        match try_len(guess, scratch) {
            Some(w) => {
                lo = guess;
                best = (guess, w);
                dst[..w].copy_from_slice(&scratch[..w]);
                if guess == src_len {
                    break;
                }
                // Grow by the ratio of room left, at least a little.
                let est = (guess as f64 * cap as f64 / w.max(1) as f64 * 0.995) as usize;
                guess = est.max(guess + 64).min(hi - 1).min(src_len);
            }
            None => {
                hi = guess;
                let over = scratch_over(cap);
                let est = (guess as f64 * cap as f64 / over) as usize;
                guess = est.min(guess - 1).max(lo + 1);
            }
        }
        let tol = (lo / 256).max(64);
        if hi - lo <= tol || guess <= lo || guess >= hi {
            // Bisection fallback when the estimate left the bracket.
            if hi - lo <= tol {
                break;
            }
            guess = lo + (hi - lo) / 2;
        }
    }
    if best.0 > 0 {
        *ratio_hint = best.0 as f64 / cap as f64;
    }
    best
}

/// A failed trial tells us only that the output exceeded `cap`; assume 10 % over.
fn scratch_over(cap: usize) -> f64 {
    cap as f64 * 1.1
}

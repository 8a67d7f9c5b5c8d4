//! Longest-prefix search for codecs without a fixed-output API: Zstandard, and DEFLATE
//! at levels 10-12 (libdeflate's near-optimal parser; levels 1-9 run our own
//! fixed-output encoder, deflate_enc.rs, which needs no search).
//!
//! Problem: find the largest `n` such that `size(n)`, the compressed size of `src[..n]`,
//! is at most `cap`. `size` is nearly linear in `n` at the scale of a pcluster (slope
//! = 1 / compression ratio) but noisy at the scale of a few bytes, and not strictly
//! monotone. Each evaluation is a full one-shot compression, so the number of trials
//! is what costs.
//!
//! Strategy (about 6 trials per pcluster on source text at 4 KiB..128 KiB, where
//! mkfs.erofs's bisection takes 10-14; 1-2 for incompressible data):
//!
//! 1. **Predict.** The first guess is `cap * ratio`, where `ratio` (input per output
//!    byte) is carried over from the previous call: consecutive pclusters of one file
//!    usually compress alike.
//! 2. **Measure exactly.** Every trial compresses into a scratch buffer sized to the
//!    codec's worst-case bound, so it yields the exact size also for prefixes that do
//!    not fit; exact sizes are what make the interpolation below accurate.
//! 3. **Bracket.** While all samples lie on one side of `cap`, extrapolate along the
//!    secant through the last two samples (the marginal ratio, which differs from the
//!    average one: later input finds more history to match), or through the origin
//!    with one sample, and overshoot by a small pad (0.1 % of the prefix) that doubles
//!    with every further trial on the same side, so a tight bracket forms quickly.
//! 4. **Interpolate.** Once a fitting `lo` and a non-fitting `hi` bracket the answer,
//!    take the regula-falsi point aimed just below `cap`, with the Illinois
//!    modification (an end that survives twice has its pull halved) and a bisection
//!    step whenever two trials did not halve the bracket, so neither a curved nor a
//!    staircase-shaped `size` (extending a match adds input but no output) can stall.
//! 5. **Stop** when the whole input fits, or the fitting sample leaves at most
//!    `max(1, cap/8192)` bytes of the capacity unused, or the bracket is within
//!    `max(1, lo/2048)` bytes (0.05 % of the input). Measured against an exhaustive
//!    bisection (examples/bench.rs `--reference`), the input packed per pcluster is
//!    the same to within 0.01 %. Codecs choose a looser stop
//!    ([`PrefixSearch::with_slack`]): Zstandard accepts `max(4, cap/8192)` unused
//!    bytes (the same from 32 KiB up; at 4 KiB 13-15 % fewer trials for 0.01-0.08 %
//!    more image), DEFLATE, whose trials cost most, `max(16, cap/512)`: on text about
//!    0.1-0.2 % more output for 25-45 % fewer trials (mkfs.erofs 1.9.3 accepts
//!    `22 - 2 * level` bytes).
//! 6. **Incompressible data exits early.** When the input is longer than `cap`, a prefix
//!    of at most `cap` bytes is never worth compressing (storing it is as good), so no
//!    guess goes below `cap + 1`; if that prefix does not fit we return `(0, 0)` and
//!    the caller stores the data. The ratio then resets to 1 so a run of incompressible
//!    pclusters costs one trial each.
//!
//! Near-maximality is tested in `tests/codecs.rs` (a few hundred more bytes must not
//! fit).

use std::sync::atomic::{AtomicU64, Ordering};

/// Trials run by all searches in this process (for benchmarks; not part of the API).
pub static TRIALS: AtomicU64 = AtomicU64::new(0);
/// Refits ([`PrefixSearch::refit`]), their trials and the input bytes those compressed
/// (included in the totals above).
pub static REFITS: AtomicU64 = AtomicU64::new(0);
pub static REFIT_TRIALS: AtomicU64 = AtomicU64::new(0);
pub static REFIT_BYTES: AtomicU64 = AtomicU64::new(0);
/// Input bytes compressed by all those trials (for benchmarks; not part of the API).
pub static TRIAL_BYTES: AtomicU64 = AtomicU64::new(0);

/// Hard limit on trials per call; bisection alone converges in about 23 for 4 MiB.
const MAX_TRIALS: usize = 48;
/// Bytes of worst-case overhead a shorter input may have beyond a longer one's: zstd's
/// bound adds up to 64 bytes under 128 KiB of input (`(128 KiB - n) >> 11`).
const BOUND_SLACK: usize = 256;
/// A refit accepts `max(cap >> REFIT_SLACK_SHIFT, REFIT_MIN_SLACK)` unused bytes.
const REFIT_SLACK_SHIFT: u32 = 9;
const REFIT_MIN_SLACK: usize = 8;
/// A refit's first guess, as a share of the input the whole's ratio predicts.
const REFIT_AIM: f64 = 0.99;

/// Reusable state of one compressor's searches.
pub struct PrefixSearch {
    /// Input bytes per output byte seen last time.
    ratio: f64,
    scratch: Vec<u8>,
    /// Unused capacity accepted: `max(cap >> slack_shift, min_slack)` bytes.
    slack_shift: u32,
    min_slack: usize,
}

impl Default for PrefixSearch {
    fn default() -> Self {
        PrefixSearch {
            ratio: 3.0,
            scratch: Vec::new(),
            slack_shift: 13,
            min_slack: 1,
        }
    }
}

/// A sample of `size`: prefix length and compressed size.
#[derive(Clone, Copy)]
struct Sample {
    n: usize,
    size: usize,
}

impl PrefixSearch {
    /// A search that stops once the output leaves at most `max(cap >> shift, min)`
    /// bytes of the capacity unused (the default is `max(cap >> 13, 1)`). A looser
    /// stop saves trials for codecs whose trials cost most (DEFLATE).
    pub fn with_slack(shift: u32, min: usize) -> Self {
        PrefixSearch {
            slack_shift: shift,
            min_slack: min.max(1),
            ..PrefixSearch::default()
        }
    }

    /// Back to the initial ratio estimate (the scratch buffer stays allocated).
    pub fn reset(&mut self) {
        self.ratio = PrefixSearch::default().ratio;
    }

    /// Find the longest prefix of `src` whose compressed form fits `dst`, leaving it in
    /// `dst`. `bound` is the codec's worst-case output for all of `src` (its overhead
    /// over the input must not shrink as the input grows, as zstd's and libdeflate's
    /// do not); `trial(prefix, out)` compresses `prefix` into `out` (at least the
    /// prefix's worst case long) and
    /// returns the size, or None on an internal codec error (then the best result so
    /// far is returned). Returns (consumed, written), (0, 0) when no useful prefix
    /// fits.
    pub fn run(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        bound: usize,
        trial: impl FnMut(&[u8], &mut [u8]) -> Option<usize>,
    ) -> (usize, usize) {
        let tol_out = (dst.len() >> self.slack_shift.min(31)).max(self.min_slack);
        self.search(src, dst, bound, tol_out, None, trial)
    }

    /// Like [`PrefixSearch::run`] for a second, smaller capacity: all of `src` is known
    /// to compress to `whole_size` bytes, more than `dst.len()`. That sample starts the
    /// bracket (so the second trial already interpolates), and the search stops once at
    /// most `max(cap >> 9, 8)` bytes of the capacity are left unused (what is left of
    /// the input is the caller's to store elsewhere: an inline tail). Measured at zstd
    /// 3, 128 KiB, `-E ztailpacking`, every refit by search: 3.7 trials a refit on the
    /// linux tree where a fresh search took 5.3 (input compressed 3.8 GB -> 2.4 GB), for
    /// 0.12 % more image bytes (rootfs: 0.02 %).
    pub fn refit(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        bound: usize,
        whole_size: usize,
        trial: impl FnMut(&[u8], &mut [u8]) -> Option<usize>,
    ) -> (usize, usize) {
        let tol_out = (dst.len() >> REFIT_SLACK_SHIFT).max(REFIT_MIN_SLACK);
        REFITS.fetch_add(1, Ordering::Relaxed);
        let known = (whole_size > dst.len()).then_some(Sample {
            n: src.len(),
            size: whole_size,
        });
        self.search(src, dst, bound, tol_out, known, trial)
    }

    fn search(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        bound: usize,
        tol_out: usize,
        known: Option<Sample>,
        mut trial: impl FnMut(&[u8], &mut [u8]) -> Option<usize>,
    ) -> (usize, usize) {
        let (len, cap) = (src.len(), dst.len());
        if len == 0 || cap == 0 {
            return (0, 0);
        }
        // The smallest prefix worth compressing (see step 5).
        let floor = len.min(cap + 1);
        let target = cap as f64 - tol_out as f64 / 2.0;

        let mut lo: Option<Sample> = None; // largest prefix known to fit
        let mut hi: Option<Sample> = known; // smallest prefix known not to fit
        let mut prev: Option<Sample> = known; // the sample before the last one
        let (mut lo_weight, mut hi_weight) = (1.0f64, 1.0f64); // Illinois weights
        let mut last_side = 0i8; // +1: the last trial fitted, -1: it did not
        let mut run = 0u32; // trials in a row on the same side
        let mut widths = [usize::MAX; 2]; // bracket width before the last two trials
        let mut n = match known {
            // Through the origin and the known sample, a little short of the target
            // (a prefix compresses a little worse than the whole: less history).
            Some(k) => ((k.n as f64 * target / k.size as f64 * REFIT_AIM) as usize)
                .clamp(floor, len.saturating_sub(1).max(floor)),
            None => ((self.ratio * target) as usize).clamp(floor, len),
        };
        for _ in 0..MAX_TRIALS {
            // Room for the worst case of this prefix, not of all of `src` (a trial
            // of a few MiB need not grow the scratch to a 32 MiB segment's bound).
            // The codecs' overhead over their input (`bound - len`) does not shrink
            // as the input grows, so `n` plus it (and a little) covers `n`'s bound.
            let need = n
                .saturating_add(bound.saturating_sub(len))
                .saturating_add(BOUND_SLACK)
                .min(bound)
                .max(cap);
            if self.scratch.len() < need {
                self.scratch.resize(need, 0);
            }
            TRIALS.fetch_add(1, Ordering::Relaxed);
            TRIAL_BYTES.fetch_add(n as u64, Ordering::Relaxed);
            if known.is_some() {
                REFIT_TRIALS.fetch_add(1, Ordering::Relaxed);
                REFIT_BYTES.fetch_add(n as u64, Ordering::Relaxed);
            }
            let Some(size) = trial(&src[..n], &mut self.scratch[..need]) else {
                break;
            };
            let s = Sample { n, size };
            let side = if size <= cap { 1 } else { -1 };
            run = if side == last_side { run + 1 } else { 1 };
            last_side = side;
            if side == 1 {
                lo = Some(s);
            } else {
                hi = Some(s);
            }
            if side == 1 {
                dst[..size].copy_from_slice(&self.scratch[..size]);
                // Illinois: the other end survived twice, so halve its pull.
                lo_weight = 1.0;
                if run >= 2 {
                    hi_weight *= 0.5;
                }
                if n == len || cap - size <= tol_out {
                    break;
                }
            } else {
                if n <= floor {
                    // Not even the smallest useful prefix fits.
                    lo = None;
                    break;
                }
                hi_weight = 1.0;
                if run >= 2 {
                    lo_weight *= 0.5;
                }
            }
            let lo_n = lo.map_or(0, |s| s.n);
            let hi_n = hi.map_or(len + 1, |s| s.n);
            let width = hi_n - lo_n;
            if width <= (lo_n >> 11).max(1) {
                break;
            }
            // A secant through the last two samples, or the ratio through the origin.
            let extrapolate = |a: Sample, b: Option<Sample>| -> f64 {
                match b {
                    Some(b) if b.n != a.n && b.size != a.size => {
                        let slope = (a.n as f64 - b.n as f64) / (a.size as f64 - b.size as f64);
                        if slope > 0.0 {
                            return a.n as f64 + (target - a.size as f64) * slope;
                        }
                        a.n as f64 * target / a.size.max(1) as f64
                    }
                    _ => a.n as f64 * target / a.size.max(1) as f64,
                }
            };
            let guess = match (lo, hi) {
                (Some(l), Some(h)) => {
                    let slow = width > widths[0] / 2;
                    widths = [widths[1], width];
                    if slow {
                        lo_n + width / 2
                    } else {
                        // Regula falsi on size(n) - target with Illinois weights.
                        let gl = (l.size as f64 - target) * lo_weight; // <= 0
                        let gh = (h.size as f64 - target) * hi_weight; // > 0
                        let t = if gh - gl > 0.0 { -gl / (gh - gl) } else { 0.5 };
                        lo_n + (width as f64 * t) as usize
                    }
                }
                // Only fitting samples: extrapolate, overshooting a little more each
                // time (galloping) so that a bracket forms.
                (Some(l), None) => {
                    let pad = (l.n >> 10).max(8) << (run - 1).min(24);
                    extrapolate(l, prev) as usize + pad
                }
                // Only non-fitting samples: the mirror image.
                (None, Some(h)) => {
                    let pad = (h.n >> 10).max(8) << (run - 1).min(24);
                    (extrapolate(h, prev) as usize).saturating_sub(pad)
                }
                (None, None) => break,
            };
            prev = Some(s);
            n = guess.clamp(lo_n + 1, hi_n - 1).max(floor);
        }
        match lo {
            Some(s) => {
                self.ratio = (s.n as f64 / s.size.max(1) as f64).max(1.0);
                (s.n, s.size)
            }
            None => {
                self.ratio = 1.0;
                (0, 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the search against a synthetic size function, fresh or (`refit`) from the
    /// known size of the whole input; returns (consumed, written, trials).
    fn drive(
        s: &mut PrefixSearch,
        len: usize,
        cap: usize,
        size: impl Fn(usize) -> usize,
        refit: bool,
    ) -> (usize, usize, usize) {
        let src = vec![7u8; len];
        let mut dst = vec![0u8; cap];
        let mut trials = 0;
        let trial = |p: &[u8], out: &mut [u8]| {
            trials += 1;
            let n = size(p.len());
            let m = n.min(out.len());
            out[..m].fill(1);
            Some(n)
        };
        let (c, w) = if refit {
            s.refit(&src, &mut dst, len + 64, size(len), trial)
        } else {
            s.run(&src, &mut dst, len + 64, trial)
        };
        (c, w, trials)
    }

    fn run(
        s: &mut PrefixSearch,
        len: usize,
        cap: usize,
        size: impl Fn(usize) -> usize,
    ) -> (usize, usize, usize) {
        drive(s, len, cap, size, false)
    }

    fn refit(
        s: &mut PrefixSearch,
        len: usize,
        cap: usize,
        size: impl Fn(usize) -> usize,
    ) -> (usize, usize, usize) {
        drive(s, len, cap, size, true)
    }

    /// The exact answer for a monotone size function.
    fn best(len: usize, cap: usize, size: impl Fn(usize) -> usize) -> usize {
        (1..=len).rev().find(|&n| size(n) <= cap).unwrap_or(0)
    }

    #[test]
    fn finds_the_maximum_of_a_staircase() {
        let mut s = PrefixSearch::default();
        let mut total = 0;
        for (i, ratio) in [2.0f64, 3.3, 5.0, 3.1, 2.9, 8.0].into_iter().enumerate() {
            // Output grows in steps of 4 bytes every few input bytes, plus a header.
            let size = |n: usize| 18 + ((n as f64 / ratio) as usize / 4) * 4;
            let cap = 4096 << (i % 3);
            let len = cap * 10;
            let (c, w, trials) = run(&mut s, len, cap, size);
            let exact = best(len, cap, size);
            assert_eq!(w, size(c));
            assert!(w <= cap);
            assert!(exact - c <= (exact >> 11).max(1) + 8, "{c} vs {exact}");
            assert!(trials <= 12, "{trials} trials");
            total += trials;
        }
        assert!(total <= 6 * 8, "{total} trials in all");
    }

    #[test]
    fn a_looser_stop_takes_fewer_trials_and_stays_within_its_slack() {
        // A noisy, nearly linear size: what one-shot compression of text looks like.
        let size = |n: usize| 20 + n * 10 / 31 + (n.wrapping_mul(2_654_435_761) >> 7) % 5;
        let (mut tight, mut loose) = (PrefixSearch::default(), PrefixSearch::with_slack(13, 4));
        let (mut t_trials, mut l_trials) = (0, 0);
        for cap in [4096usize, 8192, 16384] {
            for len in [cap * 5, cap * 5 + 777, cap * 7 + 123] {
                let (tc, tw, tt) = run(&mut tight, len, cap, size);
                let (lc, lw, lt) = run(&mut loose, len, cap, size);
                assert!(tw <= cap && lw <= cap);
                assert_eq!((tw, lw), (size(tc), size(lc)));
                // Loose: at most 4 bytes unused, unless the bracket closed first (the noise
                // puts the best prefix up to a step past it).
                let exact = best(len, cap, size);
                assert!(
                    cap - lw <= 4 || exact - lc <= (exact >> 11).max(1) + 8,
                    "{lc} {lw} exact {exact}"
                );
                assert!(lc + 40 >= tc, "{lc} vs {tc}");
                (t_trials, l_trials) = (t_trials + tt, l_trials + lt);
            }
        }
        assert!(l_trials < t_trials, "{l_trials} vs {t_trials} trials");
    }

    #[test]
    fn whole_input_when_it_fits() {
        let mut s = PrefixSearch::default();
        let (c, w, trials) = run(&mut s, 5000, 4096, |n| n / 4 + 10);
        assert_eq!((c, w, trials), (5000, 1260, 1));
    }

    #[test]
    fn incompressible_input_gives_up_fast() {
        let mut s = PrefixSearch::default();
        let (c, w, trials) = run(&mut s, 1 << 20, 4096, |n| n + 9);
        assert_eq!((c, w), (0, 0));
        assert!(trials <= 2, "{trials}");
        // The next call starts at the smallest useful prefix: one trial.
        let (c, _, trials) = run(&mut s, 1 << 20, 4096, |n| n + 9);
        assert_eq!((c, trials), (0, 1));
        // Barely compressible: a prefix a little longer than cap is still found.
        let (c, w, _) = run(&mut s, 1 << 20, 4096, |n| n * 15 / 16 + 9);
        assert!(c > 4096 && w <= 4096, "{c} {w}");
    }

    #[test]
    fn short_incompressible_input() {
        let mut s = PrefixSearch::default();
        // Shorter than cap but does not fit whole: nothing useful.
        assert_eq!(run(&mut s, 4090, 4096, |n| n + 9).0, 0);
        assert_eq!(run(&mut s, 0, 4096, |n| n + 9).0, 0);
    }

    #[test]
    fn a_refit_starts_from_the_whole_and_stops_within_its_slack() {
        let mut s = PrefixSearch::default();
        let (mut total, mut fresh) = (0, 0);
        // A file whose start compresses worse than its end (headers, then tables): the
        // whole's ratio overestimates what fits.
        for (len, cap) in [(31_040, 8192), (12_569, 4096), (216_591, 118_784)] {
            // Plus a jitter of a few bytes, as real codecs show from byte to byte.
            let size = |n: usize| {
                let head = n.min(len / 3);
                let jitter = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61;
                20 + head / 2 + (n - head) / 5 + jitter as usize
            };
            let (c, w, trials) = refit(&mut s, len, cap, size);
            assert_eq!(w, size(c));
            assert!(w <= cap, "{w} > {cap}");
            let slack = (cap >> REFIT_SLACK_SHIFT).max(REFIT_MIN_SLACK);
            let exact = best(len, cap, size);
            // Within the slack (in output bytes) of the best prefix, in a few trials.
            assert!(
                size(exact).saturating_sub(w) <= slack,
                "{c} vs {exact}: {w} vs {}",
                size(exact)
            );
            assert!(trials <= 4, "{trials} trials for {len} into {cap}");
            // Fresh searches for the same capacities need more.
            total += trials;
            fresh += run(&mut PrefixSearch::default(), len, cap, size).2;
        }
        assert!(
            total < fresh,
            "refits {total} trials, fresh searches {fresh}"
        );
        // Nothing longer than the capacity fits: no refit.
        assert_eq!(refit(&mut s, 5000, 4096, |n| n + 9).0, 0);
    }

    #[test]
    fn codec_errors_end_the_search() {
        let mut s = PrefixSearch::default();
        let src = vec![0u8; 100_000];
        let mut dst = vec![0u8; 4096];
        assert_eq!(s.run(&src, &mut dst, 200_000, |_, _| None), (0, 0));
    }
}

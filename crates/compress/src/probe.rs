//! A cheap look at data before (and after) handing it to a codec: does it clearly not
//! compress (random bytes, compressed archives, media), or clearly compress?
//!
//! Why: a fixed-output codec spends as much on a pcluster of random bytes as on one of
//! text (liblz4's HC match search at level 9 runs at ~30 MB/s on random input, LZMA at
//! ~5 MB/s), only to learn that storing the data is as good. The probe costs a few
//! microseconds per 4 KiB, so the builder can store such data as it is without asking
//! the codec, and, when the codec did fail on a pcluster, store the whole stretch it
//! examined instead of one block at a time.
//!
//! What it measures, per 4 KiB chunk:
//! - **repeats**: bytes covered by verified matches against the chunk itself and the
//!   chunks before it in the same call (a 4096-entry hash table of every position, looked
//!   up at every 4th: every repeat of 7 bytes or more is found). LZ77
//!   codecs gain only from repeats.
//! - **order-0 entropy**: what an ideal order-0 entropy coder would save (from the byte
//!   histogram, `n*8 - sum c*log2(n/c)` bits). DEFLATE, Zstandard and LZMA gain from a
//!   skewed byte distribution too; LZ4 does not.
//!
//! Random bytes show no repeats and an order-0 saving of about 0.56 % per 4 KiB (the
//! estimator's bias: `255 / (2 n ln 2)` bits per byte) with a standard deviation near
//! 0.05 %. A chunk is *clearly incompressible* below 0.4 % repeats and below 0.8 %
//! order-0 saving, for every codec: a skewed byte distribution without 4-byte repeats
//! (encoding tables, base64) often holds shorter or sparser matches LZ4 still uses, so
//! it is left to the codec. It is *clearly compressible* from 6 % repeats or, for
//! entropy coders, 6 % order-0 saving. Between the two the codec decides.
//!
//! The probe sees no further than the chunks it is given: random bytes that are
//! repeated later (tables in binaries) compress in a pcluster that holds both copies.
//! The builder therefore hands the codec the last pcluster of every incompressible run
//! together with what follows it.

use crate::Algorithm;

/// Bytes judged at once: enough samples for a stable entropy estimate.
pub const CHUNK: usize = 4096;
const HASH_BITS: u32 = 12;
const MIN_MATCH: usize = 4;

/// How a chunk looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Incompressible,
    Unclear,
    Compressible,
}

/// Reusable probe state (a hash table; no allocation per call).
pub struct Probe {
    /// (position, the 4 bytes there): positions stored as `pos + base + 1` (0: empty);
    /// entries `<= base` are from earlier calls and count as empty, so the table is
    /// never cleared. The bytes let a lookup reject a miss without touching the data.
    table: Vec<(u32, u32)>,
    base: u32,
    entropy_coded: bool,
}

impl Probe {
    /// A probe for data that `alg` will compress (LZ4 gains from repeats only).
    pub fn new(alg: Algorithm) -> Self {
        Probe {
            table: vec![(0, 0); 1 << HASH_BITS],
            base: 0,
            entropy_coded: alg != Algorithm::Lz4,
        }
    }

    /// Bytes (a multiple of [`CHUNK`], at most `limit`) from the start of `data` that are
    /// clearly incompressible, chunk by chunk; repeats are looked for across all of
    /// them, so a random chunk seen twice ends the run.
    pub fn incompressible_prefix(&mut self, data: &[u8], limit: usize) -> usize {
        self.run(data, limit, Verdict::Incompressible)
    }

    /// Bytes (a multiple of [`CHUNK`], at most `limit`) from the start of `data` before
    /// the first chunk that is clearly compressible.
    pub fn until_compressible(&mut self, data: &[u8], limit: usize) -> usize {
        self.run(data, limit, Verdict::Compressible)
    }

    /// Whole chunks from the start of `data[..limit]` while each one's verdict is
    /// `Incompressible` (`want == Incompressible`), or is not `Compressible`.
    fn run(&mut self, data: &[u8], limit: usize, want: Verdict) -> usize {
        let data = &data[..limit.min(data.len())];
        // Positions are u32 offsets within this call; keep the sum in range.
        let len = data.len().min(1 << 30);
        let span = u32::try_from(len).unwrap_or(u32::MAX);
        if self
            .base
            .checked_add(span)
            .and_then(|v| v.checked_add(2))
            .is_none()
        {
            self.table.fill((0, 0));
            self.base = 0;
        }
        let mut done = 0;
        // Bounded: each pass consumes one chunk.
        while done + CHUNK <= len {
            let v = self.judge(data, done, done + CHUNK, want);
            let keep = match want {
                Verdict::Incompressible => v == Verdict::Incompressible,
                _ => v != Verdict::Compressible,
            };
            if !keep {
                break;
            }
            done += CHUNK;
        }
        self.base = self.base.saturating_add(span).saturating_add(1);
        done
    }

    /// The verdict on `data[start..end]`, with `data[..start]` as history for repeats.
    /// When only `Incompressible` matters (`want`), a skewed chunk is `Unclear` at once.
    fn judge(&mut self, data: &[u8], start: usize, end: usize, want: Verdict) -> Verdict {
        let n = end - start;
        // Order-0 first: a histogram costs far less than the repeat scan.
        let entropy_saving = order0_saving(&data[start..end]);
        if self.entropy_coded && entropy_saving >= n / 16 {
            return Verdict::Compressible;
        }
        // A skewed byte distribution also marks structured data (tables, encodings)
        // in which LZ4 finds matches the probe's sampled hash misses, so it keeps any
        // codec from the shortcut; only entropy coders count it as compressible.
        if entropy_saving > n / 96 && want == Verdict::Incompressible {
            return Verdict::Unclear;
        }
        let matched = self.repeats(data, start, end, n / 16);
        if matched >= n / 16 {
            Verdict::Compressible
        } else if matched <= n / 256 && entropy_saving <= n / 96 {
            Verdict::Incompressible
        } else {
            Verdict::Unclear
        }
    }

    /// Bytes of `data[start..end]` covered by verified repeats (stops counting at
    /// `enough`). Every position is remembered and every 4th looked up, so every repeat
    /// of at least 7 bytes is found (and some shorter ones); one 8-byte load serves four
    /// positions.
    fn repeats(&mut self, data: &[u8], start: usize, end: usize, enough: usize) -> usize {
        let mask = (1usize << HASH_BITS) - 1;
        let hash = |w: u32| ((w.wrapping_mul(0x9E37_79B1) >> (32 - HASH_BITS)) as usize) & mask;
        let base = self.base;
        let mut matched = 0usize;
        let mut i = start;
        // Bounded: `i` grows by at least 4 every pass.
        while i + 8 <= end {
            let mut word = [0u8; 8];
            word.copy_from_slice(&data[i..i + 8]);
            let w = u64::from_le_bytes(word);
            // Look up position `i`, then remember `i..i + 4`.
            let v = w as u32;
            let (prev, seen) = self.table[hash(v)];
            let hit = (prev > base && seen == v).then(|| ((prev - base - 1) as usize, i));
            for k in 0..4u32 {
                let v = (w >> (8 * k)) as u32;
                // `i` < 2^30 (see `run`), so the sum fits.
                self.table[hash(v)] = (base + i as u32 + k + 1, v);
            }
            match hit {
                Some((p, q)) => {
                    let mut l = MIN_MATCH;
                    while q + l < end && data[p + l] == data[q + l] {
                        l += 1;
                    }
                    matched += l;
                    if matched >= enough {
                        return matched;
                    }
                    i = q + l;
                }
                None => i += 4,
            }
        }
        matched
    }
}

/// `c * log2(c)` for every count a chunk can hold.
fn clogc() -> &'static [f64] {
    static T: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        (0..=CHUNK)
            .map(|c| {
                if c == 0 {
                    0.0
                } else {
                    c as f64 * (c as f64).log2()
                }
            })
            .collect()
    })
}

/// Bytes an ideal order-0 coder saves on `chunk` (rounded down).
fn order0_saving(chunk: &[u8]) -> usize {
    if chunk.is_empty() {
        return 0;
    }
    // Four interleaved histograms break the store-to-load dependency on repeated bytes.
    let mut h = [[0u32; 256]; 4];
    let mut quads = chunk.chunks_exact(4);
    for q in &mut quads {
        h[0][usize::from(q[0])] += 1;
        h[1][usize::from(q[1])] += 1;
        h[2][usize::from(q[2])] += 1;
        h[3][usize::from(q[3])] += 1;
    }
    for &b in quads.remainder() {
        h[0][usize::from(b)] += 1;
    }
    let n = chunk.len() as f64;
    let t = clogc();
    // sum c*log2(n/c) = n*log2(n) - sum c*log2(c)
    let mut sum = 0.0f64;
    for (((a, b), c), d) in h[0].iter().zip(&h[1]).zip(&h[2]).zip(&h[3]) {
        let c = (a + b + c + d) as usize;
        sum += t
            .get(c)
            .copied()
            .unwrap_or_else(|| c as f64 * (c as f64).log2());
    }
    let bits = n * n.log2() - sum;
    let saved = n - bits / 8.0;
    if saved > 0.0 {
        saved as usize
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(len: usize, seed: u64) -> Vec<u8> {
        // xorshift64*: deterministic and good enough for a byte stream.
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn random_bytes_are_incompressible_for_every_codec() {
        let data = random(256 << 10, 7);
        for alg in [
            Algorithm::Lz4,
            Algorithm::Zstd,
            Algorithm::Lzma,
            Algorithm::Deflate,
        ] {
            let mut p = Probe::new(alg);
            assert_eq!(
                p.incompressible_prefix(&data, data.len()),
                data.len(),
                "{alg:?}"
            );
            // A limit that is not a multiple of the chunk: whole chunks only.
            assert_eq!(p.incompressible_prefix(&data, 3 * CHUNK + 100), 3 * CHUNK);
            assert_eq!(p.until_compressible(&data, data.len()), data.len());
        }
    }

    #[test]
    fn text_zeros_and_repeats_are_compressible() {
        let text: Vec<u8> = b"fn main() { println!(\"hello, world\"); }\n"
            .iter()
            .copied()
            .cycle()
            .take(64 << 10)
            .collect();
        let zeros = vec![0u8; 64 << 10];
        for alg in [Algorithm::Lz4, Algorithm::Zstd] {
            let mut p = Probe::new(alg);
            assert_eq!(p.incompressible_prefix(&text, text.len()), 0);
            assert_eq!(p.until_compressible(&text, text.len()), 0);
            assert_eq!(p.incompressible_prefix(&zeros, zeros.len()), 0);
            assert_eq!(p.until_compressible(&zeros, zeros.len()), 0);
        }
        // Random chunks, then the first of them again: the run ends at the repeat.
        let r = random(3 * CHUNK, 9);
        let mut data = r.clone();
        data.extend_from_slice(&r[..CHUNK]);
        data.extend_from_slice(&random(CHUNK, 10));
        let mut p = Probe::new(Algorithm::Lz4);
        assert_eq!(p.incompressible_prefix(&data, data.len()), 3 * CHUNK);
        assert_eq!(p.until_compressible(&data, data.len()), 3 * CHUNK);
        // The history of an earlier call does not leak into the next one: alone, the
        // repeated chunk is random.
        assert_eq!(p.incompressible_prefix(&data[3 * CHUNK..], CHUNK), CHUNK);
        assert_eq!(p.incompressible_prefix(&r, r.len()), 3 * CHUNK);
        assert_eq!(p.incompressible_prefix(&r, r.len()), 3 * CHUNK);
    }

    #[test]
    fn skewed_bytes_depend_on_the_codec() {
        // Random bytes drawn from 64 symbols (base64-like): no repeats to speak of, but
        // 2 bits per byte for an entropy coder. For LZ4 the skew only means "structured,
        // let the codec decide" (it is not skipped); for entropy coders it compresses.
        let data: Vec<u8> = random(64 << 10, 3)
            .iter()
            .map(|b| b'A' + (b & 63))
            .collect();
        let mut lz4 = Probe::new(Algorithm::Lz4);
        let mut zstd = Probe::new(Algorithm::Zstd);
        assert_eq!(lz4.incompressible_prefix(&data, data.len()), 0);
        assert_eq!(lz4.until_compressible(&data, data.len()), data.len());
        assert_eq!(zstd.incompressible_prefix(&data, data.len()), 0);
        assert_eq!(zstd.until_compressible(&data, data.len()), 0);
    }

    #[test]
    fn mildly_skewed_bytes_are_left_to_the_codec() {
        // 1 byte in 16 is zero: an entropy coder saves ~3 %, LZ4 little.
        let data: Vec<u8> = random(64 << 10, 5)
            .chunks(16)
            .flat_map(|c| {
                let mut v = c.to_vec();
                v[0] = 0;
                v
            })
            .collect();
        let mut zstd = Probe::new(Algorithm::Zstd);
        assert_eq!(zstd.incompressible_prefix(&data, data.len()), 0);
        assert_eq!(zstd.until_compressible(&data, data.len()), data.len());
    }

    #[test]
    fn short_input() {
        let mut p = Probe::new(Algorithm::Lz4);
        assert_eq!(p.incompressible_prefix(&[], 100), 0);
        assert_eq!(p.incompressible_prefix(&random(CHUNK - 1, 1), CHUNK), 0);
        assert_eq!(p.until_compressible(&random(100, 1), 100), 0);
    }
}

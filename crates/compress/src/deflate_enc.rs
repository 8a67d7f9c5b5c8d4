//! A fixed-output DEFLATE encoder: it parses the input once and cuts the stream where
//! the pcluster is full, instead of searching for the longest prefix with repeated
//! one-shot compressions (search.rs, still used for libdeflate's levels 10-12).
//!
//! How it works, per call (each pcluster is an independent raw DEFLATE stream):
//!
//! 1. **Parse.** A hash-chain match finder (a 4-byte hash with chains, plus a 3-byte
//!    hash holding only the newest position) feeds a greedy, lazy or "lazy2" parser
//!    (look one or two positions ahead for a better match before taking one), the same
//!    family of parsers as zlib's and libdeflate's levels 1-9. The parse is a list of
//!    items (literal byte or length/distance pair); per block the parser keeps symbol
//!    counts and the number of extra bits.
//! 2. **Cost exactly.** The exact size of a dynamic-Huffman block for a prefix of the
//!    items follows from its counts: build the length-limited Huffman codes for them,
//!    price the header (code-length code and run-length coded lengths) and the data.
//!    That takes microseconds, independent of the input length.
//! 3. **Cut.** While parsing, a running estimate (each item priced with the code
//!    lengths of the last exact costing) says when the pcluster is nearly full; from then
//!    on exact costings at shrinking intervals close in on the budget, and once a
//!    costing overshoots, a bisection over the few items since the last fitting costing
//!    finds the longest item prefix whose stream fits. Nothing past the cut is emitted:
//!    the stream ends there with a final block, and the next pcluster starts afresh.
//! 4. **Blocks.** For big pclusters the parse is cut into blocks where that pays:
//!    every [`SPLIT_ITEMS`] items the encoder compares one block for everything since
//!    the block start against two blocks (the block so far, and the new items alone),
//!    with exact costs, and closes the block when two are smaller.
//!
//! Every stream is emitted with the code lengths that were costed, so its size is known
//! before it is written (checked in debug builds).

/// Largest distance DEFLATE can express (windowbits 15).
const WINDOW: usize = 32768;
const WMASK: usize = WINDOW - 1;
const MIN_MATCH: usize = 3;
const MAX_MATCH: usize = 258;
const HASH4_BITS: u32 = 16;
const HASH3_BITS: u32 = 14;
/// Items between block-split decisions (big pclusters only).
const SPLIT_ITEMS: usize = 4096;
/// Split decisions are made only for budgets of at least this many bytes.
const SPLIT_MIN_BUDGET: usize = 16 << 10;

/// Literal/length alphabet size (0-255 literals, 256 end of block, 257-285 lengths).
const NUM_LL: usize = 286;
const NUM_D: usize = 30;
const NUM_CL: usize = 19;
const EOB: usize = 256;

const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// Extra bits after code-length symbols 16 (repeat), 17 and 18 (zero runs).
const CL_EXTRA: [u8; NUM_CL] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 7];
/// The order in which code-length code lengths are sent (RFC 1951 §3.2.7).
const CL_ORDER: [usize; NUM_CL] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Search settings of a level.
#[derive(Clone, Copy, Debug)]
struct Params {
    /// Chain links followed per search.
    depth: u32,
    /// A match this long is taken at once.
    nice: usize,
    /// 0 greedy, 1 lazy, 2 lazy2.
    lazy: u8,
}

fn params(level: i32) -> Params {
    let (depth, nice, lazy) = match level {
        ..=1 => (4, 16, 0),
        2 => (6, 12, 0),
        3 => (12, 16, 0),
        4 => (16, 30, 0),
        5 => (16, 30, 1),
        6 => (35, 65, 1),
        7 => (100, 130, 1),
        8 => (300, MAX_MATCH, 2),
        _ => (600, MAX_MATCH, 2),
    };
    Params { depth, nice, lazy }
}

/// One parsed item: a literal (`dist == 0`, `len` = the byte) or a match.
#[derive(Clone, Copy)]
struct Item {
    len: u16,
    dist: u16,
}

impl Item {
    fn lit(b: u8) -> Item {
        Item {
            len: u16::from(b),
            dist: 0,
        }
    }

    fn input_len(self) -> usize {
        if self.dist == 0 {
            1
        } else {
            usize::from(self.len)
        }
    }
}

/// Symbol counts of a run of items.
#[derive(Clone)]
struct Freqs {
    ll: [u32; NUM_LL],
    d: [u32; NUM_D],
    /// Length and distance extra bits.
    extra: u64,
}

impl Default for Freqs {
    fn default() -> Self {
        Freqs {
            ll: [0; NUM_LL],
            d: [0; NUM_D],
            extra: 0,
        }
    }
}

/// What an item codes as: its literal/length symbol, its distance slot (None for a
/// literal) and its extra bits.
#[derive(Clone, Copy)]
struct Syms {
    ll: usize,
    d: Option<usize>,
    extra: u64,
}

impl Freqs {
    #[inline]
    fn add(&mut self, s: Syms) {
        self.ll[s.ll] += 1;
        if let Some(d) = s.d {
            self.d[d] += 1;
        }
        self.extra += s.extra;
    }

    #[inline]
    fn sub(&mut self, s: Syms) {
        self.ll[s.ll] -= 1;
        if let Some(d) = s.d {
            self.d[d] -= 1;
        }
        self.extra -= s.extra;
    }
}

struct Tables {
    len_slot: [u8; MAX_MATCH + 1],
    /// Distance slot of `d - 1` for `d - 1 < 256`, then of `(d - 1) >> 7` + 256.
    dist_slot: [u8; 512],
}

impl Tables {
    fn new() -> Self {
        let mut len_slot = [0u8; MAX_MATCH + 1];
        for (slot, &base) in LEN_BASE.iter().enumerate() {
            let n = 1usize << LEN_EXTRA[slot];
            let lo = usize::from(base);
            let hi = (lo + n).min(MAX_MATCH + 1);
            len_slot[lo..hi].iter_mut().for_each(|s| *s = slot as u8);
        }
        // 258 has a slot of its own (284 would also cover it, with 5 extra bits).
        len_slot[MAX_MATCH] = 28;
        let mut dist_slot = [0u8; 512];
        for (slot, &base) in DIST_BASE.iter().enumerate() {
            let lo = usize::from(base) - 1;
            let hi = lo + (1usize << DIST_EXTRA[slot]);
            for d in lo..hi {
                if d < 256 {
                    dist_slot[d] = slot as u8;
                } else if d & 127 == 0 {
                    dist_slot[256 + (d >> 7)] = slot as u8;
                }
            }
        }
        Tables {
            len_slot,
            dist_slot,
        }
    }

    #[inline]
    fn dslot(&self, dist: usize) -> usize {
        let d = dist - 1;
        if d < 256 {
            usize::from(self.dist_slot[d])
        } else {
            usize::from(self.dist_slot[256 + (d >> 7)])
        }
    }

    /// Length slot (symbol - 257) of a match.
    #[inline]
    fn lslot(&self, len: u16) -> usize {
        usize::from(self.len_slot[usize::from(len)])
    }

    #[inline]
    fn syms(&self, it: Item) -> Syms {
        if it.dist == 0 {
            return Syms {
                ll: usize::from(it.len),
                d: None,
                extra: 0,
            };
        }
        let ls = self.lslot(it.len);
        let ds = self.dslot(usize::from(it.dist));
        Syms {
            ll: 257 + ls,
            d: Some(ds),
            extra: u64::from(LEN_EXTRA[ls]) + u64::from(DIST_EXTRA[ds]),
        }
    }

    /// Counts of `items`.
    fn freqs(&self, items: &[Item]) -> Freqs {
        let mut f = Freqs::default();
        for &it in items {
            f.add(self.syms(it));
        }
        f
    }
}

/// Huffman code lengths for `freqs`, at most `limit` bits, into `lens` (0 = unused).
/// The code is complete; a single used symbol gets a partner so that it is (every
/// inflater accepts complete codes). `scratch` avoids allocations.
fn huffman_lengths(freqs: &[u32], limit: usize, lens: &mut [u8], scratch: &mut Vec<u64>) {
    lens.iter_mut().for_each(|l| *l = 0);
    scratch.clear();
    for (sym, &f) in freqs.iter().enumerate() {
        if f != 0 {
            scratch.push((u64::from(f) << 16) | sym as u64);
        }
    }
    match scratch.len() {
        0 => {
            lens[0] = 1;
            lens[1] = 1;
            return;
        }
        1 => {
            let s = (scratch[0] & 0xFFFF) as usize;
            lens[s] = 1;
            lens[if s == 0 { 1 } else { 0 }] = 1;
            return;
        }
        _ => {}
    }
    scratch.sort_unstable();
    let n = scratch.len();
    // Code lengths of the sorted weights, in place (Moffat & Katajainen, "In-place
    // calculation of minimum-redundancy codes", 1995): w[i] becomes the length of the
    // i-th lightest symbol. Symbols stay in `order`.
    let mut w: [u64; NUM_LL] = [0; NUM_LL];
    let mut order: [u16; NUM_LL] = [0; NUM_LL];
    for (i, &v) in scratch.iter().enumerate() {
        w[i] = v >> 16;
        order[i] = (v & 0xFFFF) as u16;
    }
    let w = &mut w[..n];
    // Phase 1: internal node weights, parents as indices.
    w[0] += w[1];
    let (mut root, mut leaf) = (0usize, 2usize);
    for next in 1..n - 1 {
        if leaf >= n || w[root] < w[leaf] {
            w[next] = w[root];
            w[root] = next as u64;
            root += 1;
        } else {
            w[next] = w[leaf];
            leaf += 1;
        }
        if leaf >= n || (root < next && w[root] < w[leaf]) {
            w[next] += w[root];
            w[root] = next as u64;
            root += 1;
        } else {
            w[next] += w[leaf];
            leaf += 1;
        }
    }
    // Phase 2: depths of internal nodes.
    w[n - 2] = 0;
    for next in (0..n - 2).rev() {
        w[next] = w[w[next] as usize] + 1;
    }
    // Phase 3: leaf depths, deepest first.
    let (mut avail, mut used, mut depth) = (1i64, 0i64, 0u64);
    let mut root = n as i64 - 2;
    let mut next = n as i64 - 1;
    while avail > 0 {
        while root >= 0 && w[root as usize] == depth {
            used += 1;
            root -= 1;
        }
        while avail > used {
            w[next as usize] = depth;
            next -= 1;
            avail -= 1;
        }
        avail = 2 * used;
        depth += 1;
        used = 0;
    }
    // Count per length; w is non-increasing in length from index 0 upward.
    let mut count = [0u32; NUM_LL + 1];
    let mut max = 0usize;
    for &l in w.iter() {
        let l = l as usize;
        count[l] += 1;
        max = max.max(l);
    }
    if max > limit {
        // Limit the lengths keeping the code complete (JPEG, ITU T.81 Annex K.3).
        let mut i = max;
        while i > limit {
            while count[i] > 0 {
                let mut j = i - 2;
                while j > 1 && count[j] == 0 {
                    j -= 1;
                }
                if count[j] == 0 {
                    break; // not a complete tree: cannot happen
                }
                count[i] -= 2;
                count[i - 1] += 1;
                count[j + 1] += 2;
                count[j] -= 1;
            }
            i -= 1;
        }
        max = limit;
    }
    // Lightest symbols get the longest codes.
    let mut k = 0;
    for l in (1..=max).rev() {
        for _ in 0..count[l] {
            lens[usize::from(order[k])] = l as u8;
            k += 1;
        }
    }
}

/// Canonical codes (bit-reversed, for LSB-first output) of `lens` into `codes`.
fn canonical_codes(lens: &[u8], codes: &mut [u16]) {
    let mut count = [0u16; 16];
    for &l in lens {
        count[usize::from(l)] += 1;
    }
    count[0] = 0;
    let mut next = [0u16; 16];
    let mut code = 0u16;
    for bits in 1..16 {
        code = (code + count[bits - 1]) << 1;
        next[bits] = code;
    }
    for (sym, &l) in lens.iter().enumerate() {
        if l != 0 {
            let c = next[usize::from(l)];
            next[usize::from(l)] += 1;
            codes[sym] = c.reverse_bits() >> (16 - u16::from(l));
        }
    }
}

/// The plan of one dynamic block: code lengths, the coded header, its size.
struct Plan {
    ll_lens: [u8; NUM_LL],
    d_lens: [u8; NUM_D],
    cl_lens: [u8; NUM_CL],
    /// Run-length coded code lengths: (symbol 0..=18, extra bits value).
    rle: Vec<(u8, u8)>,
    hlit: usize,
    hdist: usize,
    hclen: usize,
    scratch: Vec<u64>,
}

impl Plan {
    fn new() -> Self {
        Plan {
            ll_lens: [0; NUM_LL],
            d_lens: [0; NUM_D],
            cl_lens: [0; NUM_CL],
            rle: Vec::with_capacity(NUM_LL + NUM_D),
            hlit: 257,
            hdist: 1,
            hclen: 4,
            scratch: Vec::with_capacity(NUM_LL),
        }
    }

    /// Plan a block for `f` (plus one end-of-block symbol); returns its size in bits.
    fn make(&mut self, f: &Freqs) -> u64 {
        let mut ll = f.ll;
        ll[EOB] += 1;
        huffman_lengths(&ll, 15, &mut self.ll_lens, &mut self.scratch);
        huffman_lengths(&f.d, 15, &mut self.d_lens, &mut self.scratch);
        self.hlit = 257.max(
            self.ll_lens
                .iter()
                .rposition(|&l| l != 0)
                .map_or(0, |p| p + 1),
        );
        self.hdist = 1.max(
            self.d_lens
                .iter()
                .rposition(|&l| l != 0)
                .map_or(0, |p| p + 1),
        );
        // Run-length code the concatenated lengths (runs may cross from one to the other).
        self.rle.clear();
        let mut cl_freq = [0u32; NUM_CL];
        let all = self.ll_lens[..self.hlit]
            .iter()
            .chain(self.d_lens[..self.hdist].iter());
        let mut run_val = u8::MAX;
        let mut run = 0usize;
        let mut flush = |v: u8, mut r: usize, rle: &mut Vec<(u8, u8)>| {
            if v == 0 {
                while r >= 11 {
                    let k = r.min(138);
                    rle.push((18, (k - 11) as u8));
                    cl_freq[18] += 1;
                    r -= k;
                }
                if r >= 3 {
                    rle.push((17, (r - 3) as u8));
                    cl_freq[17] += 1;
                    r = 0;
                }
            } else if r >= 4 {
                rle.push((v, 0));
                cl_freq[usize::from(v)] += 1;
                r -= 1;
                while r >= 3 {
                    let k = r.min(6);
                    rle.push((16, (k - 3) as u8));
                    cl_freq[16] += 1;
                    r -= k;
                }
            }
            for _ in 0..r {
                rle.push((v, 0));
                cl_freq[usize::from(v)] += 1;
            }
        };
        for &l in all {
            if l == run_val {
                run += 1;
            } else {
                if run > 0 {
                    flush(run_val, run, &mut self.rle);
                }
                run_val = l;
                run = 1;
            }
        }
        flush(run_val, run, &mut self.rle);
        huffman_lengths(&cl_freq, 7, &mut self.cl_lens, &mut self.scratch);
        self.hclen = 4.max(
            CL_ORDER
                .iter()
                .rposition(|&s| self.cl_lens[s] != 0)
                .map_or(0, |p| p + 1),
        );
        let mut bits: u64 = 3 + 5 + 5 + 4 + 3 * self.hclen as u64;
        for (s, &n) in cl_freq.iter().enumerate() {
            bits += u64::from(n) * (u64::from(self.cl_lens[s]) + u64::from(CL_EXTRA[s]));
        }
        for (s, &n) in ll.iter().enumerate() {
            bits += u64::from(n) * u64::from(self.ll_lens[s]);
        }
        for (s, &n) in f.d.iter().enumerate() {
            bits += u64::from(n) * u64::from(self.d_lens[s]);
        }
        bits + f.extra
    }
}

/// LSB-first bit writer.
struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    #[inline]
    fn put(&mut self, v: u32, bits: u32) {
        debug_assert!(bits <= 32 && (bits == 32 || v >> bits == 0));
        self.acc |= u64::from(v) << self.n;
        self.n += bits;
        if self.n >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.n -= 32;
        }
    }

    fn finish(&mut self) {
        while self.n > 0 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n = self.n.saturating_sub(8);
        }
    }

    fn bits(&self) -> u64 {
        self.out.len() as u64 * 8 + u64::from(self.n)
    }
}

/// Hash-chain match finder over one call's input. Positions are stored as
/// `pos + base`; `base` moves past the previous call's positions at each call, so
/// entries of earlier calls read as stale (below `base`) without clearing the tables.
struct MatchFinder {
    head4: Vec<u32>,
    head3: Vec<u32>,
    prev: Vec<u32>,
    base: u32,
    /// Length of the current call's input (its positions are `base..base + len`).
    len: u32,
}

#[inline]
fn load4(s: &[u8], p: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&s[p..p + 4]);
    u32::from_le_bytes(b)
}

#[inline]
fn load8(s: &[u8], p: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s[p..p + 8]);
    u64::from_le_bytes(b)
}

/// Length of the common prefix of `s[a..]` and `s[b..]`, at most `max` (a < b,
/// b + max <= s.len()).
#[inline]
fn match_len(s: &[u8], a: usize, b: usize, max: usize) -> usize {
    let mut n = 0;
    while n + 8 <= max {
        let x = load8(s, a + n) ^ load8(s, b + n);
        if x != 0 {
            return n + (x.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    while n < max && s[a + n] == s[b + n] {
        n += 1;
    }
    n
}

impl MatchFinder {
    fn new() -> Self {
        MatchFinder {
            head4: vec![0; 1 << HASH4_BITS],
            head3: vec![0; 1 << HASH3_BITS],
            prev: vec![0; WINDOW],
            base: 1,
            len: 0,
        }
    }

    /// Start on a new input of `len` bytes (`len < 2^31`, checked by the caller).
    fn begin(&mut self, len: u32) {
        // Everything stored so far is below the new base; 0 stays "empty".
        let base = u64::from(self.base) + u64::from(self.len);
        if base + u64::from(len) > u64::from(u32::MAX) {
            self.head4.iter_mut().for_each(|v| *v = 0);
            self.head3.iter_mut().for_each(|v| *v = 0);
            self.base = 1;
        } else {
            self.base = base as u32;
        }
        self.len = len;
    }

    #[inline]
    fn h4(v: u32) -> usize {
        (v.wrapping_mul(0x1E35_A7BD) >> (32 - HASH4_BITS)) as usize
    }
    #[inline]
    fn h3(v: u32) -> usize {
        ((v << 8).wrapping_mul(0x1E35_A7BD) >> (32 - HASH3_BITS)) as usize
    }

    /// Insert `p` (needs 4 bytes at `p`) without searching.
    #[inline]
    fn insert(&mut self, s: &[u8], p: usize) {
        let v = load4(s, p);
        let tag = self.base + p as u32;
        self.head3[Self::h3(v)] = tag;
        let h = Self::h4(v);
        self.prev[p & WMASK] = self.head4[h];
        self.head4[h] = tag;
    }

    /// Longest match at `p` longer than `best` (at most `max` long), inserting `p`.
    /// Needs `p + 4 <= s.len()` and `4 <= max <= s.len() - p`. Returns (len, dist);
    /// len 0 if none.
    #[inline]
    fn find(
        &mut self,
        s: &[u8],
        p: usize,
        best: usize,
        max: usize,
        nice: usize,
        depth: u32,
    ) -> (usize, usize) {
        let v = load4(s, p);
        let tag = self.base + p as u32;
        let base = self.base;
        let (mut best_len, mut best_dist) = (best, 0usize);
        let i3 = Self::h3(v);
        let c3 = self.head3[i3];
        self.head3[i3] = tag;
        if best_len < 3 && c3 >= base {
            let c = (c3 - base) as usize;
            if p - c <= WINDOW && s[c] == s[p] && s[c + 1] == s[p + 1] && s[c + 2] == s[p + 2] {
                best_len = 3;
                best_dist = p - c;
            }
        }
        let h = Self::h4(v);
        let mut cand = self.head4[h];
        self.prev[p & WMASK] = cand;
        self.head4[h] = tag;
        let nice = nice.min(max);
        let mut depth = depth;
        // Chain links lead to ever older positions; a link that does not (a slot
        // reused by a position 32 KiB later) ends the walk.
        let mut last = p;
        while depth > 0 && cand >= base {
            let c = (cand - base) as usize;
            if c >= last || p - c > WINDOW {
                break;
            }
            last = c;
            let dist = p - c;
            // Quick reject: the byte that would make a longer match, and the first four.
            if best_len < max && s[c + best_len] == s[p + best_len] && load4(s, c) == v {
                let l = 4 + match_len(s, c + 4, p + 4, max - 4);
                if l > best_len {
                    best_len = l;
                    best_dist = dist;
                    if l >= nice {
                        break;
                    }
                }
            }
            cand = self.prev[c & WMASK];
            depth -= 1;
        }
        if best_dist != 0 {
            (best_len, best_dist)
        } else {
            (0, 0)
        }
    }
}

/// The encoder. Reusable across calls; holds no state that changes the output
/// across calls (each call is independent).
pub struct DeflateEncoder {
    p: Params,
    t: Tables,
    mf: MatchFinder,
    items: Vec<Item>,
    plan: Plan,
    /// Price per literal/length and distance symbol from the last exact costing.
    price_ll: [u8; NUM_LL],
    price_d: [u8; NUM_D],
    w: BitWriter,
}

impl DeflateEncoder {
    pub fn new(level: i32) -> Self {
        DeflateEncoder {
            p: params(level),
            t: Tables::new(),
            mf: MatchFinder::new(),
            items: Vec::new(),
            plan: Plan::new(),
            price_ll: [0; NUM_LL],
            price_d: [0; NUM_D],
            w: BitWriter {
                out: Vec::new(),
                acc: 0,
                n: 0,
            },
        }
    }

    fn default_prices(&mut self) {
        self.price_ll = [9; NUM_LL];
        self.price_d = [6; NUM_D];
    }

    fn take_prices(&mut self) {
        for (p, &l) in self.price_ll.iter_mut().zip(self.plan.ll_lens.iter()) {
            *p = if l == 0 { 14 } else { l };
        }
        for (p, &l) in self.price_d.iter_mut().zip(self.plan.d_lens.iter()) {
            *p = if l == 0 { 12 } else { l };
        }
    }

    #[inline]
    fn price(&self, s: Syms) -> u64 {
        u64::from(self.price_ll[s.ll]) + s.d.map_or(0, |d| u64::from(self.price_d[d])) + s.extra
    }

    /// Compress the longest prefix of `src` whose stream fits in `dst`; see
    /// [`crate::FixedOutputCompressor::compress_destsize`]. Returns (consumed, written).
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> (usize, usize) {
        let Some(len) = u32::try_from(src.len()).ok().filter(|&l| l < 1 << 31) else {
            return (0, 0);
        };
        if src.is_empty() || dst.is_empty() {
            return (0, 0);
        }
        let budget = dst.len() as u64 * 8;
        self.mf.begin(len);
        let Some((blocks, consumed)) = self.parse_and_cut(src, budget) else {
            return (0, 0);
        };
        // Same contract as the prefix search: a prefix that is not longer than the
        // space it takes is not worth it, and a short input goes whole or not at all.
        if (src.len() > dst.len() && consumed <= dst.len())
            || (src.len() <= dst.len() && consumed < src.len())
        {
            return (0, 0);
        }
        let written = self.emit(&blocks);
        if written > dst.len() {
            debug_assert!(false, "deflate: planned stream overflows");
            return (0, 0);
        }
        dst[..written].copy_from_slice(&self.w.out[..written]);
        (consumed, written)
    }

    /// Parse `src` and choose blocks: returns the item ranges of the blocks and the
    /// input length they cover, or None when nothing fits.
    fn parse_and_cut(&mut self, src: &[u8], budget: u64) -> Option<(Vec<(usize, usize)>, usize)> {
        let n = src.len();
        let p = self.p;
        self.items.clear();
        self.default_prices();
        let split = budget >= SPLIT_MIN_BUDGET as u64 * 8;
        let mut blocks: Vec<(usize, usize)> = Vec::new();
        let mut committed: u64 = 0; // bits of closed blocks
        let mut block_start = 0usize; // item index
        let mut bf = Freqs::default(); // counts of the open block
        let mut sf = Freqs::default(); // counts since the last split decision
        let mut seg_start = 0usize;
        let mut a_bits: u64 = 0; // cost of the open block up to seg_start
        let mut est: u64 = 0; // estimated size of the stream so far
                              // Items (from the block start) known to fit, and the estimated size at which
                              // the next exact costing is due.
        let mut fit_items = 0usize;
        let mut check_at = budget.saturating_sub((budget / 16).max(256));
        let mut pos = 0usize;
        // Whether the parse stopped because the budget is exhausted.
        let mut over = false;

        macro_rules! push {
            ($it:expr) => {{
                let it: Item = $it;
                self.items.push(it);
                let syms = self.t.syms(it);
                bf.add(syms);
                if split {
                    sf.add(syms);
                }
                est += self.price(syms);
            }};
        }

        while pos < n {
            // Exact costing when the estimate says the pcluster is nearly full.
            if est >= check_at {
                let k = self.items.len() - block_start;
                let bits = committed + self.plan.make(&bf);
                self.take_prices();
                if bits <= budget {
                    fit_items = k;
                    est = bits;
                    let slack = budget - bits;
                    check_at = if slack >= 64 {
                        budget - slack / 4
                    } else {
                        budget + 1
                    };
                } else {
                    over = true;
                    break;
                }
            }
            // Block split decision.
            if split && self.items.len() - seg_start >= SPLIT_ITEMS {
                let s_bits = self.plan.make(&sf);
                let as_bits = self.plan.make(&bf);
                if seg_start > block_start && a_bits + s_bits + 64 < as_bits {
                    blocks.push((block_start, seg_start));
                    committed += a_bits;
                    block_start = seg_start;
                    bf = sf.clone();
                    a_bits = s_bits;
                    // Known-fitting prefix is relative to the block start.
                    fit_items = 0;
                    est = committed + s_bits;
                } else {
                    a_bits = as_bits;
                }
                seg_start = self.items.len();
                sf = Freqs::default();
                if committed + a_bits > budget {
                    // Past the budget: cut inside the open block.
                    over = true;
                    break;
                }
            }
            // One parse step.
            if pos + 4 > n {
                push!(Item::lit(src[pos]));
                pos += 1;
                continue;
            }
            let max = (n - pos).min(MAX_MATCH);
            let (len, dist) = self.mf.find(src, pos, 2, max, p.nice, p.depth);
            if len < MIN_MATCH || (len == MIN_MATCH && dist > 8192) {
                push!(Item::lit(src[pos]));
                pos += 1;
                continue;
            }
            let (mut cl, mut cd, mut cp) = (len, dist, pos);
            let mut next = pos + 1; // next position not yet inserted
            if p.lazy > 0 {
                loop {
                    if cl >= p.nice || next + 4 > n {
                        break;
                    }
                    let max = (n - next).min(MAX_MATCH);
                    let (nl, nd) = self.mf.find(src, next, cl - 1, max, p.nice, p.depth / 2);
                    next += 1;
                    if nl >= cl && better(nl, nd, cl, cd, 2) {
                        push!(Item::lit(src[cp]));
                        (cl, cd, cp) = (nl, nd, next - 1);
                        continue;
                    }
                    if p.lazy > 1 && next + 4 <= n {
                        let max = (n - next).min(MAX_MATCH);
                        let (nl, nd) = self.mf.find(src, next, cl - 1, max, p.nice, p.depth / 4);
                        next += 1;
                        if nl >= cl && better(nl, nd, cl, cd, 6) {
                            push!(Item::lit(src[cp]));
                            push!(Item::lit(src[cp + 1]));
                            (cl, cd, cp) = (nl, nd, next - 1);
                            continue;
                        }
                    }
                    break;
                }
            }
            push!(Item {
                len: cl as u16,
                dist: cd as u16
            });
            let end = cp + cl;
            while next < end {
                if next + 4 <= n {
                    self.mf.insert(src, next);
                }
                next += 1;
            }
            pos = end;
        }
        let open_len = self.items.len() - block_start;
        if !over {
            // All input parsed: does all of it fit?
            let bits = committed + self.plan.make(&bf);
            if bits <= budget {
                blocks.push((block_start, self.items.len()));
                return Some((blocks, n));
            }
        }
        // Bisect (fit_items, open_len] for the longest fitting item prefix of the open
        // block: counts at `hi` are `bf`; walk them down to each probe.
        let (mut lo, mut hi) = (fit_items, open_len);
        let mut f = bf;
        let mut f_at = hi;
        let mut bound = 64;
        while hi - lo > 1 && bound > 0 {
            bound -= 1;
            let mid = lo + (hi - lo) / 2;
            while f_at > mid {
                f_at -= 1;
                f.sub(self.t.syms(self.items[block_start + f_at]));
            }
            while f_at < mid {
                f.add(self.t.syms(self.items[block_start + f_at]));
                f_at += 1;
            }
            if committed + self.plan.make(&f) <= budget {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        if lo == 0 && blocks.is_empty() {
            return None;
        }
        if lo > 0 {
            blocks.push((block_start, block_start + lo));
        }
        let end = block_start + lo;
        let consumed = self.items[..end].iter().map(|it| it.input_len()).sum();
        Some((blocks, consumed))
    }

    /// Write the blocks; returns the stream length in bytes (stream in `self.w.out`).
    fn emit(&mut self, blocks: &[(usize, usize)]) -> usize {
        self.w.out.clear();
        self.w.acc = 0;
        self.w.n = 0;
        let mut ll_codes = [0u16; NUM_LL];
        let mut d_codes = [0u16; NUM_D];
        let mut cl_codes = [0u16; NUM_CL];
        for (bi, &(a, b)) in blocks.iter().enumerate() {
            let f = self.t.freqs(&self.items[a..b]);
            let _planned = self.plan.make(&f);
            let start_bits = self.w.bits();
            let last = bi + 1 == blocks.len();
            let plan = &self.plan;
            canonical_codes(&plan.ll_lens, &mut ll_codes);
            canonical_codes(&plan.d_lens, &mut d_codes);
            canonical_codes(&plan.cl_lens, &mut cl_codes);
            let w = &mut self.w;
            w.put(u32::from(last), 1);
            w.put(2, 2);
            w.put((plan.hlit - 257) as u32, 5);
            w.put((plan.hdist - 1) as u32, 5);
            w.put((plan.hclen - 4) as u32, 4);
            for &s in &CL_ORDER[..plan.hclen] {
                w.put(u32::from(plan.cl_lens[s]), 3);
            }
            for &(s, x) in &plan.rle {
                let s = usize::from(s);
                w.put(u32::from(cl_codes[s]), u32::from(plan.cl_lens[s]));
                w.put(u32::from(x), u32::from(CL_EXTRA[s]));
            }
            for &it in &self.items[a..b] {
                if it.dist == 0 {
                    let s = usize::from(it.len);
                    w.put(u32::from(ll_codes[s]), u32::from(plan.ll_lens[s]));
                } else {
                    let l = usize::from(it.len);
                    let ls = self.t.lslot(it.len);
                    w.put(
                        u32::from(ll_codes[257 + ls]),
                        u32::from(plan.ll_lens[257 + ls]),
                    );
                    w.put(
                        (l - usize::from(LEN_BASE[ls])) as u32,
                        u32::from(LEN_EXTRA[ls]),
                    );
                    let d = usize::from(it.dist);
                    let ds = self.t.dslot(d);
                    w.put(u32::from(d_codes[ds]), u32::from(plan.d_lens[ds]));
                    w.put(
                        (d - usize::from(DIST_BASE[ds])) as u32,
                        u32::from(DIST_EXTRA[ds]),
                    );
                }
            }
            w.put(u32::from(ll_codes[EOB]), u32::from(plan.ll_lens[EOB]));
            debug_assert_eq!(
                w.bits() - start_bits,
                _planned,
                "block size differs from plan"
            );
        }
        self.w.finish();
        self.w.out.len()
    }
}

/// Whether a match (nl, nd) one or two positions later beats (cl, cd): longer counts
/// four points a byte, and a distance half as long one point (it needs one extra bit
/// less); `threshold` is what it must exceed.
#[inline]
fn better(nl: usize, nd: usize, cl: usize, cd: usize, threshold: i64) -> bool {
    let log = |d: usize| i64::from(usize::BITS - 1 - d.leading_zeros());
    4 * (nl as i64 - cl as i64) + (log(cd) - log(nd)) > threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// Word soup: compresses about 3x, like source text.
    fn text(n: usize, mut seed: u64) -> Vec<u8> {
        const W: &[&str] = &[
            "erofs ",
            "pcluster ",
            "the ",
            "kernel ",
            "(x, y);\n",
            "read ",
            "a ",
            "fixed ",
            "return 0;\n",
        ];
        let mut v = Vec::with_capacity(n + 16);
        while v.len() < n {
            let r = rng(&mut seed);
            v.extend_from_slice(W[(r % W.len() as u64) as usize].as_bytes());
            if r.is_multiple_of(7) {
                v.extend_from_slice(format!("{}", r % 10_000).as_bytes());
            }
        }
        v.truncate(n);
        v
    }

    fn random(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n).map(|_| rng(&mut seed) as u8).collect()
    }

    fn inflate(stream: &[u8], n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        let got = libdeflater::Decompressor::new()
            .deflate_decompress(stream, &mut out)
            .expect("libdeflate inflates the stream");
        assert_eq!(got, n, "stream length");
        out
    }

    fn kraft(lens: &[u8]) -> u64 {
        lens.iter()
            .filter(|&&l| l != 0)
            .map(|&l| 1u64 << (15 - l))
            .sum()
    }

    #[test]
    fn huffman_codes_are_complete_and_limited() {
        let mut scratch = Vec::new();
        // Fibonacci weights force lengths far past the limits.
        let mut fib = vec![1u32, 1];
        while fib.len() < 30 {
            let n = fib.len();
            fib.push(fib[n - 1] + fib[n - 2]);
        }
        for limit in [7usize, 15] {
            let mut f = [0u32; NUM_LL];
            f[..fib.len()].copy_from_slice(&fib);
            let mut lens = [0u8; NUM_LL];
            huffman_lengths(&f, limit, &mut lens, &mut scratch);
            assert!(
                lens.iter().all(|&l| usize::from(l) <= limit),
                "limit {limit}"
            );
            assert_eq!(kraft(&lens), 1 << 15, "complete at limit {limit}");
            // Heavier symbols never get longer codes.
            for i in 1..fib.len() {
                assert!(lens[i] <= lens[i - 1], "{i}: {lens:?}");
            }
        }
        // Unlimited case equals the textbook optimum: weights 1,1,2,4 → lengths 3,3,2,1.
        let mut lens = [0u8; 4];
        huffman_lengths(&[1, 1, 2, 4], 15, &mut lens, &mut scratch);
        assert_eq!(lens, [3, 3, 2, 1]);
        // One symbol gets a partner; none gives a two-code placeholder.
        let mut lens = [0u8; NUM_D];
        let mut f = [0u32; NUM_D];
        f[5] = 9;
        huffman_lengths(&f, 15, &mut lens, &mut scratch);
        assert_eq!((lens[0], lens[5], kraft(&lens)), (1, 1, 1 << 15));
        huffman_lengths(&[0; NUM_D], 15, &mut lens, &mut scratch);
        assert_eq!((lens[0], lens[1], kraft(&lens)), (1, 1, 1 << 15));
    }

    #[test]
    fn streams_fill_the_pcluster_and_inflate() {
        for level in [1, 4, 6, 9] {
            let mut e = DeflateEncoder::new(level);
            for cap in [512usize, 4096, 65536, 1 << 20] {
                let input = text(cap * 16, cap as u64 + 7);
                let mut dst = vec![0u8; cap];
                let (n, w) = e.compress(&input, &mut dst);
                let what = format!("level {level} cap {cap}");
                assert!(n > cap * 2 && n < input.len(), "{what}: consumed {n}");
                assert!(w <= cap && cap - w <= 8, "{what}: wrote {w}");
                assert!(inflate(&dst[..w], n) == input[..n], "{what}: differs");
            }
        }
    }

    #[test]
    fn whole_short_input_or_nothing() {
        let mut e = DeflateEncoder::new(6);
        let mut dst = vec![0u8; 4096];
        let t = text(3000, 3);
        let (n, w) = e.compress(&t, &mut dst);
        assert_eq!(n, 3000);
        assert!(inflate(&dst[..w], n) == t);
        // Incompressible: a prefix longer than the pcluster never fits.
        let r = random(20_000, 4);
        assert_eq!(e.compress(&r, &mut dst), (0, 0));
        // A short one goes whole (4000 bytes fit in 4096 with Huffman coding) or not.
        let (n, w) = e.compress(&r[..4000], &mut dst);
        assert_eq!(n, 4000);
        assert!(inflate(&dst[..w], n) == r[..4000]);
        // Tiny inputs (no room for a match) and empty ones.
        for len in [1usize, 2, 3, 4, 5] {
            let (n, w) = e.compress(&t[..len], &mut dst);
            assert_eq!(n, len);
            assert!(inflate(&dst[..w], n) == t[..len]);
        }
        assert_eq!(e.compress(&[], &mut dst), (0, 0));
        assert_eq!(e.compress(&t, &mut []), (0, 0));
    }

    /// Long runs: matches of 258 at distance 1, far more input than output.
    #[test]
    fn runs() {
        let mut e = DeflateEncoder::new(6);
        let mut input = vec![0u8; 3 << 20];
        input.extend_from_slice(&text(1 << 20, 9));
        let mut dst = vec![0u8; 4096];
        let (n, w) = e.compress(&input, &mut dst);
        assert!(n > 3 << 20, "consumed {n}");
        assert!(inflate(&dst[..w], n) == input[..n]);
    }

    /// A call's output depends only on its input: the match finder's tables from
    /// earlier calls are never read (the builder relies on this for identical images
    /// at any thread count).
    #[test]
    fn calls_are_independent() {
        let a = text(200_000, 1);
        let mut b = text(150_000, 2);
        b.extend_from_slice(&a[..50_000]); // would match `a` if stale entries leaked
        let mut used = DeflateEncoder::new(6);
        let mut fresh = DeflateEncoder::new(6);
        for cap in [4096usize, 65536] {
            let mut d1 = vec![0u8; cap];
            let mut d2 = vec![0u8; cap];
            used.compress(&a, &mut d1);
            let r1 = used.compress(&b, &mut d1);
            let r2 = fresh.compress(&b, &mut d2);
            assert_eq!(r1, r2);
            assert!(d1[..r1.1] == d2[..r2.1], "cap {cap}");
        }
    }

    /// Mixed input in a big pcluster: blocks are split where the statistics change,
    /// and the stream is smaller than one block would be.
    #[test]
    fn big_pclusters_split_blocks() {
        let mut input = text(600_000, 5);
        let mut seed = 77u64;
        // Digits only: a very different literal alphabet.
        input.extend((0..600_000).map(|_| b'0' + (rng(&mut seed) % 10) as u8));
        input.extend_from_slice(&text(600_000, 6));
        let mut e = DeflateEncoder::new(6);
        let cap = 1 << 20;
        let mut dst = vec![0u8; cap];
        let (n, w) = e.compress(&input, &mut dst);
        assert_eq!(n, input.len());
        assert!(inflate(&dst[..w], n) == input);
        // Versus one block for everything.
        let f = e.t.freqs(&e.items);
        let one = e.plan.make(&f).div_ceil(8) as usize;
        assert!(w + 1000 < one, "split {w} B, one block {one} B");
    }

    /// Many shapes of input and odd capacities: the contract holds and every stream
    /// inflates to exactly the consumed prefix.
    #[test]
    fn mixed_inputs_and_odd_capacities() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut e = DeflateEncoder::new(5);
        for round in 0..120 {
            let mut input = Vec::new();
            let parts = 1 + rng(&mut seed) % 5;
            for _ in 0..parts {
                let len = (rng(&mut seed) % 40_000) as usize;
                match rng(&mut seed) % 4 {
                    0 => input.extend_from_slice(&text(len, rng(&mut seed))),
                    1 => input.extend_from_slice(&random(len, rng(&mut seed))),
                    2 => input.extend(std::iter::repeat_n(rng(&mut seed) as u8, len)),
                    _ => {
                        // Short repeats at every distance up to the window.
                        let d = 1 + (rng(&mut seed) % 33_000) as usize;
                        for i in 0..len {
                            let b = if i >= d {
                                input[input.len() - d]
                            } else {
                                i as u8
                            };
                            input.push(b);
                        }
                    }
                }
            }
            let cap = 64 + (rng(&mut seed) % 70_000) as usize;
            let mut dst = vec![0u8; cap];
            let (n, w) = e.compress(&input, &mut dst);
            let what = format!("round {round}: {} bytes into {cap}", input.len());
            if n == 0 {
                assert_eq!(w, 0, "{what}");
                continue;
            }
            assert!(w <= cap && n <= input.len(), "{what}");
            if input.len() > cap {
                assert!(n > cap, "{what}: took {n}");
            } else {
                assert_eq!(n, input.len(), "{what}");
            }
            assert!(inflate(&dst[..w], n) == input[..n], "{what}: differs");
        }
    }
}

//! Similar small files side by side in the packed inode (for [`crate::frag`]).
//!
//! Files that go whole to the packed inode are stored in inode order, which keeps a
//! directory's files together. Files alike in content but far apart in the tree
//! (a driver's register headers in two directories, the same template in every
//! package, two versions of one file) then never meet inside the packed inode's codec
//! window. Here each such file gets a short content sketch on the worker that read it,
//! and once all fragments are in, alike files are gathered into clusters and each
//! cluster moves to where its first member was; every other fragment keeps its place.
//!
//! The sketch is a one-permutation MinHash: the 8-byte strings that start lines are
//! hashed into [`BINS`] bins, and each bin keeps its smallest value. Two files share a
//! bin's value with a chance close to the share of line starts they have in common. Sketches meet through locality-
//! sensitive bands (four bins each): a file is compared with the first file of every
//! band bucket it falls in, and joins that file's cluster when at least
//! [`SAME_BINS_MIN`] of the bins both have values for agree.
//!
//! Everything depends on the file contents and the fragment order alone, so the result
//! is the same for any thread count.

use std::collections::HashMap;

/// Bins of a sketch.
pub const BINS: usize = 16;
/// Bins a band takes.
const BAND: usize = 4;
/// Bins that must agree for two files to count as alike.
pub const SAME_BINS_MIN: usize = 8;
/// Files shorter than this get no sketch.
pub const MIN_LEN: usize = 64;
/// Bytes of a file the sketch looks at: its start. Most similar files are alike from
/// their first bytes on, and the sketch's cost stays bounded for big fragments.
pub const SKETCH_BYTES: usize = 64 << 10;
/// A bin no sampled string fell into.
const EMPTY: u32 = u32::MAX;

/// A file's content sketch: per bin, the smallest hash value that fell into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sketch([u32; BINS]);

/// The sketch of `bytes` (at most their first [`SKETCH_BYTES`]); `None` when they are
/// shorter than [`MIN_LEN`] or hold no line start to sample.
///
/// The strings sampled are the 8 bytes behind every newline: line starts are points
/// chosen by the content itself (an edit moves the lines behind it, not their
/// starts), text holds one every few dozen bytes, and finding them costs a few word
/// operations per 8 bytes. On the linux tree this orders as well as every 8-byte string
/// sampled 1 in 8 (one zstd 3 proxy: 186.8 against 186.7 MB) at a sixth of the cost
/// (0.27 against 1.5 ns a byte). Files with no line (most binaries) get no sketch.
pub fn sketch(bytes: &[u8]) -> Option<Sketch> {
    let d = &bytes[..bytes.len().min(SKETCH_BYTES)];
    if d.len() < MIN_LEN {
        return None;
    }
    let mut m = [EMPTY; BINS];
    let mut feed = |p: usize| {
        // The 8 bytes behind the newline at `p`, when there are 8.
        let Some(w) = d.get(p + 1..p + 9) else {
            return;
        };
        let mut v = [0u8; 8];
        v.copy_from_slice(w);
        let h = u64::from_le_bytes(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let bin = (h >> 60) as usize;
        // Low 32 bits as the value; EMPTY itself is never stored.
        let val = (h as u32).min(EMPTY - 1);
        if val < m[bin] {
            m[bin] = val;
        }
    };
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const NEWLINES: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    let mut blocks = d.chunks_exact(64);
    for (b, blk) in (&mut blocks).enumerate() {
        // Bit k of `mask`: byte k of the block is a newline.
        let mut mask = 0u64;
        for (k, w) in blk.chunks_exact(8).enumerate() {
            let mut v = [0u8; 8];
            v.copy_from_slice(w);
            let x = u64::from_le_bytes(v) ^ NEWLINES;
            // High bit of each byte of x that is zero (exact: no carries between bytes).
            let z = !(((x & LOW7).wrapping_add(LOW7)) | x) & HIGH;
            // Those 8 bits gathered into one byte, byte 0's bit lowest.
            let byte = (z >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56;
            mask |= byte << (8 * k);
        }
        // Bounded: each pass clears one of the 64 bits.
        while mask != 0 {
            feed(b * 64 + mask.trailing_zeros() as usize);
            mask &= mask - 1;
        }
    }
    let tail = d.len() - blocks.remainder().len();
    for (k, &c) in blocks.remainder().iter().enumerate() {
        if c == b'\n' {
            feed(tail + k);
        }
    }
    m.iter().any(|&v| v != EMPTY).then_some(Sketch(m))
}

impl Sketch {
    /// Bins both sketches have a value for and agree on.
    fn same_bins(&self, o: &Sketch) -> usize {
        self.0
            .iter()
            .zip(&o.0)
            .filter(|(a, b)| a == b && **a != EMPTY)
            .count()
    }
}

fn root(parent: &mut [u32], mut x: u32) -> u32 {
    // Bounded: every step moves to a smaller index (roots are the smallest member).
    while parent[x as usize] != x {
        let up = parent[parent[x as usize] as usize];
        parent[x as usize] = up;
        x = up;
    }
    x
}

/// The order of `n` items (the fragments in packed order) that puts alike items side
/// by side: `sketches` lists `(item, sketch)` for the items that have one, in item
/// order. Each cluster of alike items takes the place of its first member, in item
/// order inside; items without a sketch or without a match keep their places.
/// Returns `None` when nothing moves.
pub fn order(n: usize, sketches: &[(u32, Sketch)]) -> Option<Vec<u32>> {
    let n32 = u32::try_from(n).ok()?;
    let mut parent: Vec<u32> = (0..n32).collect();
    // (band, its four values) -> the first sketch (index into `sketches`) with them.
    let mut first: HashMap<(u8, [u32; BAND]), u32> = HashMap::new();
    let mut joined = false;
    for (k, (item, s)) in sketches.iter().enumerate() {
        if *item >= n32 {
            return None;
        }
        for b in 0..BINS / BAND {
            let mut key = [0u32; BAND];
            key.copy_from_slice(&s.0[b * BAND..(b + 1) * BAND]);
            if key.contains(&EMPTY) {
                continue;
            }
            match first.entry((b as u8, key)) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(k as u32);
                }
                std::collections::hash_map::Entry::Occupied(o) => {
                    let (other, os) = &sketches[*o.get() as usize];
                    if s.same_bins(os) >= SAME_BINS_MIN {
                        let (x, y) = (root(&mut parent, *item), root(&mut parent, *other));
                        if x != y {
                            parent[x.max(y) as usize] = x.min(y);
                            joined = true;
                        }
                    }
                }
            }
        }
    }
    if !joined {
        return None;
    }
    // Roots are their clusters' first members: sorted by root (stably), a cluster
    // lands where its first member is, each in item order.
    let roots: Vec<u32> = (0..n32).map(|i| root(&mut parent, i)).collect();
    let mut out: Vec<u32> = (0..n32).collect();
    out.sort_by_key(|&i| roots[i as usize]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferofs_testkit::text_lines as text;

    #[test]
    fn alike_texts_give_alike_sketches() {
        let a = text(800, 1);
        let mut b = a.clone();
        // A few edits: most line starts survive.
        for k in 0..20 {
            b[k * 997] ^= 0x55;
        }
        b.splice(5000..5000, b"an inserted line\n".iter().copied());
        let other = text(800, 2);
        let (sa, sb, so) = (
            sketch(&a).expect("a"),
            sketch(&b).expect("b"),
            sketch(&other).expect("other"),
        );
        assert!(sa.same_bins(&sb) >= 13, "{}", sa.same_bins(&sb));
        assert_eq!(sa.same_bins(&so), 0);
        assert_eq!(sa.same_bins(&sa), BINS);
        assert_eq!(sketch(&a[..MIN_LEN - 1]), None);
        // No line start: no sketch.
        assert_eq!(sketch(&[b'x'; 5000]), None);
        // Only the first SKETCH_BYTES count.
        let mut long = text(SKETCH_BYTES / 20, 3);
        long.truncate(SKETCH_BYTES);
        let s = sketch(&long).expect("long");
        long.extend(text(1000, 4));
        assert_eq!(sketch(&long), Some(s));
    }

    #[test]
    fn newlines_are_found_at_every_place_of_a_block() {
        // A newline at each of the 64 places of a block, then in the tail: the
        // word-wise search finds each (the line behind it changes the sketch).
        for at in 0..80 {
            let mut d = vec![b'a'; 160];
            let without = sketch(&d);
            d[at] = b'\n';
            d[at + 1..at + 9].copy_from_slice(b"12345678");
            assert_ne!(sketch(&d), without, "newline at {at}");
            assert!(sketch(&d).is_some());
        }
    }

    #[test]
    fn clusters_move_to_their_first_member_and_the_rest_keep_their_places() {
        let a = text(300, 10);
        // (noise() seeds differ in more than their lowest bit)
        let b = text(300, 20);
        let mut a2 = a.clone();
        a2[100] ^= 1;
        let mut b2 = b.clone();
        b2[4000] ^= 1;
        let c = text(300, 30);
        // Items: 0 a, 1 (no sketch), 2 b, 3 c, 4 a2, 5 b2, 6 (no sketch).
        let sk = |i: u32, d: &[u8]| (i, sketch(d).expect("sketch"));
        let sketches = [sk(0, &a), sk(2, &b), sk(3, &c), sk(4, &a2), sk(5, &b2)];
        assert_eq!(order(7, &sketches), Some(vec![0, 4, 1, 2, 5, 3, 6]));
        // Nothing alike: nothing moves.
        assert_eq!(order(7, &sketches[..3]), None);
        // An item past the end: no order.
        assert_eq!(order(5, &sketches), None);
    }
}

//! Encoding lcluster indexes for compressed files (format doc §8.4, §8.5, §8.12).
//!
//! The writer describes a file as a list of extents in logical order, each with its
//! pcluster; [`lcluster_entries`] turns that into one entry per lcluster (the "full"
//! view), and [`encode_full`] / [`encode_compact`] pack those entries into bytes.
//! Lclusters are always one block here (`lclusterbits == blkszbits`), as the kernel's
//! compact decoder requires.

use crate::zmap::*;

/// How an extent's pcluster is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// Uncompressed (shifted) pcluster.
    Plain,
    /// Compressed with the HEAD1 algorithm (`h_algorithmtype & 15`).
    Head1,
    /// Compressed with the HEAD2 algorithm (`h_algorithmtype >> 4`).
    Head2,
}

impl HeadKind {
    fn lcluster_type(self) -> u8 {
        match self {
            HeadKind::Plain => LCLUSTER_TYPE_PLAIN,
            HeadKind::Head1 => LCLUSTER_TYPE_HEAD1,
            HeadKind::Head2 => LCLUSTER_TYPE_HEAD2,
        }
    }
}

/// One extent: logical bytes `[lstart, next extent's lstart or i_size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentDesc {
    pub lstart: u64,
    pub kind: HeadKind,
    /// First block of the pcluster (ignored for an inline tail).
    pub blkaddr: u32,
    /// Pcluster size in blocks (0 for an inline or fragment tail).
    pub blocks: u16,
    /// The extent decodes only a prefix of its pcluster's data (dedupe of a shifted
    /// match: Z_EROFS_LI_PARTIAL_REF; full indexes only).
    pub partial: bool,
}

/// One lcluster entry, before packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lcluster {
    Head {
        kind: HeadKind,
        clusterofs: u16,
        blkaddr: u32,
        /// Z_EROFS_LI_PARTIAL_REF (full indexes only).
        partial: bool,
    },
    NonHead {
        /// Distance back to the head, or `D0_CBLKCNT | blocks` right after a head.
        delta0: u16,
        /// Distance forward to the next head (or to the end).
        delta1: u16,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexError {
    /// Extents not strictly increasing, first not at 0, or two starting in one lcluster.
    BadExtents {
        index: usize,
    },
    /// A pcluster too big to be described (more than 2047 blocks).
    PclusterTooBig {
        blocks: u16,
    },
    /// Compact indexes need physically consecutive pclusters inside a pack.
    NotConsecutive {
        lcn: u64,
    },
    TooLarge,
}

/// Build one entry per lcluster (`ceil(i_size / blksz)` entries) from the extents, the
/// way mkfs does (doc §8.12): NONHEADs after each head (the first one a CBLKCNT when
/// `big_pcluster`), and a PLAIN sentinel head at `i_size` when the last extent spills
/// into a final lcluster that has no head.
pub fn lcluster_entries(
    extents: &[ExtentDesc],
    i_size: u64,
    blkszbits: u8,
    big_pcluster: bool,
) -> Result<Vec<Lcluster>, IndexError> {
    let lsz = 1u64 << blkszbits;
    let n = usize::try_from(i_size.div_ceil(lsz)).map_err(|_| IndexError::TooLarge)?;
    let mut heads: Vec<Option<(ExtentDesc, u16)>> = vec![None; n];
    let mut prev: Option<u64> = None;
    for (i, e) in extents.iter().enumerate() {
        let lcn = e.lstart >> blkszbits;
        let ok = match prev {
            None => e.lstart == 0,
            Some(p) => e.lstart > p && lcn > (p >> blkszbits),
        };
        if !ok || e.lstart >= i_size {
            return Err(IndexError::BadExtents { index: i });
        }
        if e.blocks > D0_MAX {
            return Err(IndexError::PclusterTooBig { blocks: e.blocks });
        }
        heads[lcn as usize] = Some((*e, (e.lstart & (lsz - 1)) as u16));
        prev = Some(e.lstart);
    }
    // Sentinel: the lcluster holding i_size (when i_size is not lcluster aligned) gets a
    // PLAIN head unless a real extent starts in it.
    if i_size & (lsz - 1) != 0 {
        let last = n - 1;
        if heads[last].is_none() {
            // Its block address is never used for data; like mkfs, write the
            // running value (the block after the last pcluster) so packs stay
            // consecutive.
            let running = extents
                .last()
                .map(|e| e.blkaddr.wrapping_add(u32::from(e.blocks)))
                .unwrap_or(0);
            let s = ExtentDesc {
                lstart: i_size,
                kind: HeadKind::Plain,
                blkaddr: running,
                blocks: 1,
                partial: false,
            };
            heads[last] = Some((s, (i_size & (lsz - 1)) as u16));
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut cur_head: Option<(usize, ExtentDesc)> = None;
    for lcn in 0..n {
        if let Some((e, cofs)) = heads[lcn] {
            out.push(Lcluster::Head {
                kind: e.kind,
                clusterofs: cofs,
                blkaddr: e.blkaddr,
                partial: e.partial,
            });
            cur_head = Some((lcn, e));
            continue;
        }
        let (h, e) = cur_head.ok_or(IndexError::BadExtents { index: 0 })?;
        let next = (lcn + 1..n).find(|&k| heads[k].is_some()).unwrap_or(n);
        let dist = lcn - h;
        let delta0 = if dist == 1 && big_pcluster {
            D0_CBLKCNT | e.blocks
        } else {
            dist.min(usize::from(D0_MAX)) as u16
        };
        out.push(Lcluster::NonHead {
            delta0,
            delta1: (next - lcn).min(usize::from(u16::MAX)) as u16,
        });
    }
    Ok(out)
}

/// Full (8-byte) indexes, without the map header and its 8 reserved bytes.
pub fn encode_full(entries: &[Lcluster]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * FULL_INDEX_SIZE);
    for e in entries {
        let fi = match *e {
            Lcluster::Head {
                kind,
                clusterofs,
                blkaddr,
                partial,
            } => FullIndex {
                advise: u16::from(kind.lcluster_type())
                    | if partial { FULL_PARTIAL_REF } else { 0 },
                clusterofs,
                u: blkaddr,
            },
            Lcluster::NonHead { delta0, delta1 } => FullIndex {
                advise: u16::from(LCLUSTER_TYPE_NONHEAD),
                clusterofs: 0,
                u: u32::from(delta0) | (u32::from(delta1) << 16),
            },
        };
        out.extend_from_slice(&fi.encode());
    }
    out
}

/// Split of the compact index area into leading 4-byte, 2-byte and trailing 4-byte
/// entries for `n` entries starting at byte position `e_pos` (doc §8.5: `E`).
pub fn compact_split(n: usize, e_pos: u64, compacted_2b: bool) -> (usize, usize, usize) {
    if !compacted_2b {
        return (0, 0, n);
    }
    let lead = (((32 - e_pos % 32) / 4) % 8) as usize;
    if lead >= n {
        return (0, 0, n);
    }
    let t = (n - lead) / 16 * 16;
    (lead, t, n - lead - t)
}

/// Size in bytes of a compact index area (doc §8.5).
pub fn compact_size(n: usize, e_pos: u64, compacted_2b: bool) -> usize {
    let (i, t, r) = compact_split(n, e_pos, compacted_2b);
    4 * i + 2 * t + 4 * (r + (r & 1))
}

/// Pack entries into compact indexes starting at byte position `e_pos` (`E`, used only
/// modulo 32). `big_pcluster` must match `ADVISE_BIG_PCLUSTER_1`.
pub fn encode_compact(
    entries: &[Lcluster],
    e_pos: u64,
    compacted_2b: bool,
    big_pcluster: bool,
) -> Result<Vec<u8>, IndexError> {
    let n = entries.len();
    let (lead, t, _r) = compact_split(n, e_pos, compacted_2b);
    let mut out = Vec::with_capacity(compact_size(n, e_pos, compacted_2b));
    let mut k = 0usize;
    // Leading 4-byte packs.
    while k < lead {
        let end = (k + 2).min(n);
        out.extend_from_slice(&pack(&entries[k..end], 2, 16, big_pcluster, k)?);
        k += 2;
    }
    // 2-byte packs.
    while k < lead + t {
        out.extend_from_slice(&pack(&entries[k..k + 16], 16, 14, big_pcluster, k)?);
        k += 16;
    }
    // Trailing 4-byte packs.
    while k < n {
        let end = (k + 2).min(n);
        out.extend_from_slice(&pack(&entries[k..end], 2, 16, big_pcluster, k)?);
        k += 2;
    }
    Ok(out)
}

/// Encode one pack of `per` entries (`bits` each) followed by the u32 base.
fn pack(
    ents: &[Lcluster],
    per: usize,
    bits: u32,
    big: bool,
    first_lcn: usize,
) -> Result<Vec<u8>, IndexError> {
    let mut vals = Vec::with_capacity(per);
    for (j, e) in ents.iter().enumerate() {
        let last = j == per - 1;
        let v: u32 = match *e {
            Lcluster::Head { partial: true, .. } => {
                // Compact indexes have no advise bits.
                return Err(IndexError::BadExtents {
                    index: first_lcn + j,
                });
            }
            Lcluster::Head {
                kind, clusterofs, ..
            } => (u32::from(kind.lcluster_type()) << 12) | u32::from(clusterofs),
            Lcluster::NonHead { delta0, delta1 } => {
                let lo = if delta0 & D0_CBLKCNT != 0 {
                    delta0
                } else if last {
                    delta1.min(D0_MAX)
                } else {
                    delta0
                };
                (u32::from(LCLUSTER_TYPE_NONHEAD) << 12) | u32::from(lo)
            }
        };
        vals.push(v);
    }
    vals.resize(per, 0); // padding entry for an odd tail
    let base = pack_base(ents, big, first_lcn)?;
    let body_len = (per * bits as usize) / 8;
    let mut body = vec![0u8; body_len + 4];
    let mut bitpos = 0usize;
    for v in vals {
        let mut x = u64::from(v) << (bitpos % 8);
        let mut byte = bitpos / 8;
        while x != 0 {
            body[byte] |= (x & 0xFF) as u8;
            x >>= 8;
            byte += 1;
        }
        bitpos += bits as usize;
    }
    body.truncate(body_len);
    body.extend_from_slice(&base.to_le_bytes());
    Ok(body)
}

/// The pack's `base` (doc §8.5): the block the kernel adds counted pclusters to.
/// Pclusters must be physically consecutive in logical order (the writer stores them
/// sequentially); an inline or fragment tail head and the EOF sentinel are never
/// dereferenced, so their addresses do not matter.
fn pack_base(ents: &[Lcluster], big: bool, _first_lcn: usize) -> Result<u32, IndexError> {
    let first_head = ents.iter().position(|e| matches!(e, Lcluster::Head { .. }));
    let Some(h) = first_head else { return Ok(0) };
    let Lcluster::Head { blkaddr, .. } = ents[h] else {
        return Ok(0);
    };
    if !big {
        return Ok(blkaddr.wrapping_sub(1));
    }
    // Big pclusters: a CBLKCNT in entry 0 belongs to a head in the previous pack, whose
    // pcluster is counted first.
    match ents.first() {
        Some(Lcluster::NonHead { delta0, .. }) if delta0 & D0_CBLKCNT != 0 => {
            Ok(blkaddr.wrapping_sub(u32::from(delta0 & !D0_CBLKCNT)))
        }
        _ => Ok(blkaddr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doc §8.5 worked example: 10000-byte LZ4 file, big-pcluster image, E % 32 = 24.
    #[test]
    fn doc_worked_example() {
        let ext = [ExtentDesc {
            lstart: 0,
            kind: HeadKind::Head1,
            blkaddr: 106,
            blocks: 1,
            partial: false,
        }];
        let ents = lcluster_entries(&ext, 10000, 12, true).expect("entries");
        assert_eq!(ents.len(), 3);
        let bytes = encode_compact(&ents, 24, true, true).expect("compact");
        assert_eq!(
            bytes,
            vec![
                0x00, 0x10, 0x01, 0x28, 0x6a, 0x00, 0x00, 0x00, // pack 0
                0x10, 0x07, 0x00, 0x00, 0x6b, 0x00, 0x00, 0x00, // pack 1
            ]
        );
        assert_eq!(compact_size(3, 24, true), 16);
    }

    #[test]
    fn full_index_nonheads() {
        // Two extents: [0, 10000) in 2 blocks at 50, [10000, 20000) in 1 block at 52.
        let ext = [
            ExtentDesc {
                lstart: 0,
                kind: HeadKind::Head1,
                blkaddr: 50,
                blocks: 2,
                partial: false,
            },
            ExtentDesc {
                lstart: 10000,
                kind: HeadKind::Head1,
                blkaddr: 52,
                blocks: 1,
                partial: false,
            },
        ];
        let ents = lcluster_entries(&ext, 20000, 12, true).expect("entries");
        assert_eq!(ents.len(), 5);
        assert_eq!(
            ents[0],
            Lcluster::Head {
                kind: HeadKind::Head1,
                clusterofs: 0,
                blkaddr: 50,
                partial: false
            }
        );
        assert_eq!(
            ents[1],
            Lcluster::NonHead {
                delta0: D0_CBLKCNT | 2,
                delta1: 1
            }
        );
        assert_eq!(
            ents[2],
            Lcluster::Head {
                kind: HeadKind::Head1,
                clusterofs: 10000 - 8192,
                blkaddr: 52,
                partial: false
            }
        );
        assert_eq!(
            ents[3],
            Lcluster::NonHead {
                delta0: D0_CBLKCNT | 1,
                delta1: 1
            }
        );
        // 20000 is not block aligned: a PLAIN sentinel head at i_size.
        assert_eq!(
            ents[4],
            Lcluster::Head {
                kind: HeadKind::Plain,
                clusterofs: 20000 - 16384,
                blkaddr: 53,
                partial: false
            }
        );
        let full = encode_full(&ents);
        assert_eq!(full.len(), 40);
        assert_eq!(&full[8..16], &[2, 0, 0, 0, 0x02, 0x08, 1, 0]);
    }

    #[test]
    fn rejects_two_heads_in_one_lcluster() {
        let ext = [
            ExtentDesc {
                lstart: 0,
                kind: HeadKind::Head1,
                blkaddr: 1,
                blocks: 1,
                partial: false,
            },
            ExtentDesc {
                lstart: 100,
                kind: HeadKind::Head1,
                blkaddr: 2,
                blocks: 1,
                partial: false,
            },
        ];
        assert_eq!(
            lcluster_entries(&ext, 5000, 12, false),
            Err(IndexError::BadExtents { index: 1 })
        );
    }

    #[test]
    fn compact_split_cases() {
        assert_eq!(compact_split(100, 0, true), (0, 96, 4));
        assert_eq!(compact_split(100, 8, true), (6, 80, 14));
        assert_eq!(compact_split(3, 8, true), (0, 0, 3));
        assert_eq!(compact_split(5, 8, false), (0, 0, 5));
    }
}

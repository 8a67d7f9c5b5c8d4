//! Compressed data (like the kernel's zdata.c): read through `zmap`, decompress only the
//! pclusters a read needs, keep decompressed pclusters in a bounded shared cache.

use crate::data::Extent;
use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use crate::zmap::{ZExtent, ZKind, ZSrc};
use ferofs_compress::{decompress, Algorithm, DecompressConfig};
use ferofs_format::sb::INCOMPAT_COMPR_CFGS;
use std::sync::{Arc, Mutex};

/// Largest decoded extent the kernel accepts (Z_EROFS_PCLUSTER_MAX_DSIZE).
const MAX_DSIZE: u64 = 12 << 20;

/// A bounded cache of decompressed extents, keyed by (nid, logical start).
pub struct PclusterCache {
    inner: Mutex<CacheInner>,
}

/// (nid, logical start) -> (last use, decoded bytes).
type CacheMap = std::collections::HashMap<(u64, u64), (u64, Arc<Vec<u8>>)>;

struct CacheInner {
    budget: usize,
    used: usize,
    tick: u64,
    /// (nid, logical start) -> (last use, decoded bytes).
    map: CacheMap,
}

impl PclusterCache {
    pub fn new(budget: usize) -> Self {
        PclusterCache {
            inner: Mutex::new(CacheInner {
                budget,
                used: 0,
                tick: 0,
                map: Default::default(),
            }),
        }
    }
    pub fn set_budget(&self, budget: usize) {
        if let Ok(mut g) = self.inner.lock() {
            g.budget = budget;
            g.evict();
        }
    }
    pub(crate) fn get(&self, key: (u64, u64)) -> Option<std::sync::Arc<Vec<u8>>> {
        let mut g = self.inner.lock().ok()?;
        g.tick += 1;
        let t = g.tick;
        let e = g.map.get_mut(&key)?;
        e.0 = t;
        Some(e.1.clone())
    }
    pub(crate) fn put(&self, key: (u64, u64), v: std::sync::Arc<Vec<u8>>) {
        let Ok(mut g) = self.inner.lock() else { return };
        if v.len() > g.budget {
            return;
        }
        g.tick += 1;
        let t = g.tick;
        g.used += v.len();
        if let Some(old) = g.map.insert(key, (t, v)) {
            g.used -= old.1.len();
        }
        g.evict();
    }
    /// Bytes currently held.
    pub fn used(&self) -> usize {
        self.inner.lock().map(|g| g.used).unwrap_or(0)
    }
}

impl CacheInner {
    fn evict(&mut self) {
        // Bounded: each pass removes one entry.
        while self.used > self.budget {
            let Some((&k, _)) = self.map.iter().min_by_key(|(_, (t, _))| *t) else {
                break;
            };
            if let Some((_, v)) = self.map.remove(&k) {
                self.used -= v.len();
            }
        }
    }
}

impl<S: Source> Image<S> {
    /// Decoded bytes of an extent, at least its first `need` bytes (cached). Only a
    /// prefix is decoded when the read does not need the whole extent (partial
    /// decoding, as the kernel does); a later read further in decodes a longer prefix,
    /// at least twice the cached one, so sequential reads stay linear.
    fn z_extent_bytes(&self, ino: &Inode, e: &ZExtent, need: u64) -> Result<Arc<Vec<u8>>> {
        let key = (ino.nid, e.la);
        let span = e.end - e.la;
        let mut cached = 0u64;
        if let Some(v) = self.cache.get(key) {
            if v.len() as u64 >= need.min(span) {
                return Ok(v);
            }
            cached = v.len() as u64;
        }
        if span > MAX_DSIZE {
            return Err(corrupt(
                CorruptKind::BadLcluster,
                Some(ino.nid),
                Some(e.la),
                Some(span),
                "decoded extent larger than 12 MiB",
            ));
        }
        // Decode a prefix: what is needed, rounded up to 64 KiB and at least double what
        // was cached; the whole extent when that is close anyway.
        let mut want = need.max(cached * 2).div_ceil(64 << 10) * (64 << 10);
        if want * 4 >= span * 3 {
            want = span;
        }
        let n = want.min(span) as usize;
        let partial = (n as u64) < span;
        let mut out = vec![0u8; n];
        let bad = |kind, v: u64, what| corrupt(kind, Some(ino.nid), Some(e.la), Some(v), what);
        match e.src {
            ZSrc::Hole => {}
            ZSrc::Fragment { off } => {
                let packed = self.packed_inode()?;
                if ino.nid == packed.nid {
                    return Err(bad(
                        CorruptKind::BadPcluster,
                        off,
                        "the packed inode cannot use fragments",
                    ));
                }
                // Logical la + i is packed byte off + i.
                let got = self.read_at(packed, off, &mut out)?;
                if got != n {
                    return Err(bad(
                        CorruptKind::BadPcluster,
                        off,
                        "fragment beyond the packed inode",
                    ));
                }
            }
            ZSrc::Inline { rel, len } | ZSrc::Pcluster { addr: rel, len } => {
                let inline = matches!(e.src, ZSrc::Inline { .. });
                if len > ferofs_format::PCLUSTER_MAX_SIZE {
                    return Err(bad(CorruptKind::BadPcluster, len, "pcluster too large"));
                }
                let mut raw = vec![0u8; len as usize];
                if inline {
                    self.read_inode_meta(ino.nid, rel, &mut raw)?;
                } else {
                    self.read_raw(&mut raw, rel)?;
                }
                match e.kind {
                    ZKind::Plain { interlaced } => {
                        let p = raw.len();
                        if p == 0 {
                            return Err(bad(CorruptKind::BadPcluster, 0, "empty plain pcluster"));
                        }
                        if interlaced && !inline {
                            let k = (e.la % p as u64) as usize;
                            for (i, b) in out.iter_mut().enumerate() {
                                *b = raw[(k + i) % p];
                            }
                        } else {
                            if n > p || (!partial && span as usize > p) {
                                return Err(bad(
                                    CorruptKind::BadPcluster,
                                    n as u64,
                                    "plain extent longer than its pcluster",
                                ));
                            }
                            out.copy_from_slice(&raw[..n]);
                        }
                    }
                    ZKind::Compressed(alg) => {
                        let algo = Algorithm::from_id(alg).ok_or_else(|| {
                            bad(
                                CorruptKind::BadLcluster,
                                u64::from(alg),
                                "unknown algorithm",
                            )
                        })?;
                        let avail = if self.sb.has_incompat(INCOMPAT_COMPR_CFGS) {
                            self.compr.available
                        } else {
                            1
                        };
                        if avail & (1 << alg) == 0 {
                            return Err(bad(
                                CorruptKind::BadLcluster,
                                u64::from(alg),
                                "algorithm not declared in the superblock",
                            ));
                        }
                        let stream = if inline {
                            &raw[..]
                        } else {
                            let z = raw.iter().position(|&b| b != 0).ok_or_else(|| {
                                bad(CorruptKind::BadPcluster, rel, "all-zero pcluster")
                            })?;
                            &raw[z..]
                        };
                        let cfg = DecompressConfig {
                            lzma_dict: self.compr.lzma_dict_size(),
                        };
                        decompress(algo, stream, &mut out, e.partial_ref || partial, &cfg)
                            .or_else(|_| decompress(algo, stream, &mut out, true, &cfg))
                            .map_err(|_| {
                                bad(
                                    CorruptKind::Decompress,
                                    u64::from(alg),
                                    "pcluster does not decompress",
                                )
                            })?;
                    }
                }
            }
        }
        let v = Arc::new(out);
        self.cache.put(key, v.clone());
        Ok(v)
    }

    pub(crate) fn z_read_at(&self, ino: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let zi = self.zinfo(ino)?;
        let want = buf.len();
        let mut done = 0usize;
        // Bounded: each iteration consumes at least one byte of a non-empty extent.
        while done < want {
            let pos = offset + done as u64;
            let e = self.z_map(ino, &zi, pos)?;
            if pos < e.la || pos >= e.end {
                return Err(corrupt(
                    CorruptKind::BadLcluster,
                    Some(ino.nid),
                    Some(pos),
                    Some(e.la),
                    "mapping does not cover the offset",
                ));
            }
            let from = pos - e.la;
            let n = ((e.end - pos) as usize).min(want - done);
            match e.src {
                // Fragments and holes are served directly: no decoded-extent buffer.
                ZSrc::Hole => buf[done..done + n].fill(0),
                ZSrc::Fragment { off } => {
                    let packed = self.packed_inode()?;
                    if packed.nid == ino.nid {
                        return Err(corrupt(
                            CorruptKind::BadPcluster,
                            Some(ino.nid),
                            Some(pos),
                            Some(off),
                            "the packed inode cannot use fragments",
                        ));
                    }
                    let at = off.checked_add(from).ok_or_else(|| {
                        corrupt(
                            CorruptKind::BadPcluster,
                            Some(ino.nid),
                            Some(pos),
                            Some(off),
                            "fragment offset overflows",
                        )
                    })?;
                    let got = self.read_at(packed, at, &mut buf[done..done + n])?;
                    if got != n {
                        return Err(corrupt(
                            CorruptKind::BadPcluster,
                            Some(ino.nid),
                            Some(pos),
                            Some(off),
                            "fragment beyond the packed inode",
                        ));
                    }
                }
                _ => {
                    let bytes = self.z_extent_bytes(ino, &e, from + n as u64)?;
                    let from = from as usize;
                    buf[done..done + n].copy_from_slice(&bytes[from..from + n]);
                }
            }
            done += n;
        }
        Ok(want)
    }

    pub(crate) fn z_extents(&self, ino: &Inode) -> Result<Vec<Extent>> {
        let zi = self.zinfo(ino)?;
        let mut v = Vec::new();
        let mut pos = 0u64;
        while pos < ino.size && v.len() < 1 << 20 {
            let e = self.z_map(ino, &zi, pos)?;
            if e.end <= pos {
                break;
            }
            let (physical, stored, where_) = match e.src {
                ZSrc::Pcluster { addr, len } => (Some(addr), len, ""),
                ZSrc::Inline { len, .. } => (None, len, " inline"),
                ZSrc::Fragment { .. } => (None, 0, " fragment"),
                ZSrc::Hole => (None, 0, " hole"),
            };
            let kind = match e.kind {
                ZKind::Plain { interlaced: true } => format!("plain-interlaced{where_}"),
                ZKind::Plain { .. } => format!("plain{where_}"),
                ZKind::Compressed(a) => format!(
                    "{}{where_}",
                    Algorithm::from_id(a).map(|a| a.name()).unwrap_or("?")
                ),
            };
            v.push(Extent {
                logical: e.la,
                length: e.end - e.la,
                physical,
                stored,
                kind,
            });
            pos = e.end;
        }
        Ok(v)
    }
}

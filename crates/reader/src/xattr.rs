//! Extended attributes (like the kernel's xattr.c): inline entries, shared entries,
//! long name prefixes and the bloom filter.

use crate::error::*;
use crate::image::Image;
use crate::inode::Inode;
use crate::source::Source;
use ferofs_format::inode::COMPACT_SIZE;
use ferofs_format::inode::EXTENDED_SIZE;
use ferofs_format::sb::*;
use ferofs_format::xattr::*;

/// One attribute with its full name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// Most long prefixes the format allows.
pub(crate) const MAX_PREFIXES: usize = 128;

impl<S: Source> Image<S> {
    /// The long-prefix table (base index, infix), loaded once.
    fn long_prefixes(&self) -> Result<&[(u8, Vec<u8>)]> {
        let r = self
            .prefixes
            .get_or_init(|| self.load_prefixes().map_err(|e| e.to_string()));
        match r {
            Ok(v) => Ok(v),
            Err(_) => Err(corrupt(
                CorruptKind::BadXattrPrefix,
                None,
                Some(u64::from(self.sb.xattr_prefix_start) * 4),
                Some(u64::from(self.sb.xattr_prefix_count)),
                "long xattr prefix table unreadable",
            )),
        }
    }

    fn load_prefixes(&self) -> Result<Vec<(u8, Vec<u8>)>> {
        let count = usize::from(self.sb.xattr_prefix_count);
        if count == 0 || !self.sb.has_incompat(INCOMPAT_XATTR_PREFIXES) {
            return Ok(Vec::new());
        }
        if count > MAX_PREFIXES {
            return Err(corrupt(
                CorruptKind::BadXattrPrefix,
                None,
                None,
                Some(count as u64),
                "too many long prefixes",
            ));
        }
        let plain = self.sb.has_compat(COMPAT_PLAIN_XATTR_PFX);
        let metabox = self.sb.has_incompat(INCOMPAT_METABOX);
        let packed = self.sb.has_incompat(INCOMPAT_FRAGMENTS) && self.sb.packed_nid != 0;
        let holder: Option<Inode> = if plain || (!metabox && !packed) {
            None
        } else if metabox {
            Some(self.metabox_inode()?.clone())
        } else {
            Some(self.packed_inode()?.clone())
        };
        let read = |buf: &mut [u8], pos: u64| -> Result<()> {
            match &holder {
                None => self.read_raw(buf, pos),
                Some(ino) => {
                    let n = self.read_at(ino, pos, buf)?;
                    if n != buf.len() {
                        return Err(corrupt(
                            CorruptKind::BadXattrPrefix,
                            Some(ino.nid),
                            Some(pos),
                            None,
                            "prefix table beyond its inode",
                        ));
                    }
                    Ok(())
                }
            }
        };
        let mut pos = u64::from(self.sb.xattr_prefix_start) * 4;
        let mut v = Vec::with_capacity(count);
        for _ in 0..count {
            pos = (pos + 3) & !3;
            let mut l = [0u8; 2];
            read(&mut l, pos)?;
            let len = usize::from(u16::from_le_bytes(l));
            if len == 0 || len > 256 {
                return Err(corrupt(
                    CorruptKind::BadXattrPrefix,
                    None,
                    Some(pos),
                    Some(len as u64),
                    "bad long prefix length",
                ));
            }
            let mut rec = vec![0u8; len];
            read(&mut rec, pos + 2)?;
            let base = rec[0];
            if short_prefix(base).is_none() && base != 0 {
                return Err(corrupt(
                    CorruptKind::BadXattrPrefix,
                    None,
                    Some(pos),
                    Some(u64::from(base)),
                    "long prefix with an unknown base index",
                ));
            }
            v.push((base, rec[1..].to_vec()));
            pos += 2 + len as u64;
        }
        Ok(v)
    }

    /// The long xattr name prefixes in table order, each in full (its short prefix,
    /// none for an internal one, then the infix).
    pub fn xattr_prefixes(&self) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .long_prefixes()?
            .iter()
            .map(|(base, infix)| {
                let mut p = short_prefix(*base).unwrap_or_default().to_vec();
                p.extend_from_slice(infix);
                p
            })
            .collect())
    }

    /// Full name for (index, stored suffix); None for internal/unknown namespaces, which
    /// the kernel does not list either.
    /// With `hidden`, a long prefix of no namespace (base index 0, e.g. the content
    /// fingerprint's) gives its infix and the suffix too.
    fn full_name(&self, index: u8, suffix: &[u8], hidden: bool) -> Result<Option<Vec<u8>>> {
        if index & LONG_PREFIX_FLAG != 0 {
            let pfx = self.long_prefixes()?;
            let (base, infix) = pfx
                .get(usize::from(index & LONG_PREFIX_INDEX_MASK))
                .ok_or_else(|| {
                    corrupt(
                        CorruptKind::BadXattr,
                        None,
                        None,
                        Some(u64::from(index)),
                        "long prefix index out of range",
                    )
                })?;
            let p: &[u8] = match short_prefix(*base) {
                Some(p) => p,
                None if hidden && *base == 0 => b"",
                None => return Ok(None),
            };
            if *base == INDEX_LUSTRE {
                return Ok(None);
            }
            let mut n = p.to_vec();
            n.extend_from_slice(infix);
            n.extend_from_slice(suffix);
            return Ok(Some(n));
        }
        match short_prefix(index) {
            Some(_) if index == INDEX_LUSTRE => Ok(None),
            Some(p) => {
                if (index == INDEX_POSIX_ACL_ACCESS || index == INDEX_POSIX_ACL_DEFAULT)
                    && !suffix.is_empty()
                {
                    return Ok(None);
                }
                let mut n = p.to_vec();
                n.extend_from_slice(suffix);
                Ok(Some(n))
            }
            None => Ok(None),
        }
    }

    /// Parse entries from `area[start..]` into `out`. Bounded by the area length.
    fn parse_entries(
        &self,
        nid: u64,
        area: &[u8],
        start: usize,
        hidden: bool,
        out: &mut Vec<Xattr>,
    ) -> Result<()> {
        let mut p = start;
        while p + ENTRY_HEADER_SIZE <= area.len() {
            let mut h = [0u8; ENTRY_HEADER_SIZE];
            h.copy_from_slice(&area[p..p + ENTRY_HEADER_SIZE]);
            let eh = EntryHeader::parse(&h);
            let size = eh.entry_size();
            let name_end = p + ENTRY_HEADER_SIZE + usize::from(eh.name_len);
            let val_end = name_end + usize::from(eh.value_size);
            if val_end > area.len() {
                return Err(corrupt(
                    CorruptKind::BadXattr,
                    Some(nid),
                    Some(p as u64),
                    Some(val_end as u64),
                    "inline xattr entry overruns its area",
                ));
            }
            if let Some(name) = self.full_name(
                eh.name_index,
                &area[p + ENTRY_HEADER_SIZE..name_end],
                hidden,
            )? {
                out.push(Xattr {
                    name,
                    value: area[name_end..val_end].to_vec(),
                });
            }
            p += size;
        }
        Ok(())
    }

    fn shared_entry(&self, nid: u64, id: u32, hidden: bool) -> Result<Option<Xattr>> {
        let in_mb = self.sb.has_compat(COMPAT_SHARED_EA_IN_METABOX);
        let rel = u64::from(id) * 4;
        let read = |buf: &mut [u8], pos: u64| -> Result<()> {
            if in_mb {
                let mb = self.metabox_inode()?;
                let n = self.read_at(mb, pos, buf)?;
                if n != buf.len() {
                    return Err(corrupt(
                        CorruptKind::BadXattr,
                        Some(nid),
                        Some(pos),
                        Some(u64::from(id)),
                        "shared xattr beyond the metabox",
                    ));
                }
                Ok(())
            } else {
                self.read_raw(buf, pos).map_err(|_| {
                    corrupt(
                        CorruptKind::BadXattr,
                        Some(nid),
                        Some(pos),
                        Some(u64::from(id)),
                        "shared xattr id beyond the image",
                    )
                })
            }
        };
        let pos = if in_mb {
            rel
        } else {
            self.blk_pos(u64::from(self.sb.xattr_blkaddr))
                .and_then(|b| b.checked_add(rel))
                .ok_or_else(|| {
                    corrupt(
                        CorruptKind::BadXattr,
                        Some(nid),
                        None,
                        Some(u64::from(id)),
                        "shared xattr id overflows",
                    )
                })?
        };
        let mut h = [0u8; ENTRY_HEADER_SIZE];
        read(&mut h, pos)?;
        let eh = EntryHeader::parse(&h);
        let mut body = vec![0u8; usize::from(eh.name_len) + usize::from(eh.value_size)];
        read(&mut body, pos + ENTRY_HEADER_SIZE as u64)?;
        let (name, value) = body.split_at(usize::from(eh.name_len));
        Ok(self
            .full_name(eh.name_index, name, hidden)?
            .map(|name| Xattr {
                name,
                value: value.to_vec(),
            }))
    }

    /// The inline area of an inode (empty when it has none).
    fn xattr_area(&self, ino: &Inode) -> Result<Vec<u8>> {
        let core = if ino.extended {
            EXTENDED_SIZE
        } else {
            COMPACT_SIZE
        } as u64;
        let size = (ino.meta_size - core) as usize;
        let mut area = vec![0u8; size];
        if size > 0 {
            self.read_inode_meta(ino.nid, core, &mut area)?;
        }
        Ok(area)
    }

    /// The inode's xattr area and the end of its shared-id array (after the header),
    /// checked; `None` when the inode has no xattrs.
    fn xattr_ibody(&self, ino: &Inode) -> Result<Option<(Vec<u8>, usize)>> {
        let area = self.xattr_area(ino)?;
        if area.is_empty() {
            return Ok(None);
        }
        if area.len() < IBODY_HEADER_SIZE {
            return Err(corrupt(
                CorruptKind::BadXattr,
                Some(ino.nid),
                None,
                Some(area.len() as u64),
                "xattr area smaller than its header",
            ));
        }
        let mut hb = [0u8; IBODY_HEADER_SIZE];
        hb.copy_from_slice(&area[..IBODY_HEADER_SIZE]);
        let h = IbodyHeader::parse(&hb);
        let ids_end = IBODY_HEADER_SIZE + 4 * usize::from(h.shared_count);
        if ids_end > area.len() {
            return Err(corrupt(
                CorruptKind::BadXattr,
                Some(ino.nid),
                None,
                Some(u64::from(h.shared_count)),
                "shared xattr count overruns the area",
            ));
        }
        Ok(Some((area, ids_end)))
    }

    /// The ids of the shared attributes the inode refers to, in on-disk order (each
    /// is the entry's offset in the shared area / 4).
    pub fn xattr_shared_ids(&self, ino: &Inode) -> Result<Vec<u32>> {
        let Some((area, ids_end)) = self.xattr_ibody(ino)? else {
            return Ok(Vec::new());
        };
        Ok(area[IBODY_HEADER_SIZE..ids_end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// All attributes: inline entries first, then shared ones, in on-disk order.
    pub fn xattrs(&self, ino: &Inode) -> Result<Vec<Xattr>> {
        self.xattrs_with(ino, false)
    }

    /// All attributes, those under a long prefix of no namespace too (`hidden`).
    fn xattrs_with(&self, ino: &Inode, hidden: bool) -> Result<Vec<Xattr>> {
        let mut out = Vec::new();
        let Some((area, ids_end)) = self.xattr_ibody(ino)? else {
            return Ok(out);
        };
        self.parse_entries(ino.nid, &area, ids_end, hidden, &mut out)?;
        for c in area[IBODY_HEADER_SIZE..ids_end].chunks_exact(4) {
            let id = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if let Some(x) = self.shared_entry(ino.nid, id, hidden)? {
                out.push(x);
            }
        }
        Ok(out)
    }

    /// The name of the content-fingerprint xattr (`--xattr-inode-digest`), when the
    /// superblock names one (`COMPAT_ISHARE_XATTRS`).
    pub fn fingerprint_name(&self) -> Result<Option<Vec<u8>>> {
        if !self.sb.has_compat(COMPAT_ISHARE_XATTRS) {
            return Ok(None);
        }
        let id = self.sb.ishare_xattr_prefix_id & LONG_PREFIX_INDEX_MASK;
        match self.xattr_prefixes()?.get(usize::from(id)) {
            Some(p) => Ok(Some(p.clone())),
            None => Err(corrupt(
                CorruptKind::BadXattrPrefix,
                None,
                None,
                Some(u64::from(id)),
                "fingerprint prefix index beyond the prefix table",
            )),
        }
    }

    /// The inode's content fingerprint (the value of the xattr the superblock names,
    /// e.g. `sha256:` and 32 bytes), hidden namespaces included.
    pub fn fingerprint(&self, ino: &Inode) -> Result<Option<Vec<u8>>> {
        let Some(name) = self.fingerprint_name()? else {
            return Ok(None);
        };
        Ok(self
            .xattrs_with(ino, true)?
            .into_iter()
            .find(|x| x.name == name)
            .map(|x| x.value))
    }

    /// One attribute by full name (uses the bloom filter when it is valid).
    pub fn get_xattr(&self, ino: &Inode, name: &[u8]) -> Result<Option<Vec<u8>>> {
        if ino.meta_size as usize
            <= if ino.extended {
                EXTENDED_SIZE
            } else {
                COMPACT_SIZE
            }
        {
            return Ok(None);
        }
        let Some((idx, suffix)) = split_name(name) else {
            return Ok(None);
        };
        if self.sb.has_compat(COMPAT_XATTR_FILTER) && self.sb.xattr_filter_reserved == 0 {
            let mut hb = [0u8; 4];
            let core = if ino.extended {
                EXTENDED_SIZE
            } else {
                COMPACT_SIZE
            } as u64;
            self.read_inode_meta(ino.nid, core, &mut hb)?;
            let filter = u32::from_le_bytes(hb);
            if filter & (1 << filter_bit(idx, suffix)) != 0 {
                return Ok(None);
            }
        }
        Ok(self
            .xattrs(ino)?
            .into_iter()
            .find(|x| x.name == name)
            .map(|x| x.value))
    }
}

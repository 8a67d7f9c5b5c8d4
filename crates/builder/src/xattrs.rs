//! Xattr plan: which attributes are shared (stored once, referenced by id) and the
//! inline area of every inode, with its bloom filter.

use crate::scan::{InodeId, Tree};
use ferofs_format::inode::xattr_icount_for;
use ferofs_format::xattr::*;
use std::collections::HashMap;

/// An attribute is shared when more than this many inodes carry it (as mkfs.erofs).
pub const SHARE_THRESHOLD: usize = 2;

pub struct XattrPlan {
    /// The shared area, entries back to back (ids are offsets / 4 into it).
    pub shared_area: Vec<u8>,
    /// Per inode: the inline area (empty when the inode has no xattrs) and whether it
    /// has a non-empty filter.
    pub ibody: Vec<Vec<u8>>,
    pub any: bool,
}

fn encode(name: &[u8], value: &[u8], long: &[LongPrefix]) -> Vec<u8> {
    encode_named(name, value, long).unwrap_or_default()
}

/// `metabox`: the inodes live in the metabox inode. Linux 6.17-6.18 read an inode's
/// shared xattrs through the buffer its inline xattrs left behind, which holds a page
/// of the metabox, not of the image, whenever the two page indexes meet (seen with
/// 512- and 1024-byte blocks): the kernel then misses or garbles the shared entries.
/// So in a metabox image an inode keeps all its xattrs inline or all shared, never both
/// (the metabox is compressed, so the repeated inline entries cost little).
/// `long`: the long name prefixes (`--xattr-prefix`), which names use when they can.
pub fn plan(tree: &Tree, metabox: bool, long: &[LongPrefix]) -> XattrPlan {
    plan_with(tree, metabox, long, true)
}

/// [`plan`], with no shared xattrs unless `share` (an in-place append, whose image
/// keeps its shared area as it is).
pub fn plan_with(tree: &Tree, metabox: bool, long: &[LongPrefix], share: bool) -> XattrPlan {
    let mut counts: HashMap<(&[u8], &[u8]), usize> = HashMap::new();
    for n in &tree.nodes {
        for (k, v) in &n.xattrs {
            *counts.entry((k.as_slice(), v.as_slice())).or_default() += 1;
        }
    }
    // Shared entries sorted by (name, value) for reproducibility.
    let mut shared: Vec<(&[u8], &[u8])> = counts
        .iter()
        .filter(|(_, &c)| share && c > SHARE_THRESHOLD)
        .map(|(k, _)| *k)
        .collect();
    shared.sort();
    let mut shared_area = Vec::new();
    let mut ids: HashMap<(&[u8], &[u8]), u32> = HashMap::new();
    for (k, v) in &shared {
        ids.insert((k, v), (shared_area.len() / 4) as u32);
        shared_area.extend_from_slice(&encode(k, v, long));
    }
    let mut any = false;
    let ibody = tree
        .nodes
        .iter()
        .map(|n| {
            if n.xattrs.is_empty() {
                return Vec::new();
            }
            any = true;
            let mut mask = 0u32;
            let mut sids = Vec::new();
            let mut inline = Vec::new();
            for (k, v) in &n.xattrs {
                if let Some((idx, suffix)) = split_name(k) {
                    mask |= 1 << filter_bit(idx, suffix);
                }
                match ids.get(&(k.as_slice(), v.as_slice())) {
                    Some(&id) if sids.len() < 255 => sids.push(id),
                    _ => inline.extend_from_slice(&encode(k, v, long)),
                }
            }
            if metabox && !sids.is_empty() && !inline.is_empty() {
                let all: Vec<u8> = n
                    .xattrs
                    .iter()
                    .flat_map(|(k, v)| encode(k, v, long))
                    .collect();
                // (Unless the whole would not fit one inode's area: no real tree has that.)
                if xattr_icount_for(IBODY_HEADER_SIZE + all.len()).is_some() {
                    sids.clear();
                    inline = all;
                }
            }
            let h = IbodyHeader {
                name_filter: !mask,
                shared_count: sids.len() as u8,
            };
            let mut area = h.encode().to_vec();
            for id in sids {
                area.extend_from_slice(&id.to_le_bytes());
            }
            area.extend_from_slice(&inline);
            // A header-only area (icount 1) is invalid: pad to the minimum.
            if area.len() < 16 {
                area.resize(16, 0);
            }
            debug_assert!(xattr_icount_for(area.len()).is_some());
            area
        })
        .collect();
    XattrPlan {
        shared_area,
        ibody,
        any,
    }
}

/// Most bytes `--root-xattr-isize` may ask for: what mkfs.erofs allows (an xattr
/// area of 65,535 bytes less one entry header, 4-aligned).
pub const ROOT_XATTR_ISIZE_MAX: usize = 65_532;

/// `--root-xattr-isize`: make inode `root`'s xattr area at least `bytes` long (rounded
/// up to 4), the rest zeros, which readers skip as entries of no namespace (the
/// kernel lists none of them): room for a tool to add xattrs to the root in place.
pub fn reserve_root(plan: &mut XattrPlan, root: InodeId, bytes: usize) {
    let want = bytes.min(ROOT_XATTR_ISIZE_MAX).div_ceil(4) * 4;
    let Some(area) = plan.ibody.get_mut(root) else {
        return;
    };
    if want == 0 || area.len() >= want {
        return;
    }
    if area.is_empty() {
        let h = IbodyHeader {
            name_filter: !0,
            shared_count: 0,
        };
        area.extend_from_slice(&h.encode());
    }
    area.resize(want.max(16), 0);
    plan.any = true;
}

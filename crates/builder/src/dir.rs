//! Directory contents: entries (".." and, unless `-E dot-omitted`, "." included) sorted bytewise, packed greedily
//! into blocks (an entry never spans blocks), names after the dirent array. Planned
//! before the nids are known ([`plan`]), encoded once they are ([`DirPlan::encode`]).

use crate::scan::{InodeId, Kind, Tree};
use ferofs_format::dirent::{file_type_of_mode, Dirent, DIRENT_SIZE, FT_DIR};

/// Entries of one directory: (name, target inode id, file type).
pub type DirEntries = Vec<(Vec<u8>, usize, u8)>;

/// A directory's content, known before the nids: its sorted entries, their split into
/// blocks and its size.
#[derive(Debug, Clone)]
pub struct DirPlan {
    pub entries: DirEntries,
    pub blocks: Vec<std::ops::Range<usize>>,
    pub size: u64,
}

/// The content of directory `id` of `tree` (None when `id` is not a directory);
/// without a "." entry when `dot_omitted` (the inode then says DOT_OMITTED).
pub fn plan(tree: &Tree, id: InodeId, blksz: usize, dot_omitted: bool) -> Option<DirPlan> {
    let Kind::Dir { entries, parent } = &tree.nodes[id].kind else {
        return None;
    };
    let parent = if id == tree.root { id } else { *parent };
    let mut es: DirEntries = Vec::with_capacity(entries.len() + 2);
    if !dot_omitted {
        es.push((b".".to_vec(), id, FT_DIR));
    }
    es.push((b"..".to_vec(), parent, FT_DIR));
    for (name, c) in entries {
        es.push((name.clone(), *c, file_type_of_mode(tree.nodes[*c].mode)));
    }
    es.sort_by(|a, b| a.0.cmp(&b.0));
    let (blocks, size) = layout(&es, blksz);
    Some(DirPlan {
        entries: es,
        blocks,
        size,
    })
}

impl DirPlan {
    /// The directory's bytes once every nid is known: full blocks zero-padded, the last
    /// one only as long as its entries.
    pub fn encode(&self, blksz: usize, nid_of: &dyn Fn(usize) -> u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.size as usize);
        for (i, r) in self.blocks.iter().enumerate() {
            let mut b = encode_block(&self.entries[r.clone()], nid_of);
            if i + 1 < self.blocks.len() {
                b.resize(blksz, 0);
            }
            v.extend_from_slice(&b);
        }
        v
    }
}

/// Split sorted entries into blocks; returns the index ranges and the directory size.
pub fn layout(entries: &DirEntries, blksz: usize) -> (Vec<std::ops::Range<usize>>, u64) {
    let mut blocks = Vec::new();
    let mut start = 0;
    let mut used = 0usize;
    for (i, (name, _, _)) in entries.iter().enumerate() {
        let need = DIRENT_SIZE + name.len();
        if used + need > blksz {
            blocks.push(start..i);
            start = i;
            used = 0;
        }
        used += need;
    }
    blocks.push(start..entries.len());
    let size = (blocks.len() as u64 - 1) * blksz as u64 + used as u64;
    (blocks, size)
}

/// Encode one directory block (exactly its used bytes; the caller zero-pads full blocks).
pub fn encode_block(entries: &[(Vec<u8>, usize, u8)], nid_of: &dyn Fn(usize) -> u64) -> Vec<u8> {
    let mut head = Vec::with_capacity(entries.len() * DIRENT_SIZE);
    let mut names = Vec::new();
    let base = entries.len() * DIRENT_SIZE;
    for (name, id, ft) in entries {
        let d = Dirent {
            nid: nid_of(*id),
            nameoff: (base + names.len()) as u16,
            file_type: *ft,
        };
        head.extend_from_slice(&d.encode());
        names.extend_from_slice(name);
    }
    head.extend_from_slice(&names);
    head
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn packs_greedily() {
        let mut e: DirEntries = vec![(b".".to_vec(), 0, 2), (b"..".to_vec(), 0, 2)];
        for i in 0..300u32 {
            e.push((format!("name-{i:05}").into_bytes(), 1, 1));
        }
        e.sort();
        let (blocks, size) = layout(&e, 4096);
        // "." (13) + ".." (14) + 184 names of 22 bytes fill block 0.
        assert_eq!(blocks[0].len(), 186);
        assert_eq!(size, 4096 + 116 * 22);
    }
}

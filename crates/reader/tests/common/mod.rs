//! A tiny image generator for crafted regression images: uncompressed, compact inodes,
//! every inode's data inline behind it (so each payload fits in one block), no xattrs.
//! Small enough to describe a minimised corruption exactly.
#![allow(dead_code)]

use ferofs_format::dirent::{file_type_of_mode, Dirent, DIRENT_SIZE};
use ferofs_format::inode::*;
use ferofs_format::sb::*;

pub const BS: usize = 4096;

/// One inode of a crafted image.
#[derive(Clone)]
pub enum Node {
    /// Entries (name, node index), "." and ".." included by the caller if wanted.
    Dir(Vec<(Vec<u8>, usize)>),
    File(Vec<u8>),
    Symlink(Vec<u8>),
    /// A compressed file (full indexes, extended inode): its size, and the bytes after
    /// the inode core (map header at +0, then 8 reserved bytes, then the indexes). May
    /// span blocks.
    Compressed {
        size: u64,
        meta: Vec<u8>,
    },
}

/// Offset of full index `i` in a [`Node::Compressed`]'s `meta`.
pub fn full_index_at(i: usize) -> usize {
    16 + 8 * i
}

impl Node {
    fn mode(&self) -> u16 {
        match self {
            Node::Dir(_) => S_IFDIR | 0o755,
            Node::File(_) | Node::Compressed { .. } => S_IFREG | 0o644,
            Node::Symlink(_) => S_IFLNK | 0o777,
        }
    }
}

fn dir_payload(ents: &[(Vec<u8>, usize)], nodes: &[Node], nids: &[u64]) -> Vec<u8> {
    let mut ents: Vec<&(Vec<u8>, usize)> = ents.iter().collect();
    ents.sort_by(|a, b| a.0.cmp(&b.0));
    let mut head = Vec::new();
    let mut names = Vec::new();
    let base = ents.len() * DIRENT_SIZE;
    for (name, i) in &ents {
        let d = Dirent {
            nid: nids.get(*i).copied().unwrap_or(0),
            nameoff: (base + names.len()) as u16,
            file_type: file_type_of_mode(nodes[*i].mode()),
        };
        head.extend_from_slice(&d.encode());
        names.extend_from_slice(name);
    }
    head.extend_from_slice(&names);
    head
}

/// The image of `nodes` with node `root` as the root directory.
pub fn image(nodes: &[Node], root: usize) -> Vec<u8> {
    let payload = |i: usize, nids: &[u64]| -> Vec<u8> {
        match &nodes[i] {
            Node::Dir(e) => dir_payload(e, nodes, nids),
            Node::File(d) | Node::Symlink(d) => d.clone(),
            Node::Compressed { meta, .. } => meta.clone(),
        }
    };
    // Place inodes from block 1 on; an inode and its inline data never cross a block.
    let meta = BS;
    let mut pos = 0usize;
    let mut nids = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let spans = matches!(node, Node::Compressed { .. });
        let core = if spans { EXTENDED_SIZE } else { COMPACT_SIZE };
        let len = core + payload(i, &[]).len();
        assert!(
            spans || len <= BS,
            "node {i}: payload does not fit one block"
        );
        if pos % BS + len > BS {
            pos = pos.div_ceil(BS) * BS;
        }
        nids.push((pos / 32) as u64);
        pos += len.div_ceil(32) * 32;
    }
    let total = (meta + pos).div_ceil(BS) * BS;
    let mut img = vec![0u8; total];
    for (i, node) in nodes.iter().enumerate() {
        let p = payload(i, &nids);
        let nlink = match node {
            Node::Dir(_) => 2,
            _ => 1,
        };
        let at = meta + nids[i] as usize * 32;
        let enc: Vec<u8> = match node {
            Node::Compressed { size, .. } => InodeCore {
                format: make_format(true, DataLayout::CompressedFull, false),
                mode: node.mode(),
                size: *size,
                ino: i as u32 + 1,
                nlink_ext: 1,
                ..Default::default()
            }
            .encode_extended()
            .to_vec(),
            _ => InodeCore {
                format: make_format(false, DataLayout::FlatInline, false),
                mode: node.mode(),
                nb: nlink,
                size: p.len() as u64,
                ino: i as u32 + 1,
                ..Default::default()
            }
            .encode_compact()
            .to_vec(),
        };
        img[at..at + enc.len()].copy_from_slice(&enc);
        img[at + enc.len()..at + enc.len() + p.len()].copy_from_slice(&p);
    }
    let sb = Superblock {
        magic: MAGIC,
        blkszbits: 12,
        rootnid_2b: u16::try_from(nids[root]).expect("root nid fits 16 bits"),
        inos: nodes.len() as u64,
        blocks_lo: (total / BS) as u32,
        meta_blkaddr: 1,
        feature_incompat: INCOMPAT_ZERO_PADDING,
        ..Default::default()
    };
    let b = sb.encode();
    img[1024..1024 + b.len()].copy_from_slice(&b);
    img
}

/// A chain of `depth` directories below the root, each holding the next as "a"; the
/// last holds a file "leaf".
pub fn deep_chain(depth: usize) -> Vec<u8> {
    let mut nodes = Vec::with_capacity(depth + 2);
    for i in 0..=depth {
        let parent = i.saturating_sub(1);
        let next = i + 1;
        let name: &[u8] = if i == depth { b"leaf" } else { b"a" };
        nodes.push(Node::Dir(vec![
            (b".".to_vec(), i),
            (b"..".to_vec(), parent),
            (name.to_vec(), next),
        ]));
    }
    nodes.push(Node::File(b"x".to_vec()));
    image(&nodes, 0)
}

/// The nid of node `i` in [`image`]'s output (the same placement rule).
pub fn nid_of(img: &[u8], path: &[u8]) -> u64 {
    let im = ferofs_reader::Image::new(img.to_vec()).expect("open crafted image");
    im.lookup(path).expect("crafted path").nid
}

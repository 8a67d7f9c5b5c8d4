//! The `build_roundtrip` target: the fuzzer's bytes describe a small tree and build
//! options; the tree is written as a tar stream (PAX headers: names, link targets,
//! owners, times with nanoseconds, xattrs), built into an image with ferofs-builder's
//! tar input, and read back with ferofs-reader. Every name, type, mode, owner, mtime,
//! xattr, file content, symlink target, device number and hardlink identity must come
//! back as described; any difference (or a build or read error) panics.
//!
//! Input format (every byte string is valid: past its end the input reads as zeros):
//!
//! ```text
//! header  alg  level  pcluster  flags  bsize  alg2    (6 bytes)
//!   alg % 6: none, lz4, lz4hc, zstd, lzma, deflate;
//!   pcluster: 4 KiB << (b % 5), 128 KiB for b >= 240
//!   flags: 1 ztailpacking, 2 dedupe, 4|8 fragments (off, tails, all, tails with the
//!   alg2 pcluster), 16 metabox, 32 no inline data, 64 a second algorithm (alg2 % 5 + 1,
//!   pcluster 4 KiB << (alg2 / 16 % 5)) for names ending in a digit 0-4 (a hint;
//!   those files stored uncompressed instead when alg2 >= 0xC0),
//!   128 block size 512 << (bsize % 4) (else 4096)
//!   bsize: also 16 the 48-bit layout, 32 no "." entries (dot-omitted)
//!   level >= 0xE0: full indexes for every compressed file (`-E legacy-compress`)
//!   alg2 & 32: every file's data at a multiple of 2 + level % 7 blocks (`--dsunit`)
//!   bsize & 64 without chunks: long xattr prefixes `trusted.`, `user.a`,
//!   `security.selinux` (`--xattr-prefix`), plain when level is odd; content
//!   fingerprints (`--xattr-inode-digest`) too when level % 4 < 2
//! root    meta
//! entry*  op parent name (meta kind-data | target)     (until the input ends; at most 48)
//!   op % 8: 0 directory, 1 2 7 regular file, 3 symlink, 4 hardlink, 5 device, 6 fifo
//!   parent: index among the directories so far (0 the root); name: see `name`
//!   meta: mode (2 bytes), owner class, time class, time byte, xattr count, xattrs
//!   file: segment count % 5, each kind and length (see `content`)
//!   symlink: length byte, character byte;  device: major, minor (3 bytes), char/block
//!   hardlink: index among the non-directories so far
//! ```

use ferofs_builder::{
    BuildOptions, ChunkOptions, Compression, Fragments, Hint, InodeVersion, TarInput,
};
use ferofs_compress::CompressorSpec;
use ferofs_format::inode::*;
use ferofs_reader::{Image, ReadCtx};
use std::collections::{BTreeMap, HashMap};

const MAX_ENTRIES: usize = 48;
/// File bytes per file and per input.
const MAX_FILE: usize = 300 << 10;
const MAX_TOTAL: usize = 1 << 20;
const BASE_TIME: i64 = 1_700_000_000;

struct In<'a> {
    d: &'a [u8],
    pos: usize,
}

impl In<'_> {
    fn u8(&mut self) -> u8 {
        let b = self.d.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }
    fn done(&self) -> bool {
        self.pos >= self.d.len()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    File(Vec<u8>),
    Symlink(Vec<u8>),
    /// Character (true) or block device, major, minor.
    Device(bool, u32, u32),
    Fifo,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: NodeKind,
    /// Permission bits only.
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub nsec: u32,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Names (paths without a leading '/'); the root has the one empty name.
    pub names: Vec<Vec<u8>>,
    /// Directories: child name -> node.
    pub children: BTreeMap<Vec<u8>, usize>,
}

impl Node {
    fn ftype(&self) -> u16 {
        match self.kind {
            NodeKind::Dir => S_IFDIR,
            NodeKind::File(_) => S_IFREG,
            NodeKind::Symlink(_) => S_IFLNK,
            NodeKind::Device(true, ..) => S_IFCHR,
            NodeKind::Device(false, ..) => S_IFBLK,
            NodeKind::Fifo => S_IFIFO,
        }
    }
}

/// One tar entry, in stream order: a node's first name, or a hardlink to it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub node: usize,
    pub path: Vec<u8>,
    pub hardlink: bool,
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub opts: BuildOptions,
    /// Node 0 is the root.
    pub nodes: Vec<Node>,
    pub entries: Vec<Entry>,
}

fn name(b: u8, extra: u8) -> Vec<u8> {
    match b {
        0..=199 => vec![b'a' + b % 26, b'0' + b / 26],
        200..=239 => {
            // Long names around the lengths where dirents spill into a next block.
            let mut v = vec![b'L'; 4 * usize::from(b - 199) + usize::from(extra % 4)];
            v.push(b'0' + extra % 10);
            v
        }
        _ => {
            // 255 bytes, some of them not ASCII.
            let mut v = vec![0xC3; 254];
            for (i, c) in v.iter_mut().enumerate() {
                if i % 2 == 1 {
                    *c = 0xA0 + (b % 16);
                }
            }
            v.push(b'0' + extra % 10);
            v
        }
    }
}

fn xattr_name(n: u8) -> Vec<u8> {
    let prefix: &[u8] = [&b"user."[..], b"trusted.", b"security."][usize::from(n % 3)];
    let suffix: Vec<u8> = match n / 3 % 6 {
        0 => b"a".to_vec(),
        1 => b"b".to_vec(),
        2 => b"selinux".to_vec(),
        3 => b"mime_type".to_vec(),
        4 => vec![b'x'; 60],
        _ => format!("k{}", n / 18).into_bytes(),
    };
    [prefix, &suffix].concat()
}

fn xattr_value(v: u8, salt: u8) -> Vec<u8> {
    let len = if v >= 224 {
        usize::from(v - 223) * 40
    } else {
        usize::from(v % 32)
    };
    (0..len)
        .map(|i| match salt % 3 {
            0 => b'v',
            1 => (i as u8).wrapping_mul(salt),
            _ => b"0123456789abcdef=\n "[i % 19],
        })
        .collect()
}

fn meta(r: &mut In, kind: NodeKind) -> Node {
    let perm = r.u16() & 0o7777;
    let own = r.u8();
    let id = |class: u8, b: u8| -> u32 {
        match class & 3 {
            0 => 0,
            1 => 1000,
            2 => u32::from(b) * 7,
            _ => 65_536 + u32::from(b) * 100_003,
        }
    };
    let tc = r.u8();
    let tb = r.u8();
    let (mtime, nsec) = match tc % 5 {
        0 => (BASE_TIME, 0),
        1 => (BASE_TIME - i64::from(tb) * 86_400, 0),
        2 => (BASE_TIME, u32::from(tb) * 3_921_568),
        3 => (4_000_000_000 + i64::from(tb), 0),
        _ => (i64::from(tb), 0),
    };
    let mut xattrs = BTreeMap::new();
    for _ in 0..r.u8() % 4 {
        let n = r.u8();
        let v = r.u8();
        xattrs.insert(xattr_name(n), xattr_value(v, n));
    }
    Node {
        kind,
        perm,
        uid: id(own, tb),
        gid: id(own >> 2, own),
        mtime,
        nsec,
        xattrs,
        names: Vec::new(),
        children: BTreeMap::new(),
    }
}

/// A file's contents: segments of zeros, one repeated byte, noise, text, or a copy of
/// an earlier file's start (for dedupe).
fn content(r: &mut In, files: &[Vec<u8>], budget: &mut usize) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..r.u8() % 5 {
        let k = r.u8();
        let l = r.u8();
        let unit = [1usize, 16, 256, 1024][usize::from(k >> 6)];
        let len = (usize::from(l) * unit).min(MAX_FILE - v.len()).min(*budget);
        *budget -= len;
        match k % 5 {
            0 => v.resize(v.len() + len, 0),
            1 => v.resize(v.len() + len, k),
            2 => {
                let mut s = u64::from(k) << 32 | u64::from(l) | 1;
                v.extend((0..len).map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 24) as u8
                }));
            }
            3 => {
                let mut t = Vec::new();
                let mut i = 0u32;
                while t.len() < len {
                    t.extend_from_slice(format!("line {} of {}\n", i % 37, k).as_bytes());
                    i += 1;
                }
                t.truncate(len);
                v.extend(t);
            }
            _ => match files.get(usize::from(l) % files.len().max(1)) {
                Some(f) => {
                    let n = f.len().min(MAX_FILE - v.len());
                    v.extend_from_slice(&f[..n]);
                }
                None => v.resize(v.len() + len, 0xAA),
            },
        }
    }
    v
}

fn spec_options(r: &mut In) -> BuildOptions {
    let alg = r.u8();
    let level = r.u8();
    // 240..=255: 128 KiB, where zstd fills pclusters piece by piece (and from level
    // 10 cuts each piece to what LZ4 fits first); below, the mapping seeds were
    // written with.
    let pcluster = match r.u8() {
        b @ 0..=239 => 4096u32 << (b % 5),
        _ => 128 << 10,
    };
    let flags = r.u8();
    let bsize = r.u8();
    let alg2 = r.u8();
    let block_size = if flags & 128 != 0 {
        512u32 << (bsize % 4)
    } else {
        4096
    };
    let spec = |a: u8, level: u8| -> Option<CompressorSpec> {
        let s = match a {
            1 => "lz4".to_string(),
            2 => format!("lz4hc,level={}", 1 + level % 12),
            3 => format!("zstd,level={}", i32::from(level % 24) - 4),
            4 => format!("lzma,level={}", level % 10),
            5 => format!("deflate,level={}", 1 + level % 12),
            _ => return None,
        };
        CompressorSpec::parse(&s).ok()
    };
    let pcluster2 = 4096u32 << (alg2 / 16 % 5);
    let compression = spec(alg % 6, level).map(|first| {
        let mut algorithms = vec![first];
        let mut hints = Vec::new();
        if flags & 64 != 0 {
            if let (Some(second), Ok(regex)) =
                (spec(alg2 % 5 + 1, level / 16), regex::Regex::new("[0-4]$"))
            {
                algorithms.push(second);
                hints.push(Hint {
                    pcluster_size: pcluster2,
                    algorithm: 1,
                    regex,
                    // A quarter of the time the matching files are stored uncompressed
                    // (`--sort-compress none`).
                    uncompressed: alg2 >= 0xC0,
                });
            }
        }
        Compression {
            algorithms,
            pcluster_size: pcluster,
            ztailpacking: flags & 1 != 0,
            hints,
            max_extent: 0,
            // An eighth of the time every file with full indexes (`-E legacy-compress`).
            full_index: level >= 0xE0,
        }
    });
    let fragments = match (compression.is_some(), flags >> 2 & 3) {
        (false, _) | (_, 0) => Fragments::Off,
        (_, 1) => Fragments::Tails { pcluster_size: 0 },
        (_, 2) => Fragments::All { pcluster_size: 0 },
        _ => Fragments::Tails {
            pcluster_size: pcluster2,
        },
    };
    // Uncompressed images: chunk-based files (`--chunksize`) half the time.
    let chunks = (compression.is_none() && bsize & 128 != 0).then(|| ChunkOptions {
        bits: block_size.trailing_zeros() as u8 + alg2 % 4,
        indexes: bsize & 64 != 0,
        dedupe: alg2 & 0x40 == 0,
    });
    let prefixes = bsize & 64 != 0 && chunks.is_none();
    BuildOptions {
        xattr_prefixes: if prefixes {
            vec![
                b"trusted.".to_vec(),
                b"user.a".to_vec(),
                b"security.selinux".to_vec(),
            ]
        } else {
            Vec::new()
        },
        plain_xattr_prefixes: prefixes && level % 2 == 1,
        inode_digest: (prefixes && level % 4 < 2).then(|| b"erofs.fingerprint.v1".to_vec()),
        block_size,
        chunks,
        inode_version: if bsize & 4 != 0 {
            InodeVersion::Extended
        } else {
            InodeVersion::Auto
        },
        sb_checksum: bsize & 8 == 0,
        compression,
        fragments,
        dedupe: flags & 2 != 0,
        metabox: flags & 16 != 0,
        inline_data: flags & 32 == 0,
        layout48: bsize & 16 != 0,
        dot_omitted: bsize & 32 != 0,
        dsunit: if alg2 & 32 != 0 {
            2 + u32::from(level % 7)
        } else {
            0
        },
        threads: 1,
        ..Default::default()
    }
}

/// Decode the fuzzer's bytes (never fails).
pub fn decode(data: &[u8]) -> Spec {
    let mut r = In { d: data, pos: 0 };
    let opts = spec_options(&mut r);
    let mut root = meta(&mut r, NodeKind::Dir);
    root.names.push(Vec::new());
    let mut nodes = vec![root];
    let mut dirs = vec![0usize];
    let mut linkable: Vec<usize> = Vec::new();
    let mut files: Vec<Vec<u8>> = Vec::new();
    let mut entries = Vec::new();
    let mut budget = MAX_TOTAL;
    while !r.done() && entries.len() < MAX_ENTRIES {
        let op = r.u8() % 8;
        let parent = dirs[usize::from(r.u8()) % dirs.len()];
        let nb = r.u8();
        let nx = r.u8();
        let nm = name(nb, nx);
        if nodes[parent].children.contains_key(&nm) {
            // A repeated name would replace the earlier entry: not described here.
            continue;
        }
        let node = if op == 4 {
            match linkable.get(usize::from(r.u8()) % linkable.len().max(1)) {
                Some(&t) => t,
                None => continue,
            }
        } else {
            let mut n = meta(&mut r, NodeKind::Fifo);
            n.kind = match op {
                0 => NodeKind::Dir,
                3 => {
                    let l = r.u8();
                    let c = r.u8();
                    let len = if l >= 240 {
                        usize::from(l - 239) * 256 - 1
                    } else {
                        1 + usize::from(l % 64)
                    };
                    let alphabet = b"abc/.xyz-_0123456789";
                    NodeKind::Symlink(
                        (0..len)
                            .map(|i| alphabet[(i * usize::from(c | 1) + usize::from(c)) % 20])
                            .collect(),
                    )
                }
                5 => {
                    let major = u32::from(r.u8()) * 16 % 4096;
                    let minor = (u32::from(r.u16()) << 4 | u32::from(r.u8()) & 15) & 0xfffff;
                    NodeKind::Device(r.u8() & 1 == 0, major, minor)
                }
                6 => NodeKind::Fifo,
                _ => {
                    let c = content(&mut r, &files, &mut budget);
                    files.push(c.clone());
                    NodeKind::File(c)
                }
            };
            nodes.push(n);
            nodes.len() - 1
        };
        let mut path = nodes[parent].names[0].clone();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(&nm);
        nodes[parent].children.insert(nm, node);
        nodes[node].names.push(path.clone());
        entries.push(Entry {
            node,
            path,
            hardlink: op == 4,
        });
        if op == 0 {
            dirs.push(node);
        } else if op != 4 {
            linkable.push(node);
        }
    }
    Spec {
        opts,
        nodes,
        entries,
    }
}

fn pax_record(out: &mut Vec<u8>, key: &[u8], val: &[u8]) {
    // "LEN KEY=VAL\n", LEN counting itself.
    let body = key.len() + val.len() + 3;
    let mut len = body + 1;
    while body + len.to_string().len() != len {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(val);
    out.push(b'\n');
}

fn octal(h: &mut [u8], at: usize, width: usize, v: u64) {
    let s = format!("{:0w$o}", v, w = width - 1);
    h[at..at + width - 1].copy_from_slice(&s.as_bytes()[s.len() - (width - 1)..]);
}

fn header(typ: u8, size: u64, mode: u16, devs: (u32, u32)) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[0] = b'x'; // the PAX path overrides it
    octal(&mut h, 100, 8, u64::from(mode));
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, size);
    octal(&mut h, 136, 12, 0);
    h[156] = typ;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    octal(&mut h, 329, 8, u64::from(devs.0));
    octal(&mut h, 337, 8, u64::from(devs.1));
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// The tree as a PAX tar stream: the root ("./"), then the entries in order.
pub fn tar(s: &Spec) -> Vec<u8> {
    let mut out = Vec::new();
    let root = Entry {
        node: 0,
        path: b"./".to_vec(),
        hardlink: false,
    };
    for e in std::iter::once(&root).chain(&s.entries) {
        let n = &s.nodes[e.node];
        let mut pax = Vec::new();
        let mut path = e.path.clone();
        if matches!(n.kind, NodeKind::Dir) && !path.ends_with(b"/") {
            path.push(b'/');
        }
        pax_record(&mut pax, b"path", &path);
        let (typ, size, link, devs): (u8, u64, &[u8], _) = if e.hardlink {
            (b'1', 0, &n.names[0][..], (0, 0))
        } else {
            match &n.kind {
                NodeKind::Dir => (b'5', 0, &[][..], (0, 0)),
                NodeKind::File(c) => (b'0', c.len() as u64, &[][..], (0, 0)),
                NodeKind::Symlink(t) => (b'2', 0, &t[..], (0, 0)),
                NodeKind::Device(chr, ma, mi) => {
                    (if *chr { b'3' } else { b'4' }, 0, &[][..], (*ma, *mi))
                }
                NodeKind::Fifo => (b'6', 0, &[][..], (0, 0)),
            }
        };
        if !link.is_empty() {
            pax_record(&mut pax, b"linkpath", link);
        }
        pax_record(&mut pax, b"uid", n.uid.to_string().as_bytes());
        pax_record(&mut pax, b"gid", n.gid.to_string().as_bytes());
        let t = if n.nsec == 0 {
            n.mtime.to_string()
        } else {
            format!("{}.{:09}", n.mtime, n.nsec)
        };
        pax_record(&mut pax, b"mtime", t.as_bytes());
        if !e.hardlink {
            for (k, v) in &n.xattrs {
                pax_record(&mut pax, &[&b"SCHILY.xattr."[..], k].concat(), v);
            }
        }
        out.extend_from_slice(&header(b'x', pax.len() as u64, 0o644, (0, 0)));
        out.extend_from_slice(&pax);
        pad(&mut out);
        out.extend_from_slice(&header(typ, size, n.perm, devs));
        if let (NodeKind::File(c), false) = (&n.kind, e.hardlink) {
            out.extend_from_slice(c);
            pad(&mut out);
        }
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn ftype_code(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFREG => 1,
        S_IFDIR => 2,
        S_IFCHR => 3,
        S_IFBLK => 4,
        S_IFIFO => 5,
        S_IFSOCK => 6,
        _ => 7,
    }
}

/// Read the image back and compare it with the description; panics on a difference.
pub fn check(s: &Spec, image: Vec<u8>) {
    let img = Image::new(image).unwrap_or_else(|e| panic!("image does not open: {e}"));
    let mut nid_of: HashMap<usize, u64> = HashMap::new();
    let mut node_of: HashMap<u64, usize> = HashMap::new();
    let mut ctx = ReadCtx::new();
    let mut stack = vec![(0usize, img.root_nid(), Vec::<u8>::new())];
    while let Some((id, nid, path)) = stack.pop() {
        let show = String::from_utf8_lossy(&path).into_owned();
        let want = &s.nodes[id];
        // Hardlink identity: one node, one nid, both ways.
        assert_eq!(
            *nid_of.entry(id).or_insert(nid),
            nid,
            "{show}: hardlinks split"
        );
        assert_eq!(
            *node_of.entry(nid).or_insert(id),
            id,
            "{show}: inodes merged"
        );
        let ino = img
            .inode(nid)
            .unwrap_or_else(|e| panic!("{show}: inode {nid}: {e}"));
        assert_eq!(ino.mode, want.ftype() | want.perm, "{show}: mode");
        assert_eq!((ino.uid, ino.gid), (want.uid, want.gid), "{show}: owner");
        assert_eq!(
            (ino.mtime, ino.mtime_nsec),
            (want.mtime, want.nsec),
            "{show}: mtime"
        );
        let xs = img
            .xattrs(&ino)
            .unwrap_or_else(|e| panic!("{show}: xattrs: {e}"));
        let got: BTreeMap<Vec<u8>, Vec<u8>> = xs
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect();
        assert_eq!(got.len(), xs.len(), "{show}: an xattr twice");
        assert!(
            got == want.xattrs,
            "{show}: xattrs {got:?} != {:?}",
            want.xattrs
        );
        for (k, v) in &want.xattrs {
            let g = img
                .get_xattr(&ino, k)
                .unwrap_or_else(|e| panic!("{show}: get_xattr: {e}"));
            assert_eq!(g.as_ref(), Some(v), "{show}: get_xattr");
        }
        assert_eq!(
            img.get_xattr(&ino, b"user.absent")
                .unwrap_or_else(|e| panic!("{show}: get_xattr: {e}")),
            None,
            "{show}: absent xattr found"
        );
        if !path.is_empty() {
            let mut p = b"/".to_vec();
            p.extend_from_slice(&path);
            let l = img
                .lookup(&p)
                .unwrap_or_else(|e| panic!("{show}: lookup: {e}"));
            assert_eq!(l.nid, nid, "{show}: lookup finds another inode");
        }
        match &want.kind {
            NodeKind::Dir => {
                let subdirs = want
                    .children
                    .values()
                    .filter(|&&c| s.nodes[c].kind == NodeKind::Dir)
                    .count() as u32;
                assert_eq!(ino.nlink, 2 + subdirs, "{show}: directory nlink");
                let ents = img
                    .read_dir(&ino)
                    .unwrap_or_else(|e| panic!("{show}: read_dir: {e}"));
                let mut names = Vec::new();
                for e in ents {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let Some(&c) = want.children.get(&e.name) else {
                        panic!(
                            "{show}: unexpected entry {:?}",
                            String::from_utf8_lossy(&e.name)
                        );
                    };
                    assert_eq!(
                        e.file_type,
                        ftype_code(s.nodes[c].ftype()),
                        "{show}: dirent file type"
                    );
                    let mut p = path.clone();
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&e.name);
                    stack.push((c, e.nid, p));
                    names.push(e.name);
                }
                let want_names: Vec<&Vec<u8>> = want.children.keys().collect();
                names.sort();
                assert!(
                    names.iter().eq(want_names.iter().copied()),
                    "{show}: entries differ"
                );
            }
            other => {
                assert_eq!(ino.nlink, want.names.len() as u32, "{show}: nlink");
                match other {
                    NodeKind::File(c) => {
                        assert_eq!(ino.size, c.len() as u64, "{show}: size");
                        let got = img
                            .read_to_vec(&ino)
                            .unwrap_or_else(|e| panic!("{show}: read: {e}"));
                        assert!(got == *c, "{show}: contents differ");
                        // A content fingerprint (--xattr-inode-digest) on every
                        // non-empty file, hidden from the xattr listing above.
                        let fp = img
                            .fingerprint(&ino)
                            .unwrap_or_else(|e| panic!("{show}: fingerprint: {e}"));
                        let want_fp = (s.opts.inode_digest.is_some() && !c.is_empty()).then(|| {
                            let d: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(c).into();
                            [&b"sha256:"[..], &d].concat()
                        });
                        assert_eq!(fp, want_fp, "{show}: fingerprint");
                        // Again in odd-sized pieces through one context.
                        let mut buf = vec![0u8; 4093];
                        let mut off = 0usize;
                        while off < c.len() {
                            let n = img
                                .read_at_with(&mut ctx, &ino, off as u64, &mut buf)
                                .unwrap_or_else(|e| panic!("{show}: read at {off}: {e}"));
                            assert!(n > 0, "{show}: short read at {off}");
                            assert!(buf[..n] == c[off..off + n], "{show}: bytes at {off}");
                            off += n;
                        }
                    }
                    NodeKind::Symlink(t) => {
                        let got = img
                            .read_link(&ino)
                            .unwrap_or_else(|e| panic!("{show}: readlink: {e}"));
                        assert!(got == *t, "{show}: symlink target");
                    }
                    NodeKind::Device(_, ma, mi) => {
                        assert_eq!(ino.rdev_major_minor(), (*ma, *mi), "{show}: rdev")
                    }
                    _ => {}
                }
            }
        }
    }
    let reachable = s
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.names.is_empty())
        .count();
    assert_eq!(nid_of.len(), reachable, "nodes missing from the image");
}

/// The description, one line per tar entry (`FEROFS_ROUNDTRIP_SHOW=1` prints it).
pub fn show(s: &Spec) -> String {
    let mut out = format!("{:?}\n", s.opts);
    let root = Entry {
        node: 0,
        path: b"/".to_vec(),
        hardlink: false,
    };
    for e in std::iter::once(&root).chain(&s.entries) {
        let n = &s.nodes[e.node];
        let kind = match &n.kind {
            _ if e.hardlink => format!("hardlink to {}", String::from_utf8_lossy(&n.names[0])),
            NodeKind::File(c) => format!("file of {} bytes", c.len()),
            NodeKind::Symlink(t) => format!("symlink of {} bytes", t.len()),
            k => format!("{k:?}"),
        };
        out += &format!(
            "{} (node {}): {kind}, mode {:o}, {}:{}, mtime {}.{:09}, xattrs {:?}\n",
            String::from_utf8_lossy(&e.path),
            e.node,
            n.perm,
            n.uid,
            n.gid,
            n.mtime,
            n.nsec,
            n.xattrs
                .iter()
                .map(|(k, v)| (String::from_utf8_lossy(k), v.len()))
                .collect::<Vec<_>>()
        );
    }
    out
}

/// Describe, build, read back, compare.
pub fn run(data: &[u8]) {
    let spec = decode(data);
    if std::env::var_os("FEROFS_ROUNDTRIP_SHOW").is_some() {
        eprint!("{}", show(&spec));
    }
    let t = tar(&spec);
    let dir = crate::scratch_dir("ferofs-fuzz-");
    let tar_path = dir.path().join("in.tar");
    let out = dir.path().join("out.erofs");
    std::fs::write(&tar_path, &t).expect("write tar");
    if let Err(e) = ferofs_builder::build_from_tars(&[TarInput::File(tar_path)], &out, &spec.opts) {
        panic!("build failed: {e}\noptions: {:?}", spec.opts);
    }
    let image = std::fs::read(&out).expect("read image");
    // FEROFS_ROUNDTRIP_KEEP=DIR: keep the tar and the image there (to rebuild or mount).
    if let Some(k) = std::env::var_os("FEROFS_ROUNDTRIP_KEEP") {
        std::fs::copy(&out, std::path::Path::new(&k).join("out.erofs")).expect("keep");
        std::fs::write(std::path::Path::new(&k).join("in.tar"), &t).expect("keep");
    }
    check(&spec, image);
}

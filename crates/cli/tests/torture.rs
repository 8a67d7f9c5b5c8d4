//! Corruption torture (issue 12): thousands of deterministic mutations of our own images
//! (every layout the builder writes) and of the mkfs.erofs 1.9.3 golden images, each
//! opened and walked completely through the reader's API. Every case must give data or
//! a structured error, with no panic (caught per case and reported with the case that
//! caused it), no hang (a deadline per case) and bounded memory (peak RSS per case).
//!
//! Mutations: bit flips, fields (1, 2, 4 or 8 bytes) set to 0, all ones, off by one or
//! with the top bit flipped, random bytes, truncation, and whole blocks swapped or
//! duplicated; one to four of them per case, mostly at offsets the reader actually reads
//! in a clean walk (recorded through a logging source), so they hit structures rather
//! than file data. Half of the cases with a superblock checksum get it recomputed, so
//! mutations in block 0 reach past the checksum.
//!
//! Reproduce one case: `FEROFS_TORTURE_CASE=NAME:INDEX` (NAME as printed in a failure).
//! `FEROFS_TORTURE_SCALE=N` multiplies the case counts (e.g. for a longer local run).

mod common;

use ferofs_format::sb::{checksum_len, compute_checksum, COMPAT_SB_CHKSUM, SB_OFFSET};
use ferofs_reader::{Error, Image, Inode, ReadCtx, Source};
use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A case that runs longer than this has hung (generous: CI runs unoptimised code on
/// two busy cores; a clean walk of the largest image takes well under a second).
const DEADLINE: Duration = Duration::from_secs(20);
/// Peak RSS one case may add (the reader's shared cache alone may hold 64 MiB).
const MEM_BOUND: u64 = 384 << 20;
/// Image bytes one case may read through its source (then reads fail with an I/O error).
const READ_BUDGET: u64 = 512 << 20;

// ---------------------------------------------------------------------------------------
// Deterministic randomness.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        r.next();
        r
    }
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    })
}

// ---------------------------------------------------------------------------------------
// Sources: a logging one (which bytes does a clean walk read?) and the mutated one.

struct Logged {
    data: Arc<Vec<u8>>,
    log: Mutex<Vec<(u64, u64)>>,
}

impl Source for Logged {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Ok(mut l) = self.log.lock() {
            l.push((offset, buf.len() as u64));
        }
        self.data.as_slice().read_exact_at(buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.data.len() as u64)
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: u64,
        bit: u8,
    },
    Set {
        at: u64,
        bytes: Vec<u8>,
        #[allow(dead_code)] // shown through Debug
        what: &'static str,
    },
    Truncate {
        len: u64,
    },
    Swap {
        a: u64,
        b: u64,
    },
    Dup {
        from: u64,
        to: u64,
    },
    FixChecksum,
}

/// The base image with patches, a block remap and a length, read without copying.
struct Mutant {
    base: Arc<Vec<u8>>,
    len: u64,
    bs: u64,
    /// (destination block, source block).
    remap: Vec<(u64, u64)>,
    patches: Vec<(u64, Vec<u8>)>,
    budget: AtomicU64,
}

impl Mutant {
    fn new(base: Arc<Vec<u8>>, bs: u64) -> Self {
        Mutant {
            len: base.len() as u64,
            base,
            bs,
            remap: Vec::new(),
            patches: Vec::new(),
            budget: AtomicU64::new(READ_BUDGET),
        }
    }

    fn fill(&self, buf: &mut [u8], offset: u64) {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let blk = pos / self.bs;
            let within = pos % self.bs;
            let n = ((self.bs - within) as usize).min(buf.len() - done);
            let src_blk = self
                .remap
                .iter()
                .rev()
                .find(|(d, _)| *d == blk)
                .map_or(blk, |(_, s)| *s);
            let sp = (src_blk * self.bs + within) as usize;
            let dst = &mut buf[done..done + n];
            match self.base.get(sp..sp + n) {
                Some(s) => dst.copy_from_slice(s),
                None => dst.fill(0),
            }
            done += n;
        }
        let end = offset + buf.len() as u64;
        for (at, bytes) in &self.patches {
            let pend = at + bytes.len() as u64;
            if pend <= offset || *at >= end {
                continue;
            }
            let lo = (*at).max(offset);
            let hi = pend.min(end);
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&bytes[(lo - at) as usize..(hi - at) as usize]);
        }
    }

    fn apply(&mut self, m: &Mutation) {
        match m {
            Mutation::Flip { at, bit } => {
                let mut b = [0u8];
                self.fill(&mut b, *at);
                self.patches.push((*at, vec![b[0] ^ (1 << bit)]));
            }
            Mutation::Set { at, bytes, .. } => self.patches.push((*at, bytes.clone())),
            Mutation::Truncate { len } => self.len = self.len.min(*len),
            Mutation::Swap { a, b } => {
                self.remap.push((*a, *b));
                self.remap.push((*b, *a));
            }
            Mutation::Dup { from, to } => self.remap.push((*to, *from)),
            Mutation::FixChecksum => {
                if self.len < SB_OFFSET + 16 {
                    return;
                }
                let mut b = [0u8];
                self.fill(&mut b, SB_OFFSET + 0x0C);
                let bits = b[0];
                if !(9..=12).contains(&bits) {
                    return;
                }
                let n = checksum_len(1 << bits) as u64;
                if self.len < SB_OFFSET + n {
                    return;
                }
                let mut region = vec![0u8; n as usize];
                self.fill(&mut region, SB_OFFSET);
                let c = compute_checksum(&region);
                self.patches.push((SB_OFFSET + 4, c.to_le_bytes().to_vec()));
            }
        }
    }
}

impl Source for Mutant {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        if end > self.len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = buf.len() as u64;
        let left = self.budget.load(Ordering::Relaxed);
        if left < n {
            return Err(io::Error::other("torture: read budget exhausted"));
        }
        self.budget.store(left - n, Ordering::Relaxed);
        self.fill(buf, offset);
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len)
    }
}

// ---------------------------------------------------------------------------------------
// The complete walk.

/// How much file data a walk reads.
#[derive(Clone, Copy)]
struct Limits {
    /// Bytes read sequentially from the start of each file.
    per_file: u64,
    /// File bytes read in the whole case.
    per_case: u64,
    /// Inodes visited.
    entries: usize,
}

#[derive(Default, Debug)]
struct Tally {
    calls: u64,
    errors: u64,
    /// Errors of probes (which also fail on a clean image).
    probe_errors: u64,
    entries: u64,
    bytes: u64,
    /// Distinct error kinds seen (Debug of the kind).
    kinds: HashSet<String>,
}

struct Walker<'a, S: Source> {
    img: &'a Image<S>,
    rng: Rng,
    lim: Limits,
    t: Tally,
    seen_dirs: HashSet<u64>,
    ctx: ReadCtx,
    buf: Vec<u8>,
}

/// Every error must be one of the structured kinds and must display.
fn check_error(e: &Error) -> String {
    let shown = e.to_string();
    assert!(!shown.is_empty(), "empty error message");
    match e {
        Error::Corrupt(c) => {
            assert!(!c.detail.is_empty(), "corruption without detail: {c:?}");
            format!("{:?}", c.kind)
        }
        Error::Io { error, .. } => {
            // The only I/O error a Mutant gives is its budget.
            assert!(
                error.to_string().contains("read budget"),
                "unexpected I/O error {e}"
            );
            "Io".into()
        }
        Error::Unsupported { .. } => "Unsupported".into(),
        Error::NotFound { .. } => "NotFound".into(),
        Error::NotADirectory { .. } => "NotADirectory".into(),
        Error::WrongType { .. } => "WrongType".into(),
    }
}

impl<'a, S: Source> Walker<'a, S> {
    fn new(img: &'a Image<S>, seed: u64, lim: Limits) -> Self {
        Walker {
            img,
            rng: Rng::new(seed),
            lim,
            t: Tally::default(),
            seen_dirs: HashSet::new(),
            ctx: ReadCtx::new(),
            buf: vec![0u8; 128 << 10],
        }
    }

    fn note<T>(&mut self, r: Result<T, Error>) -> Option<T> {
        self.t.calls += 1;
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.t.errors += 1;
                let k = check_error(&e);
                self.t.kinds.insert(k);
                None
            }
        }
    }

    /// For calls that may fail on a clean image too (probes).
    fn probe<T>(&mut self, r: Result<T, Error>) -> Option<T> {
        let e = self.t.errors;
        let v = self.note(r);
        self.t.probe_errors += self.t.errors - e;
        v
    }

    fn data_left(&self) -> u64 {
        self.lim.per_case.saturating_sub(self.t.bytes)
    }

    fn run(&mut self) {
        let img = self.img;
        let info = img.info();
        let _ = format!("{info:?}");
        let Some(root) = self.note(img.inode(img.root_nid())) else {
            return;
        };
        self.visit(b"", &root, 0);
        // The library's own walk, stopped by the callback after the entry limit.
        let mut n = 0usize;
        let cap = self.lim.entries;
        let r = img.walk(|_, _| {
            n += 1;
            if n > cap {
                return Err(Error::NotFound {
                    path: "torture: walk entry limit".into(),
                });
            }
            Ok(())
        });
        self.note(r);
        // Probes: random nids, paths that are not there.
        let slots = img
            .info()
            .blocks
            .saturating_mul(u64::from(img.block_size()))
            / 32;
        for _ in 0..4 {
            let nid = self.rng.below(slots.max(1) + 64);
            if let Some(ino) = self.probe(img.inode(nid)) {
                let r = img.xattrs(&ino);
                self.probe(r);
            }
        }
        let r = img.lookup(b"/no/such/path");
        self.probe(r);
        let r = img.lookup(b"../../.././x/../.");
        self.probe(r);
    }

    fn visit(&mut self, path: &[u8], ino: &Inode, depth: usize) {
        let img = self.img;
        if self.t.entries as usize >= self.lim.entries {
            return;
        }
        self.t.entries += 1;
        // stat
        let _ = (ino.file_type(), ino.rdev_major_minor(), ino.startblk());
        let r = img.extents(ino);
        self.note(r);
        // xattrs
        if let Some(xs) = self.note(img.xattrs(ino)) {
            if let Some(x) = xs.first() {
                let name = x.name.clone();
                let r = img.get_xattr(ino, &name);
                self.note(r);
            }
        }
        let r = img.get_xattr(ino, b"user.torture-missing");
        self.note(r);
        let r = img.get_xattr(ino, b"trusted.overlay.opaque");
        self.note(r);
        if ino.is_dir() {
            self.dir(path, ino, depth);
        } else if ino.is_regular() {
            self.file(ino);
        } else if ino.is_symlink() {
            let r = img.read_link(ino);
            self.note(r);
        } else {
            let r = img.read_link(ino);
            self.probe(r);
        }
    }

    fn dir(&mut self, path: &[u8], ino: &Inode, depth: usize) {
        let img = self.img;
        if depth > 64 || !self.seen_dirs.insert(ino.nid) {
            return;
        }
        let Some(ents) = self.note(img.read_dir(ino)) else {
            // Still try a lookup: binary search takes other paths than readdir.
            let r = img.lookup_child(ino, b"a");
            self.note(r);
            return;
        };
        let r = img.lookup_child(ino, b"\xffno-such-name");
        self.note(r);
        let r = img.lookup_child(ino, b"");
        self.note(r);
        for e in ents {
            if self.t.entries as usize >= self.lim.entries {
                return;
            }
            let r = img.lookup_child(ino, &e.name);
            self.note(r);
            if e.name == b"." || e.name == b".." {
                let r = img.inode(e.nid);
                self.note(r);
                continue;
            }
            let mut p = path.to_vec();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            if self.rng.chance(20) {
                let r = img.lookup(&p);
                self.note(r);
            }
            if let Some(child) = self.note(img.inode(e.nid)) {
                self.visit(&p, &child, depth + 1);
            }
        }
    }

    fn file(&mut self, ino: &Inode) {
        let img = self.img;
        // Sequential, through a context (the whole-file path).
        let mut off = 0u64;
        let stop = ino.size.min(self.lim.per_file).min(self.data_left());
        while off < stop {
            let want = ((stop - off) as usize).min(self.buf.len());
            let r = img.read_at_with(&mut self.ctx, ino, off, &mut self.buf[..want]);
            match self.note(r) {
                Some(n) if n > 0 => {
                    off += n as u64;
                    self.t.bytes += n as u64;
                }
                _ => break,
            }
        }
        // Random offsets, through the shared cache.
        for _ in 0..3 {
            if self.data_left() == 0 {
                break;
            }
            let at = self.rng.below(ino.size.saturating_add(16));
            let len = (self.rng.below(70_000) as usize + 1).min(self.buf.len());
            let r = img.read_at(ino, at, &mut self.buf[..len]);
            if let Some(n) = self.note(r) {
                self.t.bytes += n as u64;
            }
            let r = img.hole_end(&mut self.ctx, ino, at);
            self.note(r);
        }
        if ino.size <= 64 << 10 && self.data_left() > 0 {
            let r = img.read_to_vec_limited(ino, 64 << 10);
            self.note(r);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Base images.

struct Base {
    name: String,
    data: Arc<Vec<u8>>,
    bs: u64,
    /// Reads of a clean walk: (offset, length).
    hot: Vec<(u64, u64)>,
    cases: u64,
    lim: Limits,
}

fn write(p: &Path, data: &[u8]) {
    std::fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn text(rng: &mut Rng, n: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "erofs ", "block ", "inode ", "the ", "read ", "only ", "cluster ", "\n", "data ", "0x1f ",
        "kernel ", "page ",
    ];
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        v.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
    }
    v.truncate(n);
    v
}

fn random(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

/// A small tree with every kind of entry our layouts treat differently.
fn make_source(dir: &Path) {
    let mut rng = Rng::new(7);
    let mk = |p: &Path| std::fs::create_dir_all(p).expect("mkdir");
    mk(&dir.join("a/b/c/d/e/f"));
    write(&dir.join("a/b/c/d/e/f/deep.txt"), b"deep\n");
    write(&dir.join("empty"), b"");
    write(&dir.join("one"), b"1");
    write(&dir.join("hundred.txt"), &text(&mut rng, 100));
    write(&dir.join("t3000.txt"), &text(&mut rng, 3000));
    write(&dir.join("r4096.bin"), &random(&mut rng, 4096));
    write(&dir.join("t9000.txt"), &text(&mut rng, 9000));
    let mut mixed = text(&mut rng, 40_000);
    mixed.extend(random(&mut rng, 30_000));
    mixed.extend(text(&mut rng, 20_000));
    write(&dir.join("mixed.bin"), &mixed);
    write(&dir.join("log.txt"), &text(&mut rng, 300_000));
    write(&dir.join("random.bin"), &random(&mut rng, 150_000));
    let dup = text(&mut rng, 100_000);
    write(&dir.join("dup1"), &dup);
    write(&dir.join("dup2"), &dup);
    write(&dir.join("a/dup3"), &dup);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(dir.join("sparse")).expect("sparse");
        f.seek(SeekFrom::Start(1 << 20)).expect("seek");
        f.write_all(&text(&mut rng, 10_000)).expect("write");
        f.set_len(3 << 20).expect("set_len");
    }
    mk(&dir.join("bigdir"));
    for i in 0..180u32 {
        let len = 1 + (i as usize * 7) % 70;
        let mut name: Vec<u8> = format!("{i:03}").into_bytes();
        while name.len() < len {
            name.push(b'a' + (name.len() % 26) as u8);
        }
        let p = dir
            .join("bigdir")
            .join(String::from_utf8(name).expect("ascii"));
        match i % 5 {
            0 => mk(&p),
            1 => std::os::unix::fs::symlink("../one", &p).expect("symlink"),
            _ => write(&p, &text(&mut rng, (i as usize * 37) % 900)),
        }
    }
    std::os::unix::fs::symlink("a/b", dir.join("short-link")).expect("symlink");
    let long: String = "x/".repeat(1000);
    std::os::unix::fs::symlink(&long, dir.join("long-link")).expect("symlink");
    std::os::unix::fs::symlink("nowhere", dir.join("dangling")).expect("symlink");
    std::fs::hard_link(dir.join("t3000.txt"), dir.join("a/hardlink")).expect("hardlink");
    let _ = std::process::Command::new("mkfifo")
        .arg(dir.join("fifo"))
        .status();
    // Extended attributes where the filesystem takes them (ext4 does).
    for (i, f) in ["one", "hundred.txt", "a", "log.txt", "bigdir/005aaaa"]
        .iter()
        .enumerate()
    {
        let p = dir.join(f);
        let _ = xattr::set(&p, "user.shared", b"one value on many inodes");
        let _ = xattr::set(&p, format!("user.k{i}"), &vec![b'v'; 10 + i * 300]);
    }
}

const LAYOUTS: &[(&str, &[&str])] = &[
    ("none", &["-z", "none"]),
    ("none-b512", &["-z", "none", "-b", "512"]),
    (
        "none-b1024-noinline",
        &["-z", "none", "-b", "1024", "-E", "noinline_data"],
    ),
    ("lz4", &["-z", "lz4"]),
    ("lz4hc-ztail", &["-z", "lz4hc", "-E", "ztailpacking"]),
    ("lzma-C64k", &["-z", "lzma", "-C", "65536"]),
    ("deflate-b1024", &["-z", "deflate", "-b", "1024"]),
    (
        "zstd-C128k-ztail",
        &["-z", "zstd", "-C", "131072", "-E", "ztailpacking"],
    ),
    ("lz4hc-C1M", &["-z", "lz4hc", "-C", "1048576"]),
    (
        "lz4hc-fragments-dedupe",
        &["-z", "lz4hc", "-E", "fragments", "-E", "dedupe"],
    ),
    ("lzma-all-fragments", &["-z", "lzma", "-E", "all-fragments"]),
    ("lz4hc-metabox", &["-z", "lz4hc", "-m"]),
    (
        "zstd-smallest-metabox-b512",
        &["-z", "zstd", "-E", "smallest", "-m", "-b", "512"],
    ),
    (
        "lz4hc-lzma-b512-C16k",
        &["-z", "lz4hc:lzma", "-b", "512", "-C", "16384"],
    ),
];

/// Golden images (mkfs.erofs 1.9.3), one per feature family.
const GOLDEN: &[&str] = &[
    "plain-b512",
    "plain-chunk64k-indexes",
    "plain-dot-omitted",
    "plain-metabox",
    "plain-xattr-prefix",
    "lz4hc-C64k-tpfd",
    "lz4hc-48bit-C64k",
    "lz4hc-all-fragments",
    "lz4hc-metabox",
    "lz4hc-xattr-prefix-packed",
    "lzma-C64k-tpfd",
    "deflate",
    "zstd-C64k-tpfd",
    "lz4hc-lzma",
];

fn block_size(data: &[u8]) -> u64 {
    1u64 << data.get(1024 + 0x0C).copied().unwrap_or(12).clamp(9, 12)
}

/// Walk the clean image through a logging source: the reads become the hot ranges, and
/// the walk must see no error at all.
fn prepare(name: String, data: Vec<u8>, cases: u64, lim: Limits) -> Base {
    let data = Arc::new(data);
    let src = Arc::new(Logged {
        data: data.clone(),
        log: Mutex::new(Vec::new()),
    });
    let img = Image::new(src.clone()).unwrap_or_else(|e| panic!("{name}: clean image: {e}"));
    let t0 = Instant::now();
    let tally = {
        let mut w = Walker::new(&img, 1, lim);
        w.run();
        w.t
    };
    // Probes of random nids may fail on a clean image; nothing else may.
    assert!(
        tally.errors == tally.probe_errors,
        "{name}: clean walk gave {} errors ({:?})",
        tally.errors,
        tally.kinds
    );
    assert!(tally.entries > 30, "{name}: clean walk saw too little");
    eprintln!(
        "torture: {name}: {} bytes, {} entries, {} file bytes, clean walk {:?}",
        data.len(),
        tally.entries,
        tally.bytes,
        t0.elapsed()
    );
    drop(img);
    let mut hot = src.log.lock().map(|l| l.clone()).unwrap_or_default();
    hot.sort_unstable();
    hot.dedup();
    Base {
        bs: block_size(&data),
        name,
        data,
        hot,
        cases,
        lim,
    }
}

fn own_images(scale: u64) -> Vec<Base> {
    let dir = ferofs_testkit::scratch("torture");
    let src = dir.path().join("src");
    make_source(&src);
    let lim = Limits {
        per_file: 4 << 20,
        per_case: 64 << 20,
        entries: 2000,
    };
    LAYOUTS
        .iter()
        .map(|(name, args)| {
            let img = dir.path().join(format!("{name}.erofs"));
            let mut a: Vec<&str> = vec!["-T", "1700000000"];
            a.extend_from_slice(args);
            common::build(&src, &img, &a);
            let data = std::fs::read(&img).expect("read image");
            prepare(format!("own/{name}"), data, 640 * scale, lim)
        })
        .collect()
}

fn golden_image(name: &str, scale: u64) -> Base {
    let p = ferofs_testkit::golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
    let data = std::fs::read(&p).expect("read golden image");
    let lim = Limits {
        per_file: 16 << 10,
        per_case: 8 << 20,
        entries: 4000,
    };
    prepare(format!("golden/{name}"), data, 80 * scale, lim)
}

// ---------------------------------------------------------------------------------------
// Cases.

fn pick_offset(rng: &mut Rng, b: &Base) -> u64 {
    let len = b.data.len() as u64;
    let r = rng.below(100);
    if r < 8 {
        // The superblock.
        return SB_OFFSET + rng.below(144);
    }
    if r < 88 && !b.hot.is_empty() {
        let (o, l) = b.hot[rng.below(b.hot.len() as u64) as usize];
        // Large reads (data, read-ahead windows): anywhere inside; the first bytes more often.
        let span = if rng.chance(50) { l.min(256) } else { l };
        return (o + rng.below(span.max(1))).min(len.saturating_sub(1));
    }
    rng.below(len)
}

fn le_bytes(v: u64, w: usize) -> Vec<u8> {
    v.to_le_bytes()[..w].to_vec()
}

fn one_mutation(rng: &mut Rng, b: &Base) -> Mutation {
    let len = b.data.len() as u64;
    let bs = b.bs;
    let blocks = len / bs;
    match rng.below(100) {
        0..=29 => Mutation::Flip {
            at: pick_offset(rng, b),
            bit: rng.below(8) as u8,
        },
        30..=64 => {
            let w = [1usize, 2, 4, 8][rng.below(4) as usize];
            let at = pick_offset(rng, b) & !(w as u64 - 1);
            let at = at.min(len.saturating_sub(w as u64));
            let mut cur = [0u8; 8];
            let s = at as usize;
            cur[..w].copy_from_slice(&b.data[s..s + w]);
            let v = u64::from_le_bytes(cur);
            let max = if w == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * w)) - 1
            };
            let (nv, what) = match rng.below(6) {
                0 => (0, "zero"),
                1 => (max, "max"),
                2 => (v.wrapping_add(1) & max, "plus one"),
                3 => (v.wrapping_sub(1) & max, "minus one"),
                4 => (v ^ (1 << (8 * w - 1)), "top bit"),
                _ => (rng.next() & max, "random"),
            };
            Mutation::Set {
                at,
                bytes: le_bytes(nv, w),
                what,
            }
        }
        65..=69 => {
            let at = pick_offset(rng, b);
            let n = 1 + rng.below(64) as usize;
            let at = at.min(len.saturating_sub(n as u64));
            Mutation::Set {
                at,
                bytes: random(rng, n),
                what: "random bytes",
            }
        }
        70..=79 => {
            let cut = match rng.below(3) {
                0 => pick_offset(rng, b),
                1 => pick_offset(rng, b) / bs * bs,
                _ => len.saturating_sub(1 + rng.below(bs * 4)),
            };
            Mutation::Truncate { len: cut }
        }
        80..=89 => Mutation::Swap {
            a: pick_offset(rng, b) / bs,
            b: if rng.chance(50) {
                pick_offset(rng, b) / bs
            } else {
                rng.below(blocks)
            },
        },
        _ => Mutation::Dup {
            from: if rng.chance(50) {
                pick_offset(rng, b) / bs
            } else {
                rng.below(blocks)
            },
            to: pick_offset(rng, b) / bs,
        },
    }
}

fn case_mutations(b: &Base, idx: u64) -> Vec<Mutation> {
    let mut rng = Rng::new(name_seed(&b.name) ^ idx.wrapping_mul(0x1000_0000_01B3));
    let n = match rng.below(10) {
        0..=5 => 1,
        6..=8 => 2,
        _ => 3 + rng.below(2),
    };
    let mut v: Vec<Mutation> = (0..n).map(|_| one_mutation(&mut rng, b)).collect();
    let has_csum = b
        .data
        .get(1024 + 0x08..1024 + 0x0C)
        .map(|f| u32::from_le_bytes([f[0], f[1], f[2], f[3]]) & COMPAT_SB_CHKSUM != 0)
        .unwrap_or(false);
    if has_csum && rng.chance(50) {
        v.push(Mutation::FixChecksum);
    }
    v
}

#[derive(Default)]
struct Outcome {
    opened: bool,
    tally: Tally,
    open_error: Option<String>,
}

fn run_case(b: &Base, idx: u64) -> Outcome {
    let mut m = Mutant::new(b.data.clone(), b.bs);
    for mu in case_mutations(b, idx) {
        m.apply(&mu);
    }
    let mut out = Outcome::default();
    match Image::new(m) {
        Ok(img) => {
            out.opened = true;
            let mut w = Walker::new(&img, idx, b.lim);
            w.run();
            out.tally = w.t;
        }
        Err(e) => out.open_error = Some(check_error(&e)),
    }
    out
}

// ---------------------------------------------------------------------------------------
// Memory: peak RSS per case (reset through /proc/self/clear_refs).

fn proc_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

// ---------------------------------------------------------------------------------------

type Job = (Arc<Base>, u64);

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

#[test]
fn corruption_torture() {
    let t0 = Instant::now();
    let scale: u64 = std::env::var("FEROFS_TORTURE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let only = std::env::var("FEROFS_TORTURE_CASE").ok();
    let only = only.as_ref().and_then(|s| {
        let (n, i) = s.rsplit_once(':')?;
        Some((n.to_string(), i.parse::<u64>().ok()?))
    });
    // Panic locations, so that a caught panic names where it happened.
    let last_panic: Arc<Mutex<String>> = Arc::new(Mutex::new(String::new()));
    {
        let lp = last_panic.clone();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some("torture-worker") {
                return default(info);
            }
            if let Ok(mut g) = lp.lock() {
                *g = format!("{info}");
            }
        }));
    }

    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (res_tx, res_rx) = mpsc::channel::<(u64, std::thread::Result<Outcome>)>();
    std::thread::Builder::new()
        .name("torture-worker".into())
        .spawn(move || {
            for (b, idx) in job_rx {
                let r =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&b, idx)));
                if res_tx.send((idx, r)).is_err() {
                    break;
                }
            }
        })
        .expect("spawn worker");

    let mem_check = reset_peak() && proc_kb("VmHWM:").is_some();
    if !mem_check {
        eprintln!("torture: NOTE: /proc/self/clear_refs not writable: no per-case memory check");
    }
    let mut failures: Vec<String> = Vec::new();
    let (mut total, mut opened, mut calls, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut kinds: HashSet<String> = HashSet::new();
    let mut slowest = (Duration::ZERO, String::new());
    let mut peak_growth = 0u64;

    let mut run_base = |b: Base| {
        let b = Arc::new(b);
        let t = Instant::now();
        let range: Vec<u64> = match &only {
            Some((n, i)) if *n == b.name => vec![*i],
            Some(_) => vec![],
            None => (0..b.cases).collect(),
        };
        let mut base_errors = 0u64;
        for idx in range {
            let what = format!("{}:{idx}", b.name);
            let before = if mem_check {
                reset_peak();
                proc_kb("VmRSS:").unwrap_or(0)
            } else {
                0
            };
            let start = Instant::now();
            job_tx.send((b.clone(), idx)).expect("worker gone");
            let (got, r) = match res_rx.recv_timeout(DEADLINE) {
                Ok(x) => x,
                Err(_) => panic!(
                    "torture case {what} hung (> {DEADLINE:?}); mutations: {:?}",
                    case_mutations(&b, idx)
                ),
            };
            assert_eq!(got, idx);
            let took = start.elapsed();
            if took > slowest.0 {
                slowest = (took, what.clone());
            }
            total += 1;
            match r {
                Ok(o) => {
                    opened += u64::from(o.opened);
                    calls += o.tally.calls;
                    errors += o.tally.errors;
                    base_errors += o.tally.errors;
                    kinds.extend(o.tally.kinds);
                    if let Some(k) = o.open_error {
                        kinds.insert(format!("open:{k}"));
                    }
                }
                Err(p) => {
                    let loc = last_panic.lock().map(|g| g.clone()).unwrap_or_default();
                    failures.push(format!(
                        "{what}: PANIC {} [{loc}]; mutations: {:?}",
                        panic_text(&*p),
                        case_mutations(&b, idx)
                    ));
                }
            }
            if mem_check {
                let peak = proc_kb("VmHWM:").unwrap_or(0);
                let grew = peak.saturating_sub(before) << 10;
                peak_growth = peak_growth.max(grew);
                if grew > MEM_BOUND {
                    failures.push(format!(
                        "{what}: peak RSS grew by {} MiB; mutations: {:?}",
                        grew >> 20,
                        case_mutations(&b, idx)
                    ));
                }
            }
        }
        eprintln!(
            "torture: {}: {} cases in {:?} ({base_errors} errors returned)",
            b.name,
            b.cases,
            t.elapsed()
        );
    };

    for b in own_images(scale) {
        run_base(b);
    }
    for g in GOLDEN {
        if only
            .as_ref()
            .is_some_and(|(n, _)| *n != format!("golden/{g}"))
        {
            continue;
        }
        run_base(golden_image(g, scale));
    }
    let _ = std::panic::take_hook();

    let mut kinds: Vec<String> = kinds.into_iter().collect();
    kinds.sort();
    eprintln!(
        "torture: {total} cases ({opened} opened), {calls} API calls, {errors} errors, \
         slowest case {:?} ({}), largest peak-RSS growth {} MiB, total {:?}\n\
         torture: error kinds seen: {}",
        slowest.0,
        slowest.1,
        peak_growth >> 20,
        t0.elapsed(),
        kinds.join(" ")
    );
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
    if only.is_none() {
        assert!(total >= 10_000 * scale.min(1), "only {total} cases");
    }
}

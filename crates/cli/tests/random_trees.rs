//! Generated trees (seeded, so failures reproduce): build, mount with the kernel,
//! compare digests; then `ferofs extract` and compare again. Uncompressed and default
//! builds at every block size, every algorithm x pcluster x ztailpacking, and the same
//! with a metabox (`-m`).

mod common;
use common::*;
use ferofs_testkit::{assert_same_tree, kernel_available, Mount, Tmpfs};
use rustix::fs::{AtFlags, FileType, Mode, Timespec, Timestamps, CWD};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// File content: incompressible, text-like, or long runs (so compressed builds see
    /// extents that shrink a lot, a little, or not at all).
    fn content(&mut self, n: usize) -> Vec<u8> {
        const WORDS: [&str; 12] = [
            "erofs ",
            "block ",
            "the ",
            "pcluster ",
            "kernel\n",
            "a ",
            "lz4 ",
            "of ",
            "read-only ",
            "image ",
            "zstd ",
            "0123456789",
        ];
        match self.below(3) {
            0 => self.bytes(n),
            1 => {
                let mut v = Vec::with_capacity(n + 16);
                while v.len() < n {
                    v.extend_from_slice(WORDS[self.below(12) as usize].as_bytes());
                }
                v.truncate(n);
                v
            }
            _ => {
                let mut v = Vec::with_capacity(n + 4096);
                while v.len() < n {
                    let run = 1 + self.below(4096) as usize;
                    let b = self.next() as u8;
                    v.extend(std::iter::repeat_n(b, run));
                }
                v.truncate(n);
                v
            }
        }
    }
}

fn name(r: &mut Rng, taken: &mut Vec<Vec<u8>>) -> Vec<u8> {
    loop {
        let len = match r.below(10) {
            0 => 255,
            1 => 1,
            _ => 1 + r.below(40) as usize,
        };
        let n: Vec<u8> = (0..len)
            .map(|_| match r.below(4) {
                0 => 0x80 + r.below(0x80) as u8,
                1 => b" !#-.~_"[r.below(7) as usize],
                _ => b'a' + r.below(26) as u8,
            })
            .collect();
        if n == b"." || n == b".." || taken.contains(&n) {
            continue;
        }
        taken.push(n.clone());
        return n;
    }
}

fn set_time(p: &Path, r: &mut Rng) {
    let sec = match r.below(5) {
        0 => -(r.below(1 << 31) as i64),
        1 => 0,
        _ => r.below(1 << 33) as i64,
    };
    let t = Timespec {
        tv_sec: sec,
        // Whole seconds half of the time (compact inodes of the 48-bit layout).
        tv_nsec: match r.below(2) {
            0 => 0,
            _ => r.below(1_000_000_000) as _,
        },
    };
    rustix::fs::utimensat(
        CWD,
        p,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("utimensat");
}

fn gen(root: &Path, seed: u64, bs: u64) {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut dirs = vec![root.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut all: Vec<PathBuf> = Vec::new();
    let count = 20 + r.below(60);
    let mut taken: Vec<Vec<u8>> = Vec::new();
    for _ in 0..count {
        let parent = dirs[r.below(dirs.len() as u64) as usize].clone();
        let p = parent.join(OsStr::from_bytes(&name(&mut r, &mut taken)));
        match r.below(10) {
            0 | 1 => {
                std::fs::create_dir(&p).expect("mkdir");
                dirs.push(p.clone());
            }
            2 => {
                let tlen = if r.below(4) == 0 {
                    4095
                } else {
                    1 + r.below(200) as usize
                };
                let t: Vec<u8> = (0..tlen).map(|_| b'a' + r.below(26) as u8).collect();
                std::os::unix::fs::symlink(OsStr::from_bytes(&t), &p).expect("symlink");
            }
            3 if !files.is_empty() => {
                let f = files[r.below(files.len() as u64) as usize].clone();
                std::fs::hard_link(&f, &p).expect("link");
                continue;
            }
            4 => {
                let (ft, dev) = match r.below(4) {
                    0 => (
                        FileType::CharacterDevice,
                        rustix::fs::makedev(r.below(4096) as u32, r.below(1 << 20) as u32),
                    ),
                    1 => (
                        FileType::BlockDevice,
                        rustix::fs::makedev(r.below(4096) as u32, r.below(256) as u32),
                    ),
                    2 => (FileType::Fifo, 0),
                    _ => (FileType::Socket, 0),
                };
                rustix::fs::mknodat(CWD, &p, ft, Mode::from_raw_mode(0o644), dev).expect("mknod");
            }
            _ => {
                let size = match r.below(9) {
                    0 => 0,
                    1 => 1,
                    2 => bs - 1,
                    3 => bs,
                    4 => bs + 1,
                    5 => 2 * bs - 1,
                    6 => 3 * bs,
                    _ => r.below(100_000),
                } as usize;
                std::fs::write(&p, r.content(size)).expect("write");
                files.push(p.clone());
            }
        }
        // xattrs
        for _ in 0..r.below(4) {
            let n = format!("user.{}", r.below(6));
            let (a, b) = (r.below(3) as usize, r.below(300) as usize);
            let v = r.bytes(a * b);
            let _ = xattr::set(&p, &n, &v);
        }
        let uid = [0u32, 1, 65535, 65536, 4_000_000_000][r.below(5) as usize];
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid ^ 1)).expect("chown");
        let meta = std::fs::symlink_metadata(&p).expect("stat");
        if !meta.file_type().is_symlink() {
            let mode = if meta.is_dir() {
                0o700 | r.below(0o7777) as u32
            } else {
                r.below(0o10000) as u32
            };
            rustix::fs::chmodat(CWD, &p, Mode::from_raw_mode(mode), AtFlags::empty())
                .expect("chmod");
        }
        all.push(p);
    }
    for p in &all {
        if !std::fs::symlink_metadata(p).expect("stat").is_dir() {
            set_time(p, &mut r);
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in &dirs {
        set_time(d, &mut r);
    }
}

#[test]
fn random_trees_roundtrip_through_the_kernel() {
    if !kernel_available("random_trees_roundtrip_through_the_kernel") {
        return;
    }
    let fs = Tmpfs::new("512M");
    for seed in 1..=20u64 {
        let bs = [4096u64, 512, 1024, 4096][(seed % 4) as usize];
        let src = fs.path().join(format!("src{seed}"));
        std::fs::create_dir(&src).expect("mkdir");
        gen(&src, seed, bs);
        let img = fs.path().join(format!("t{seed}.erofs"));
        let z = if seed % 2 == 0 { "none" } else { "lz4hc" };
        build(&src, &img, &["-b", &bs.to_string(), "-z", z]);
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&src, m.path());
        }
        let x = fs.path().join(format!("x{seed}"));
        ok(&[&"extract", &img, &x]);
        assert_same_tree(&src, &x);
        if bs == 4096 {
            ferofs_testkit::fsck_erofs(&img)
                .unwrap_or_else(|e| panic!("seed {seed}: fsck.erofs failed:\n{e}"));
        }
        for p in [&src, &x] {
            std::fs::remove_dir_all(p).expect("rm");
        }
        std::fs::remove_file(&img).expect("rm");
    }
}

/// fsck.erofs learned DEFLATE in 1.7 and Zstandard in 1.8; Debian 12 ships 1.5.
fn fsck_knows(alg: &str) -> bool {
    let v = ferofs_testkit::fsck_erofs_version().unwrap_or((0, 0));
    match alg {
        "deflate" => v >= (1, 7),
        "zstd" => v >= (1, 8),
        _ => true,
    }
}

#[test]
fn random_trees_every_compression_setting() {
    if !kernel_available("random_trees_every_compression_setting") {
        return;
    }
    let fs = Tmpfs::new("512M");
    let mut seed = 100u64;
    for alg in ["lz4", "lz4hc", "lzma", "deflate", "zstd"] {
        let mut compressed = 0;
        for c in ["4096", "65536", "1048576"] {
            for tail in [false, true] {
                seed += 1;
                let src = fs.path().join(format!("src{seed}"));
                std::fs::create_dir(&src).expect("mkdir");
                gen(&src, seed, 4096);
                let img = fs.path().join(format!("t{seed}.erofs"));
                let mut args = vec!["-z", alg, "-C", c];
                if tail {
                    args.extend(["-E", "ztailpacking"]);
                }
                build(&src, &img, &args);
                let what = format!("seed {seed} {args:?}");
                let info = json(&ok(&[&"inspect", &"--json", &img]));
                compressed += info["counts"]["compressed_files"].as_u64().unwrap_or(0);
                {
                    let m = Mount::erofs(&img);
                    assert_same_tree(&src, m.path());
                }
                let x = fs.path().join(format!("x{seed}"));
                ok(&[&"extract", &img, &x]);
                assert_same_tree(&src, &x);
                if fsck_knows(alg) {
                    ferofs_testkit::fsck_erofs(&img)
                        .unwrap_or_else(|e| panic!("{what}: fsck.erofs failed:\n{e}"));
                }
                for p in [&src, &x] {
                    std::fs::remove_dir_all(p).expect("rm");
                }
                std::fs::remove_file(&img).expect("rm");
            }
        }
        assert!(compressed >= 6, "{alg}: only {compressed} compressed files");
    }
}

/// `-m`: every algorithm at 4 KiB and 1 MiB pclusters, with and without ztailpacking,
/// and uncompressed at 1 KiB blocks, each on its own seeded tree; then `-E 48bit` and
/// `-E dot-omitted` without a metabox.
#[test]
fn random_trees_metabox() {
    if !kernel_available("random_trees_metabox") {
        return;
    }
    let fs = Tmpfs::new("512M");
    let mut seed = 300u64;
    let mut cases: Vec<Vec<&str>> = vec![vec!["-b", "1024", "-z", "none", "-m"]];
    for alg in ["lz4hc", "lzma", "deflate", "zstd"] {
        for c in ["4096", "1048576"] {
            for tail in [false, true] {
                let mut a = vec!["-z", alg, "-C", c, "-m"];
                if tail {
                    a.extend(["-E", "ztailpacking"]);
                }
                cases.push(a);
            }
        }
    }
    cases.push(vec!["-b", "1024", "-z", "none", "-E", "48bit"]);
    cases.push(vec!["-z", "lz4hc", "-E", "dot-omitted,ztailpacking"]);
    cases.push(vec!["-z", "zstd", "-C", "1048576", "-E", "smallest,48bit"]);
    for args in cases {
        seed += 1;
        let bs = if args[0] == "-b" { 1024 } else { 4096 };
        let src = fs.path().join(format!("src{seed}"));
        std::fs::create_dir(&src).expect("mkdir");
        gen(&src, seed, bs);
        let img = fs.path().join(format!("t{seed}.erofs"));
        build(&src, &img, &args);
        let what = format!("seed {seed} {args:?}");
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        if args.contains(&"-m") {
            assert_eq!(info["root_nid"].as_u64(), Some(1 << 63), "{what}");
        }
        let incompat = info["feature_incompat"].to_string();
        assert!(incompat.contains("\"48bit\""), "{what}: {incompat}");
        let x = fs.path().join(format!("x{seed}"));
        assert_image_holds(&img, &src, &x, &what);
        std::fs::remove_dir_all(&src).expect("rm");
        std::fs::remove_file(&img).expect("rm");
    }
}

//! `ferofs mount`: the FUSE mount of an image shows what the kernel's mount of the same
//! image shows (contents, metadata, xattrs, hard links, devices, symlinks, inode
//! numbers, st_blocks, st_nlink, d_ino, statfs); concurrent random reads get the right
//! bytes within the cache budget; writes fail with EROFS; corrupt images fail cleanly;
//! `--record-access` lists first reads in order; signals and umount end the daemon.
//!
//! Needs root, loop devices and /dev/fuse (FEROFS_SKIP_KERNEL=1 skips loudly).

mod common;
use common::*;
use ferofs_testkit::run as sh;
use ferofs_testkit::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fuse_available(test: &str) -> bool {
    if !kernel_available(test) {
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        if std::env::var("FEROFS_SKIP_KERNEL").is_ok_and(|v| v == "1") {
            eprintln!("\n*** SKIPPED FUSE test {test}: no /dev/fuse (FEROFS_SKIP_KERNEL=1) ***\n");
            return false;
        }
        panic!("FUSE test {test} cannot run: no /dev/fuse (set FEROFS_SKIP_KERNEL=1 to skip)");
    }
    true
}

/// Mount points in this mount namespace.
fn mounted(dir: &Path) -> bool {
    let want = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(m) == want)
}

/// The daemon serving `dir` (a `--daemon-child` process whose last argument is `dir`).
fn daemon_pid(dir: &Path) -> Option<u32> {
    let want = dir.as_os_str().as_encoded_bytes();
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
        if args.contains(&&b"--daemon-child"[..]) && args.last() == Some(&want) {
            return Some(pid);
        }
    }
    None
}

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(false)
}

fn wait_exit(pid: u32, what: &str) {
    let t = Instant::now();
    while alive(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what}: daemon {pid} still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Peak resident memory of a process, bytes.
fn vm_hwm(pid: u32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// A background `ferofs mount`; unmounted (and its daemon awaited) on drop.
struct Fuse {
    dir: tempfile::TempDir,
    pid: u32,
}

impl Fuse {
    fn new(img: &Path, extra: &[&str]) -> Self {
        let dir = scratch("fuse");
        let mut c = ferofs();
        c.arg("mount").args(extra).arg(img).arg(dir.path());
        let out = c.output().expect("run ferofs mount");
        assert!(
            out.status.success(),
            "ferofs mount {} {extra:?} failed: {}",
            img.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // Background mode returns only once the mount is up.
        assert!(
            mounted(dir.path()),
            "not mounted when ferofs mount returned"
        );
        let pid = daemon_pid(dir.path()).expect("no daemon process");
        Fuse { dir, pid }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    /// `umount DIR` and wait for the daemon to exit.
    fn unmount(&self) {
        sh(std::process::Command::new("umount").arg(self.path()));
        wait_exit(self.pid, "umount");
        assert!(!mounted(self.path()));
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        if mounted(self.path()) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.path())
                .status();
        }
        let t = Instant::now();
        while alive(self.pid) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Everything `stat` and `statvfs` say, compared path by path, plus each directory's
/// (name, d_ino) list.
fn assert_same_stats(kernel: &Path, fuse: &Path) {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Vec<i128>>) {
        let p = root.join(rel);
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
        let row: Vec<i128> = vec![
            m.ino().into(),
            m.nlink().into(),
            m.blocks().into(),
            m.blksize().into(),
            m.size().into(),
            m.mode().into(),
            m.uid().into(),
            m.gid().into(),
            m.rdev().into(),
            m.mtime().into(),
            m.mtime_nsec().into(),
            m.atime().into(),
            m.atime_nsec().into(),
            m.ctime().into(),
            m.ctime_nsec().into(),
        ];
        out.insert(rel.to_path_buf(), row);
        if m.is_dir() {
            let mut ents: Vec<(std::ffi::OsString, u64)> = fs::read_dir(&p)
                .expect("readdir")
                .map(|e| e.expect("dirent"))
                .map(|e| (e.file_name(), e.ino()))
                .collect();
            ents.sort();
            let d: Vec<i128> = ents.iter().map(|(_, i)| i128::from(*i)).collect();
            out.insert(rel.join("\0dirents"), d);
            for (n, _) in ents {
                walk(root, &rel.join(n), out);
            }
        }
    }
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    walk(kernel, Path::new(""), &mut a);
    walk(fuse, Path::new(""), &mut b);
    let diffs: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .take(10)
        .map(|(k, v)| format!("{}: kernel {v:?} fuse {:?}", k.display(), b.get(k)))
        .collect();
    assert!(
        diffs.is_empty(),
        "stat differs (ino nlink blocks blksize size mode uid gid rdev mtime atime ctime):\n{}",
        diffs.join("\n")
    );
    assert_eq!(a.len(), b.len(), "entry counts differ");
    let (ka, fb) = (
        rustix::fs::statvfs(kernel).expect("statvfs kernel"),
        rustix::fs::statvfs(fuse).expect("statvfs fuse"),
    );
    let f = |s: &rustix::fs::StatVfs| {
        (
            s.f_bsize,
            s.f_frsize,
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_namemax,
        )
    };
    assert_eq!(f(&ka), f(&fb), "statvfs differs");
}

/// A file's data ranges and the errno of SEEK_DATA at its size.
type SeekMap = (Vec<(u64, u64)>, Option<i32>);

/// Each regular file's data ranges as `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)`
/// report them, alternately from offset 0, and what SEEK_DATA at the size answers.
fn seek_maps(root: &Path) -> BTreeMap<PathBuf, SeekMap> {
    use rustix::fs::{seek, SeekFrom};
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    // Bounded by the tree.
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("readdir").flatten() {
            let ft = e.file_type().expect("type");
            if ft.is_dir() {
                stack.push(e.path());
                continue;
            }
            if !ft.is_file() {
                continue;
            }
            let f = fs::File::open(e.path()).expect("open");
            let size = f.metadata().expect("fstat").len();
            let mut segs = Vec::new();
            let mut off = 0u64;
            // Bounded: each turn moves past one data range.
            while off < size {
                let d = match seek(&f, SeekFrom::Data(off)) {
                    Ok(d) => d,
                    Err(rustix::io::Errno::NXIO) => break,
                    Err(e) => panic!("SEEK_DATA {}: {e}", off),
                };
                let h = seek(&f, SeekFrom::Hole(d)).expect("SEEK_HOLE");
                assert!(
                    h > d && h <= size,
                    "{}: data {d} hole {h}",
                    e.path().display()
                );
                segs.push((d, h));
                off = h;
            }
            let past = seek(&f, SeekFrom::Data(size))
                .err()
                .map(|e| e.raw_os_error());
            let rel = e.path().strip_prefix(root).expect("rel").to_path_buf();
            out.insert(rel, (segs, past));
        }
    }
    out
}

/// Kernel mount and FUSE mount of `img` show the same tree, the same stats and the
/// same holes (SEEK_DATA / SEEK_HOLE).
fn fuse_equals_kernel(img: &Path, what: &str) {
    let k = Mount::erofs(img);
    let m = Fuse::new(img, &[]);
    let (dk, dm) = (digest(k.path()), digest(m.path()));
    assert_eq!(
        dk,
        dm,
        "{what}: FUSE mount differs from the kernel's:\n{}",
        treecmp(k.path(), m.path())
    );
    assert_same_stats(k.path(), m.path());
    let (sk, sm) = (seek_maps(k.path()), seek_maps(m.path()));
    let diffs: Vec<String> = sk
        .iter()
        .filter(|(p, v)| sm.get(*p) != Some(v))
        .take(5)
        .map(|(p, v)| format!("{}: kernel {v:?} fuse {:?}", p.display(), sm.get(p)))
        .collect();
    assert!(
        diffs.is_empty(),
        "{what}: holes differ:\n{}",
        diffs.join("\n")
    );
    m.unmount();
}

fn golden_case(name: &str) {
    if !fuse_available(name) {
        return;
    }
    let img = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
    fuse_equals_kernel(&img, name);
}

macro_rules! golden_mount {
    ($($f:ident => $n:expr),* $(,)?) => { $( #[test] fn $f() { golden_case($n); } )* };
}

golden_mount! {
    golden_deflate_c64k_tpfd => "deflate-C64k-tpfd",
    golden_deflate_c64k => "deflate-C64k",
    golden_deflate => "deflate",
    golden_libdeflate_c64k_tpfd => "libdeflate-C64k-tpfd",
    golden_libdeflate_c64k => "libdeflate-C64k",
    golden_libdeflate => "libdeflate",
    golden_lz4_c64k_tpfd => "lz4-C64k-tpfd",
    golden_lz4_c64k => "lz4-C64k",
    golden_lz4 => "lz4",
    golden_lz4hc_48bit_c64k => "lz4hc-48bit-C64k",
    golden_lz4hc_c64k_tpfd => "lz4hc-C64k-tpfd",
    golden_lz4hc_c64k => "lz4hc-C64k",
    golden_lz4hc_all_fragments => "lz4hc-all-fragments",
    golden_lz4hc_lzma => "lz4hc-lzma",
    golden_lz4hc_metabox => "lz4hc-metabox",
    golden_lz4hc_xattr_prefix_packed => "lz4hc-xattr-prefix-packed",
    golden_lz4hc_zd => "lz4hc-zD",
    golden_lz4hc => "lz4hc",
    golden_lzma_c64k_tpfd => "lzma-C64k-tpfd",
    golden_lzma_c64k => "lzma-C64k",
    golden_lzma => "lzma",
    golden_plain_48bit => "plain-48bit",
    golden_plain_b1024 => "plain-b1024",
    golden_plain_b512 => "plain-b512",
    golden_plain_chunk64k_indexes => "plain-chunk64k-indexes",
    golden_plain_chunk64k => "plain-chunk64k",
    golden_plain_dot_omitted => "plain-dot-omitted",
    golden_plain_extended => "plain-extended",
    golden_plain_metabox => "plain-metabox",
    golden_plain_noinline => "plain-noinline",
    golden_plain_xattr_prefix => "plain-xattr-prefix",
    golden_plain => "plain",
    golden_zstd_c64k_tpfd => "zstd-C64k-tpfd",
    golden_zstd_c64k => "zstd-C64k",
    golden_zstd => "zstd",
}

/// Every golden image has a test above (a new golden image must get one).
#[test]
fn every_golden_image_is_listed() {
    let src = include_str!("mount.rs");
    let dir = shared_dir().join("testdata/erofs-utils-1.9.3");
    for e in fs::read_dir(&dir).expect("golden dir").flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if let Some(stem) = n.strip_suffix(".erofs.zst") {
            assert!(
                src.contains(&format!("=> \"{stem}\"")),
                "golden image {stem} has no mount test"
            );
        }
    }
}

/// make-tree images built by ferofs: uncompressed, lz4 4 KiB, zstd 1 MiB -E smallest;
/// and the lz4 one again inside a file at an odd offset (`--offset`).
#[test]
fn built_images_equal_kernel() {
    if !fuse_available("built_images_equal_kernel") {
        return;
    }
    let (fs_, tree) = make_tree();
    for (name, args) in [
        ("none", &["-z", "none"][..]),
        ("lz4-4k", &["-z", "lz4", "-C", "4096"][..]),
        (
            "zstd-1m-smallest",
            &["-z", "zstd", "-C", "1048576", "-E", "smallest"][..],
        ),
    ] {
        let img = fs_.path().join(format!("{name}.erofs"));
        build(&tree, &img, args);
        fuse_equals_kernel(&img, name);
        if name == "lz4-4k" {
            let off = 12345u64;
            let wrapped = fs_.path().join("wrapped.bin");
            let mut w = fs::File::create(&wrapped).expect("create wrapped");
            w.write_all(&vec![0x5a; off as usize]).expect("prefix");
            w.write_all(&fs::read(&img).expect("read image"))
                .expect("image");
            drop(w);
            let m = Fuse::new(&wrapped, &["--offset", &off.to_string()]);
            let k = Mount::erofs(&img);
            assert_eq!(digest(k.path()), digest(m.path()), "--offset mount differs");
            m.unmount();
        }
    }
}

/// SEEK_DATA and SEEK_HOLE through the FUSE mount follow the file's map: make-tree's
/// 100 MiB sparse file shows its five data extents and little more, the hole-only file
/// no data (ENXIO from 0), a file without holes one range; past the end is ENXIO, and
/// other files answer as the kernel does (`fuse_equals_kernel`).
#[test]
fn seek_data_and_hole_follow_the_map() {
    if !fuse_available("seek_data_and_hole_follow_the_map") {
        return;
    }
    let (fs_, tree) = make_tree();
    for (name, args) in [
        ("none", &["-z", "none"][..]),
        ("lz4hc", &["-z", "lz4hc", "-C", "65536"][..]),
    ] {
        let img = fs_.path().join(format!("{name}.erofs"));
        build(&tree, &img, args);
        let m = Fuse::new(&img, &[]);
        let maps = seek_maps(m.path());
        let (segs, past) = &maps[Path::new("data/sparse-100MiB.img")];
        let mib = 1u64 << 20;
        let data: u64 = segs.iter().map(|(a, b)| b - a).sum();
        assert!(data < 4 * mib, "{name}: {data} bytes of data: {segs:?}");
        for at in [0, mib + 100, 33 * mib, 77 * mib - 2048, 100 * mib - 1000] {
            assert!(
                segs.iter().any(|&(a, b)| (a..b).contains(&at)),
                "{name}: data at {at} not in {segs:?}"
            );
        }
        assert_eq!(*past, Some(libc::ENXIO), "{name}");
        let (segs, _) = &maps[Path::new("data/sparse-hole-only.img")];
        assert!(segs.is_empty(), "{name}: {segs:?}");
        // A file with no hole: one range, all of it.
        let p = Path::new("data/compressible-3MiB.txt");
        let (segs, _) = &maps[p];
        let size = fs::metadata(m.path().join(p)).expect("stat").len();
        assert_eq!(segs, &vec![(0, size)], "{name}");
        m.unmount();
    }
}

/// The binary run as `erofsfuse` (a symlink) takes erofsfuse's command line: the image
/// inside a file (`--offset=`), libfuse's `-s` and `-o` options, in the background by
/// default and in the foreground with `-d`; an option ferofs lacks is an error naming it.
#[test]
fn erofsfuse_command_line() {
    if !fuse_available("erofsfuse_command_line") {
        return;
    }
    let (fs_, tree) = make_tree();
    let img = fs_.path().join("a.erofs");
    build(&tree, &img, &["-z", "lz4hc", "-E", "ztailpacking"]);
    let off = 8192u64;
    let wrapped = fs_.path().join("wrapped.bin");
    let mut bytes = vec![0x5a; off as usize];
    bytes.extend(fs::read(&img).expect("read image"));
    fs::write(&wrapped, &bytes).expect("write wrapped");
    let erofsfuse = fs_.path().join("erofsfuse");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferofs"), &erofsfuse).expect("symlink");
    let k = Mount::erofs(&img);

    let dir = scratch("erofsfuse");
    let out = std::process::Command::new(&erofsfuse)
        .arg(format!("--offset={off}"))
        .args([
            "--dbglevel=3",
            "-s",
            "-o",
            "ro,max_idle_threads=2,noexec",
            "-oclone_fd,rw,noatime",
        ])
        .arg(&wrapped)
        .arg(dir.path())
        .output()
        .expect("run erofsfuse");
    assert!(
        out.status.success(),
        "erofsfuse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mounted(dir.path()), "not mounted when erofsfuse returned");
    let pid = daemon_pid(dir.path()).expect("no daemon process");
    let cmd = fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let cmd: Vec<String> = cmd
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(
        cmd.windows(2)
            .any(|w| w[0] == "-o" && w[1] == "ro,noexec,threads=1"),
        "{cmd:?}"
    );
    assert_eq!(
        digest(k.path()),
        digest(dir.path()),
        "erofsfuse mount differs"
    );
    // noexec reached the kernel's mount flags (field 6 of mountinfo).
    let want = dir.path().canonicalize().expect("canonicalize");
    let info = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let flags = info
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4).is_some_and(|m| Path::new(m) == want))
        .and_then(|f| f.get(5).map(|s| s.to_string()))
        .expect("mountinfo line");
    assert!(
        flags.split(',').any(|f| f == "ro") && flags.split(',').any(|f| f == "noexec"),
        "{flags}"
    );
    sh(std::process::Command::new("umount").arg(dir.path()));
    wait_exit(pid, "umount");

    // -d: the foreground, until SIGINT.
    let mut fg = std::process::Command::new(&erofsfuse)
        .arg("-d")
        .arg(&img)
        .arg(dir.path())
        .spawn()
        .expect("spawn erofsfuse -d");
    let t = Instant::now();
    while !mounted(dir.path()) {
        assert!(t.elapsed() < Duration::from_secs(10), "-d never mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        digest(k.path()),
        digest(dir.path()),
        "erofsfuse -d mount differs"
    );
    sh(std::process::Command::new("kill").args(["-INT", &fg.id().to_string()]));
    let st = fg.wait().expect("wait -d");
    assert!(st.success(), "erofsfuse -d after SIGINT: {st}");
    assert!(!mounted(dir.path()));

    // Options ferofs does not have are named, and nothing is mounted.
    for bad in [&["-o", "allow_root"][..], &["--aux=1"][..], &["-x"][..]] {
        let out = ferofs()
            .arg("erofsfuse")
            .args(bad)
            .arg(&img)
            .arg(dir.path())
            .output()
            .expect("run ferofs erofsfuse");
        let err = String::from_utf8_lossy(&out.stderr);
        let name = bad[bad.len() - 1]
            .trim_start_matches('-')
            .split('=')
            .next()
            .unwrap_or("");
        assert!(
            !out.status.success() && err.contains(name) && err.contains("not implemented"),
            "{bad:?}: {err}"
        );
        assert!(!mounted(dir.path()), "{bad:?} mounted");
    }
}

/// Deterministic, compressible-ish bytes (words from an LCG).
fn text(seed: u64, n: usize) -> Vec<u8> {
    const W: [&[u8]; 16] = [
        b"erofs ",
        b"fuse ",
        b"read ",
        b"only ",
        b"pcluster ",
        b"extent ",
        b"kernel ",
        b"cache ",
        b"lz4 ",
        b"zstd ",
        b"thread ",
        b"mount ",
        b"image ",
        b"block ",
        b"inode ",
        b"\n",
    ];
    let mut s = seed;
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.extend_from_slice(W[(s >> 60) as usize]);
        if (s >> 20) & 7 == 0 {
            v.extend_from_slice(&s.to_le_bytes()[..3]);
        }
    }
    v.truncate(n);
    v
}

/// Eight threads read random ranges of the same files (O_DIRECT: every read reaches
/// the daemon) and always get the right bytes; the daemon's peak memory stays within
/// the cache budget plus a fixed allowance.
#[test]
fn eight_threads_random_reads_within_budget() {
    if !fuse_available("eight_threads_random_reads_within_budget") {
        return;
    }
    let fs_ = Tmpfs::new("1G");
    let src = fs_.path().join("src");
    fs::create_dir_all(&src).expect("mkdir");
    let files: Vec<(String, Vec<u8>)> = (0..3u64)
        .map(|i| {
            (
                format!("f{i}"),
                text(i + 1, [96 << 20, 5 << 20, 300_001][i as usize]),
            )
        })
        .collect();
    for (n, d) in &files {
        fs::write(src.join(n), d).expect("write");
    }
    let img = fs_.path().join("big.erofs");
    build(&src, &img, &["-z", "zstd", "-C", "1048576"]);
    let cache = 8u64 << 20;
    let m = Fuse::new(&img, &["-o", &format!("cache={cache}")]);
    let base = vm_hwm(m.pid);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (files, root) = (&files, m.path());
            s.spawn(move || {
                let mut r = 0x9E37_79B9u64 ^ (t << 32);
                for k in 0..150 {
                    r = r
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let (name, data) = &files[(r >> 62) as usize % files.len()];
                    let off = (r >> 16) % data.len() as u64;
                    let len = (1 + (r >> 8) % (256 << 10)) as usize;
                    let f = fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_DIRECT)
                        .open(root.join(name))
                        .expect("open");
                    let mut buf = vec![0u8; len];
                    let n = f.read_at(&mut buf, off).expect("read");
                    let end = (off as usize + len).min(data.len());
                    assert_eq!(n, end - off as usize, "thread {t} read {k}: short read");
                    assert!(
                        buf[..n] == data[off as usize..end],
                        "thread {t} read {k}: wrong bytes at {off}+{len} of {name}"
                    );
                }
            });
        }
    });
    let peak = vm_hwm(m.pid);
    eprintln!(
        "8 threads x 150 random reads: {:.2} s; daemon VmHWM {} MiB at mount, {} MiB peak (cache {} MiB)",
        t0.elapsed().as_secs_f64(),
        base >> 20,
        peak >> 20,
        cache >> 20
    );
    // The file alone decodes to 100 MiB: a cache that did not hold its budget would
    // keep far more than this.
    // The target: 64 MiB plus the configured cache.
    assert!(
        peak <= cache + (64 << 20),
        "daemon peak {peak} over budget (base {base})"
    );
    // Whole-file reads, page cache and all, are right too.
    assert!(fs::read(m.path().join("f1")).expect("read f1") == files[1].1);
    m.unmount();
}

fn errno(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Every way of writing fails with EROFS (30).
#[test]
fn writes_fail_with_erofs() {
    if !fuse_available("writes_fail_with_erofs") {
        return;
    }
    let img = golden("erofs-utils-1.9.3/lz4hc.erofs.zst");
    let m = Fuse::new(&img, &[]);
    let p = m.path();
    let file = fs::read_dir(p.join("files"))
        .expect("files/")
        .flatten()
        .find(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .expect("a file")
        .path();
    const EROFS: Option<i32> = Some(30);
    assert_eq!(
        errno(fs::OpenOptions::new().write(true).open(&file)),
        EROFS,
        "open for write"
    );
    assert_eq!(
        errno(fs::OpenOptions::new().append(true).open(&file)),
        EROFS,
        "open for append"
    );
    assert_eq!(errno(fs::File::create(p.join("new"))), EROFS, "create");
    assert_eq!(errno(fs::create_dir(p.join("newdir"))), EROFS, "mkdir");
    assert_eq!(errno(fs::remove_file(&file)), EROFS, "unlink");
    assert_eq!(errno(fs::rename(&file, p.join("moved"))), EROFS, "rename");
    assert_eq!(errno(fs::hard_link(&file, p.join("link"))), EROFS, "link");
    assert_eq!(
        errno(std::os::unix::fs::symlink("x", p.join("sym"))),
        EROFS,
        "symlink"
    );
    assert_eq!(
        errno(fs::set_permissions(
            &file,
            fs::Permissions::from_mode_(0o777)
        )),
        EROFS,
        "chmod"
    );
    assert_eq!(errno(xattr::set(&file, "user.x", b"1")), EROFS, "setxattr");
    assert_eq!(
        rustix::fs::access(&file, rustix::fs::Access::WRITE_OK)
            .err()
            .map(|e| e.raw_os_error()),
        EROFS,
        "access(W_OK)"
    );
    // Reading still works after all that.
    fs::read(&file).expect("read after refused writes");
    m.unmount();
}

trait ModeExt {
    fn from_mode_(m: u32) -> Self;
}
impl ModeExt for fs::Permissions {
    fn from_mode_(m: u32) -> Self {
        std::os::unix::fs::PermissionsExt::from_mode(m)
    }
}

/// A file that is not an image fails to mount with the reader's error, leaving no
/// mount and no daemon; a damaged pcluster gives EIO on that file only, and the daemon
/// serves on.
#[test]
fn corrupt_images_fail_cleanly() {
    if !fuse_available("corrupt_images_fail_cleanly") {
        return;
    }
    let fs_ = Tmpfs::new("256M");
    let junk = fs_.path().join("junk.img");
    fs::write(&junk, text(9, 1 << 20)).expect("write junk");
    let dir = scratch("fuse-bad");
    let out = ferofs()
        .arg("mount")
        .arg(&junk)
        .arg(dir.path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "junk mounted");
    assert!(
        err.contains("not an EROFS image") && err.contains("junk.img"),
        "unclear error: {err}"
    );
    assert!(
        !mounted(dir.path()) && daemon_pid(dir.path()).is_none(),
        "left a mount or daemon"
    );
    // A missing mount point: also reported by the command.
    let out = ferofs()
        .arg("mount")
        .arg(&junk)
        .arg(dir.path().join("nope"))
        .output()
        .expect("run");
    assert!(!out.status.success());

    let src = fs_.path().join("src");
    fs::create_dir_all(&src).expect("mkdir");
    let (a, b) = (text(1, 256 << 10), text(2, 256 << 10));
    fs::write(src.join("a"), &a).expect("a");
    fs::write(src.join("b"), &b).expect("b");
    let img = fs_.path().join("c.erofs");
    build(&src, &img, &["-z", "lz4", "-C", "4096"]);
    let st = json(&ok(&[&"stat", &"--json", &img, &"/a"]));
    let e = &st["extents"][1];
    let (phys, stored) = (
        e["physical"].as_u64().expect("physical"),
        e["stored"].as_u64().expect("stored"),
    );
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .expect("open image");
    f.seek(SeekFrom::Start(phys)).expect("seek");
    f.write_all(&vec![0u8; stored as usize]).expect("damage");
    drop(f);
    let m = Fuse::new(&img, &[]);
    let mut fa = fs::File::open(m.path().join("a")).expect("open a");
    let mut v = Vec::new();
    assert_eq!(
        errno(fa.read_to_end(&mut v)),
        Some(5),
        "damaged file must give EIO"
    );
    assert!(alive(m.pid), "daemon died");
    assert!(
        fs::read(m.path().join("b")).expect("read b") == b,
        "undamaged file wrong"
    );
    // The first extent, before the damage, still reads.
    let mut head = vec![0u8; 1000];
    fs::File::open(m.path().join("a"))
        .expect("open")
        .read_exact_at(&mut head, 0)
        .expect("head");
    assert!(head == a[..1000]);
    drop(fa);
    m.unmount();
}

/// `--record-access` lists every regular file whose data was read, once, in the order
/// of first reads; metadata-only access (stat, ls, readlink) lists nothing; the list
/// is what `ferofs build --sort` reads.
#[test]
fn record_access_lists_first_reads_in_order() {
    if !fuse_available("record_access_lists_first_reads_in_order") {
        return;
    }
    let fs_ = Tmpfs::new("64M");
    let src = fs_.path().join("src");
    fs::create_dir_all(src.join("d/e")).expect("mkdir");
    for (n, s) in [
        ("a", 1u64),
        ("d/b", 2),
        ("d/c", 3),
        ("d/e/f", 4),
        ("g", 5),
        ("unread", 6),
    ] {
        fs::write(src.join(n), text(s, 70_000)).expect("write");
    }
    fs::hard_link(src.join("d/c"), src.join("hl")).expect("hard link");
    std::os::unix::fs::symlink("a", src.join("sym")).expect("symlink");
    let img = fs_.path().join("r.erofs");
    build(&src, &img, &["-z", "lz4hc"]);
    let list = fs_.path().join("access.list");
    let m = Fuse::new(&img, &["--record-access", list.to_str().expect("utf-8")]);
    let p = m.path();
    fs::metadata(p.join("unread")).expect("stat");
    fs::read_dir(p.join("d")).expect("ls").for_each(drop);
    fs::read_link(p.join("sym")).expect("readlink");
    let rd = |n: &str| fs::read(p.join(n)).expect("read");
    rd("d/e/f");
    let mut one = [0u8; 10];
    fs::File::open(p.join("a"))
        .expect("open a")
        .read_exact(&mut one)
        .expect("read a");
    rd("d/e/f");
    rd("d/c");
    rd("hl"); // same inode as d/c: already listed
    rd("g");
    rd("a");
    m.unmount();
    let got = fs::read_to_string(&list).expect("read list");
    assert_eq!(got, "d/e/f\na\nd/c\ng\n");
    // The builder takes it as it is.
    let out = ferofs()
        .args(["build", "--sort"])
        .arg(&list)
        .arg(&src)
        .arg(fs_.path().join("sorted.erofs"))
        .output()
        .expect("build --sort");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("--sort:"),
        "build --sort: {err}"
    );
}

/// SIGTERM unmounts and ends the daemon; so does `fusermount3 -u`; with a file held
/// open, SIGTERM detaches the mount and the daemon ends when the file is closed.
#[test]
fn signals_and_fusermount_unmount() {
    if !fuse_available("signals_and_fusermount_unmount") {
        return;
    }
    let img = golden("erofs-utils-1.9.3/plain.erofs.zst");
    let kill =
        |pid: u32, sig: &str| sh(std::process::Command::new("kill").args([sig, &pid.to_string()]));

    let m = Fuse::new(&img, &[]);
    kill(m.pid, "-TERM");
    wait_exit(m.pid, "SIGTERM");
    assert!(!mounted(m.path()), "SIGTERM left the mount behind");

    let m = Fuse::new(&img, &[]);
    kill(m.pid, "-INT");
    wait_exit(m.pid, "SIGINT");
    assert!(!mounted(m.path()), "SIGINT left the mount behind");

    if let Some(fm) = tool("fusermount3") {
        let m = Fuse::new(&img, &[]);
        sh(std::process::Command::new(fm).arg("-u").arg(m.path()));
        wait_exit(m.pid, "fusermount3 -u");
        assert!(!mounted(m.path()));
    } else {
        eprintln!("SKIPPED fusermount3 -u: no fusermount3 on PATH");
    }

    // -f: serves in the foreground until SIGINT, then exits 0 with nothing mounted.
    let dir = scratch("fuse-fg");
    let mut fg = ferofs()
        .args(["mount", "-f"])
        .arg(&img)
        .arg(dir.path())
        .spawn()
        .expect("spawn ferofs mount -f");
    let t = Instant::now();
    while !mounted(dir.path()) {
        assert!(t.elapsed() < Duration::from_secs(10), "-f never mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(fs::read_dir(dir.path()).expect("ls").count() > 3);
    kill(fg.id(), "-INT");
    let st = fg.wait().expect("wait -f");
    assert!(st.success(), "ferofs mount -f after SIGINT: {st}");
    assert!(!mounted(dir.path()));

    let m = Fuse::new(&img, &[]);
    let held = fs::read_dir(m.path().join("files"))
        .expect("files/")
        .flatten()
        .find(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| fs::File::open(e.path()).expect("open"))
        .expect("a file");
    kill(m.pid, "-TERM");
    let t = Instant::now();
    while mounted(m.path()) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "busy mount not detached"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(held);
    wait_exit(m.pid, "SIGTERM on a busy mount");
}

/// Everything a metadata walk sees below `root`: per path, the lstat fields, the
/// symlink target, the listing (name, d_ino) of a directory and every xattr (name,
/// value). The first error ends the walk.
fn metadata_walk(root: &Path) -> std::io::Result<BTreeMap<PathBuf, String>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    // Bounded by the tree (an image of a few hundred entries).
    while let Some(rel) = todo.pop() {
        let p = root.join(&rel);
        let m = fs::symlink_metadata(&p)?;
        let mut row = format!(
            "{} {} {} {:o} {} {} {} {} {}.{}",
            m.ino(),
            m.nlink(),
            m.blocks(),
            m.mode(),
            m.uid(),
            m.gid(),
            m.size(),
            m.rdev(),
            m.mtime(),
            m.mtime_nsec()
        );
        if m.file_type().is_symlink() {
            row += &format!(" -> {:?}", fs::read_link(&p)?);
        }
        let mut names: Vec<_> = xattr::list(&p)?.collect();
        names.sort();
        for n in names {
            let v = xattr::get(&p, &n)?;
            row += &format!(" {n:?}={v:?}");
        }
        if m.is_dir() {
            let mut ents = Vec::new();
            for e in fs::read_dir(&p)? {
                let e = e?;
                ents.push((e.file_name(), e.ino()));
            }
            ents.sort();
            row += &format!(" {ents:?}");
            todo.extend(ents.into_iter().map(|(n, _)| rel.join(n)));
        }
        out.insert(rel, row);
    }
    Ok(out)
}

/// The FUSE device's read-ahead window (KiB) of the mount at `dir`.
fn bdi_read_ahead_kb(dir: &Path) -> u64 {
    let dev = fs::metadata(dir).expect("stat the mount").dev();
    let (major, minor) = (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    );
    fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
        .expect("read_ahead_kb")
        .trim()
        .parse()
        .expect("a number")
}

#[test]
fn read_ahead_option_sets_the_fuse_device_window() {
    if !fuse_available("read_ahead_option_sets_the_fuse_device_window") {
        return;
    }
    let (fs_, tree) = make_tree();
    let img = fs_.path().join("ra.erofs");
    build(&tree, &img, &[]);
    // The default, a size, and 0 (the kernel's own 128 KiB); the tree reads the same.
    let default_kb = match ferofs_mount::DEFAULT_READ_AHEAD {
        0 => 128,
        b => b / 1024,
    };
    for (opts, want) in [
        (&[][..], default_kb),
        (&["-o", "read_ahead=1m"][..], 1024),
        (&["-o", "read_ahead=0"][..], 128),
    ] {
        let m = Fuse::new(&img, opts);
        assert_eq!(bdi_read_ahead_kb(m.path()), want, "{opts:?}");
        assert_same_tree(&tree, m.path());
        m.unmount();
    }
    // Not a size: refused before anything is mounted.
    for bad in ["read_ahead", "read_ahead=lots"] {
        let dir = scratch("fuse-bad-ra");
        let out = ferofs()
            .args(["mount", "-o", bad])
            .arg(&img)
            .arg(dir.path())
            .output()
            .expect("run ferofs mount");
        assert!(!out.status.success(), "-o {bad} accepted");
        assert!(!mounted(dir.path()), "-o {bad}: mounted anyway");
    }
}

/// Issue 13: the metadata is read into the daemon at mount (`-o preload`, on by
/// default), so a full metadata walk (lstat, readdir, readlink, xattrs) after the mount
/// needs no image read at all: the image file is truncated to nothing once mounted, and
/// the walk must still see what the kernel's mount of the same image shows. With `-o
/// nopreload` the same walk fails (the control: the truncation does bite).
#[test]
fn metadata_walk_needs_no_image_read_after_mount() {
    if !fuse_available("metadata_walk_needs_no_image_read_after_mount") {
        return;
    }
    let (fs_, tree) = make_tree();
    let built = fs_.path().join("lz4-4k.erofs");
    build(&tree, &built, &["-z", "lz4", "-C", "4096"]);
    let mut images = vec![("ferofs lz4-4k".to_string(), built)];
    for g in [
        "lz4hc",
        "plain-xattr-prefix",
        "lz4hc-metabox",
        "plain-chunk64k",
    ] {
        images.push((
            format!("mkfs.erofs {g}"),
            golden(&format!("erofs-utils-1.9.3/{g}.erofs.zst")),
        ));
    }
    for (what, img) in images {
        let k = Mount::erofs(&img);
        let want = metadata_walk(k.path()).expect("walk of the kernel mount");
        for opts in [&[][..], &["-o", "nopreload"][..]] {
            let copy = fs_.path().join("copy.erofs");
            fs::copy(&img, &copy).expect("copy image");
            let m = Fuse::new(&copy, opts);
            fs::OpenOptions::new()
                .write(true)
                .open(&copy)
                .and_then(|f| f.set_len(0))
                .expect("truncate the image");
            let got = metadata_walk(m.path());
            if opts.is_empty() {
                let got = got.unwrap_or_else(|e| {
                    panic!("{what}: metadata walk read the image after mount: {e}")
                });
                let diffs: Vec<String> = want
                    .iter()
                    .filter(|(p, v)| got.get(*p) != Some(v))
                    .take(5)
                    .map(|(p, v)| format!("{}: kernel {v} fuse {:?}", p.display(), got.get(p)))
                    .collect();
                assert!(diffs.is_empty(), "{what}: differs:\n{}", diffs.join("\n"));
                assert_eq!(want.len(), got.len(), "{what}: entry counts differ");
            } else {
                assert!(
                    got.is_err(),
                    "{what}: with -o nopreload the walk did not need the image"
                );
            }
            m.unmount();
            fs::remove_file(&copy).expect("remove copy");
        }
    }
}

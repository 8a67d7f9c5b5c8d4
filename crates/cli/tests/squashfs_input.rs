//! `ferofs build IMAGE.sqfs OUT.erofs` (and its alias `ferofs convert`): SquashFS
//! images converted directly.
//!
//! - every mksquashfs 4.7.5 image in `shared/testdata/squashfs-4.7.5/` (gzip, lz4, lzo,
//!   xz, zstd; xattrs, hardlinks, devices, fragments, sparse files) converts, at two
//!   option sets, to an image whose kernel mount equals the kernel mount of the
//!   SquashFS image; the five compressors give the very same bytes;
//! - sparse blocks stay holes;
//! - a truncated or corrupt image fails with an error naming what is wrong and leaves
//!   no output (and no spool) behind.

mod common;
use common::*;
use ferofs_testkit::{
    digest, fsck_metabox, kernel_available, run as run_cmd, scratch, shared_dir, treecmp, Mount,
};
use std::path::{Path, PathBuf};
use std::process::Command;

const COMPRESSORS: [&str; 5] = ["gzip", "lz4", "lzo", "xz", "zstd"];

/// `squashfs-4.7.5/NAME.sqfs.zst` decompressed into `dir`.
fn sqfs(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(format!("{name}.sqfs"));
    let src = shared_dir().join(format!("testdata/squashfs-4.7.5/{name}.sqfs.zst"));
    run_cmd(
        Command::new("zstd")
            .args(["-d", "-q", "-f"])
            .arg(&src)
            .arg("-o")
            .arg(&out),
    );
    out
}

fn convert(verb: &str, src: &Path, img: &Path, extra: &[&str]) {
    let mut c = ferofs();
    c.arg(verb).arg("-q").args(extra).arg(src).arg(img);
    let out = c.output().expect("run ferofs");
    assert!(
        out.status.success(),
        "ferofs {verb} {extra:?} {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_squashfs_image_mounts_as_its_conversion() {
    if !kernel_available("every_squashfs_image_mounts_as_its_conversion") {
        return;
    }
    let d = scratch("sqfs");
    let settings: [&[&str]; 2] = [
        &["-z", "lz4hc"],
        &["-z", "zstd", "-C", "131072", "-E", "smallest"],
    ];
    let mut first: Vec<Option<Vec<u8>>> = vec![None; settings.len()];
    for name in COMPRESSORS {
        let src = sqfs(d.path(), name);
        let sq = Mount::new("squashfs", &src);
        let want = digest(sq.path());
        for (i, opts) in settings.iter().enumerate() {
            let img = d.path().join(format!("{name}-{i}.erofs"));
            // The alias for one setting, the plain verb for the other.
            convert(if i == 0 { "build" } else { "convert" }, &src, &img, opts);
            fsck_metabox(&img, &format!("{name} {opts:?}"));
            let m = Mount::erofs(&img);
            if digest(m.path()) != want {
                panic!(
                    "{name} {opts:?}: the mount differs from the SquashFS mount:\n{}",
                    treecmp(sq.path(), m.path())
                );
            }
            let bytes = std::fs::read(&img).expect("read image");
            match &first[i] {
                None => first[i] = Some(bytes),
                Some(b) => assert!(
                    *b == bytes,
                    "{name} {opts:?}: not the bytes the gzip image converts to"
                ),
            }
        }
    }
}

#[test]
fn sparse_blocks_stay_holes() {
    let d = scratch("sqfs-sparse");
    let src = sqfs(d.path(), "zstd");
    let img = d.path().join("out.erofs");
    convert("build", &src, &img, &["-z", "lz4hc"]);
    let st = ok(&[&"stat", &img, &"/data/sparse-100MiB.img"]);
    let holes = st.lines().filter(|l| l.ends_with(" hole")).count();
    let stored: u64 = st
        .lines()
        .filter_map(|l| l.split('(').nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(holes >= 4, "sparse file has {holes} holes:\n{st}");
    assert!(
        stored <= 1 << 20,
        "sparse 100 MiB file stores {stored} bytes:\n{st}"
    );
}

/// Only `keep` is left in `dir`: no output, no spool.
fn assert_only(dir: &Path, keep: &[&str]) {
    let mut left: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut want: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(left, want, "files left behind in {}", dir.display());
}

fn fails(src: &Path, img: &Path, want: &str) {
    let mut c = ferofs();
    c.args(["build", "-q"]).arg(src).arg(img);
    let out = c.output().expect("run ferofs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{} converted", src.display());
    assert!(
        err.contains(want),
        "{}: error does not say {want:?}: {err}",
        src.display()
    );
    assert!(!img.exists(), "{} left output", src.display());
}

#[test]
fn truncated_or_corrupt_squashfs_fails_and_leaves_nothing() {
    let d = scratch("sqfs-bad");
    let good = sqfs(d.path(), "zstd");
    let bytes = std::fs::read(&good).expect("read image");
    std::fs::remove_file(&good).expect("remove");
    let out = d.path().join("out.erofs");

    // Truncated: half the image.
    let t = d.path().join("trunc.sqfs");
    std::fs::write(&t, &bytes[..bytes.len() / 2]).expect("write");
    fails(&t, &out, "truncated");

    // A data block of the first big file overwritten: its decompression fails, and
    // the error names the file.
    let c = d.path().join("corrupt.sqfs");
    let mut b = bytes.clone();
    for x in &mut b[200_000..200_064] {
        *x ^= 0x5a;
    }
    std::fs::write(&c, &b).expect("write");
    fails(
        &c,
        &out,
        "/data/compressible-3MiB.txt: squashfs: Zstd block at byte",
    );

    // The superblock's inode table pointer past the end.
    let p = d.path().join("badsb.sqfs");
    let mut b = bytes.clone();
    b[64..72].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p, &b).expect("write");
    fails(&p, &out, "inode table");

    // The old lzma compressor is refused by name.
    let l = d.path().join("lzma.sqfs");
    let mut b = bytes.clone();
    b[20..22].copy_from_slice(&2u16.to_le_bytes());
    std::fs::write(&l, &b).expect("write");
    fails(&l, &out, "the lzma compressor (id 2) is not supported");

    assert_only(
        d.path(),
        &["trunc.sqfs", "corrupt.sqfs", "badsb.sqfs", "lzma.sqfs"],
    );
}

#[test]
fn build_options_apply_to_squashfs_input() {
    let d = scratch("sqfs-opts");
    let src = sqfs(d.path(), "zstd");
    let img = d.path().join("out.erofs");
    let plain = d.path().join("plain.erofs");
    convert("build", &src, &plain, &[]);
    let owners = ok(&[&"ls", &plain, &"/owners"]);
    assert!(
        owners
            .lines()
            .any(|l| l.split_whitespace().nth(2) != Some("0")),
        "no owner other than root in /owners:\n{owners}"
    );
    convert(
        "convert",
        &src,
        &img,
        &["--all-root", "--exclude-path", "data", "-j", "1"],
    );
    let root = ok(&[&"ls", &img, &"/"]);
    assert!(!root.contains(" data\n"), "/data not excluded:\n{root}");
    assert!(root.contains(" owners\n"), "no /owners:\n{root}");
    let owners = ok(&[&"ls", &img, &"/owners"]);
    for l in owners.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f[2..4], ["0", "0"], "--all-root: {l}");
    }
}

/// A superblock may declare billions of fragments and xattr ids that no inode uses:
/// tables are read entry by entry, as inodes need them, so such an image converts in
/// the memory its used entries take. Here both tables claim 2^28 entries (4 GiB of
/// entries each, behind a 4 MiB index of pointers at one real block), and the build
/// runs with 2 GiB of address space: reading a table whole aborts on allocation.
#[test]
fn huge_declared_tables_cost_only_the_entries_used() {
    let d = scratch("sqfs-tables");
    let src = sqfs(d.path(), "zstd");
    let plain = d.path().join("plain.erofs");
    convert("build", &src, &plain, &["-j", "1"]);
    let mut b = std::fs::read(&src).expect("read image");
    let le64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let frag_table = le64(&b, 80) as usize;
    let xattr_table = le64(&b, 56) as usize;
    assert!(
        frag_table < b.len() && xattr_table < b.len(),
        "the zstd image has fragments and xattrs"
    );
    let (frag_ptr, kv_start, xid_ptr) = (
        le64(&b, frag_table),
        le64(&b, xattr_table),
        le64(&b, xattr_table + 16),
    );
    const COUNT: u32 = 1 << 28;
    let pointers = (COUNT as usize * 16).div_ceil(8192);
    b.resize(b.len().next_multiple_of(8), 0);
    let new_frag = b.len();
    for _ in 0..pointers {
        b.extend_from_slice(&frag_ptr.to_le_bytes());
    }
    let new_xattr = b.len();
    b.extend_from_slice(&kv_start.to_le_bytes());
    b.extend_from_slice(&COUNT.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for _ in 0..pointers {
        b.extend_from_slice(&xid_ptr.to_le_bytes());
    }
    let used = b.len() as u64;
    b[16..20].copy_from_slice(&COUNT.to_le_bytes());
    b[40..48].copy_from_slice(&used.to_le_bytes());
    b[56..64].copy_from_slice(&(new_xattr as u64).to_le_bytes());
    b[80..88].copy_from_slice(&(new_frag as u64).to_le_bytes());
    let huge = d.path().join("huge-tables.sqfs");
    std::fs::write(&huge, &b).expect("write");
    let img = d.path().join("huge.erofs");
    let out = Command::new("prlimit")
        .arg("--as=2147483648")
        .arg(env!("CARGO_BIN_EXE_ferofs"))
        .args(["build", "-q", "-j", "1"])
        .arg(&huge)
        .arg(&img)
        .output()
        .expect("run prlimit ferofs");
    assert!(
        out.status.success(),
        "conversion failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&img).expect("read") == std::fs::read(&plain).expect("read"),
        "the image differs from the conversion of the unmodified SquashFS image"
    );
}

/// The blocks decompress on every worker thread into places planned by the scan: the
/// image is the same for any thread count (the golden image's files fill several
/// batches of work).
#[test]
fn conversion_is_the_same_for_any_thread_count() {
    let d = scratch("sqfs-threads");
    let src = sqfs(d.path(), "xz");
    let mut first: Option<Vec<u8>> = None;
    for j in ["1", "2", "3", "8"] {
        let img = d.path().join(format!("j{j}.erofs"));
        convert("build", &src, &img, &["-j", j, "-z", "lz4"]);
        let b = std::fs::read(&img).expect("read image");
        match &first {
            None => first = Some(b),
            Some(f) => assert!(*f == b, "-j {j} gives another image than -j 1"),
        }
    }
}

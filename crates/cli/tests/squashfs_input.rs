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

//! `ferofs build OLD.erofs NEW.erofs`: re-encoding an EROFS image. The kernel mount of
//! the re-encoded image equals the kernel mount of the original (every mkfs.erofs 1.9.3
//! golden image, and our own make-tree image with `-E smallest`), holes included (the
//! SEEK_HOLE map of every file is the same); re-encoding with the options of the source
//! build gives the same bytes as building from the directory; a corrupt source image is
//! an error naming it and leaves no output.

mod common;
use common::*;
use ferofs_testkit::{digest, golden, kernel_available, make_tree, scratch, treecmp, Mount};
use std::path::Path;
use std::process::Command;

/// Every regular file's data/hole map as the kernel reports it (SEEK_DATA/SEEK_HOLE),
/// for the files that have a hole; one line per file.
fn hole_map(dir: &Path) -> String {
    let script = r#"
import os, sys
root = sys.argv[1]
out = []
for dp, dn, fn in os.walk(root):
    for f in fn:
        p = os.path.join(dp, f)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        size = os.path.getsize(p)
        fd = os.open(p, os.O_RDONLY)
        segs, pos = [], 0
        while pos < size:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            segs.append((d, h))
            pos = h
        os.close(fd)
        if segs != [(0, size)] and size > 0:
            out.append("%s %d %s" % (os.path.relpath(p, root), size, segs))
print("\n".join(sorted(out)))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .expect("run python3");
    assert!(out.status.success(), "hole map of {}", dir.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_same_mount(name: &str, what: &str, orig: &Path, new_img: &Path, want: &(String, String)) {
    let m = Mount::erofs(new_img);
    let got = digest(m.path());
    assert_eq!(
        want.0,
        got,
        "{name} re-encoded {what}: mount differs from the original's:\n{}",
        treecmp(orig, m.path())
    );
    assert_eq!(
        want.1,
        hole_map(m.path()),
        "{name} re-encoded {what}: holes differ"
    );
}

/// Re-encode a golden image with `-z zstd -C 1048576` and with `-z none`; both mount
/// as the original does.
fn reencode_golden(name: &str) {
    if !kernel_available(name) {
        return;
    }
    let img = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
    let d = scratch("erofsin");
    let orig = Mount::erofs(&img);
    let want = (digest(orig.path()), hole_map(orig.path()));
    for (what, args) in [
        ("zstd 1M", &["-z", "zstd", "-C", "1048576"][..]),
        ("uncompressed", &["-z", "none"][..]),
    ] {
        let out = d.path().join("new.erofs");
        build(&img, &out, args);
        assert_same_mount(name, what, orig.path(), &out, &want);
    }
}

macro_rules! golden_reencode {
    ($($f:ident => $n:expr),* $(,)?) => { $( #[test] fn $f() { reencode_golden($n); } )* };
}

golden_reencode! {
    deflate_c64k_tpfd => "deflate-C64k-tpfd",
    deflate_c64k => "deflate-C64k",
    deflate => "deflate",
    libdeflate_c64k_tpfd => "libdeflate-C64k-tpfd",
    libdeflate_c64k => "libdeflate-C64k",
    libdeflate => "libdeflate",
    lz4_c64k_tpfd => "lz4-C64k-tpfd",
    lz4_c64k => "lz4-C64k",
    lz4 => "lz4",
    lz4hc_48bit_c64k => "lz4hc-48bit-C64k",
    lz4hc_c64k_tpfd => "lz4hc-C64k-tpfd",
    lz4hc_c64k => "lz4hc-C64k",
    lz4hc_all_fragments => "lz4hc-all-fragments",
    lz4hc_lzma => "lz4hc-lzma",
    lz4hc_metabox => "lz4hc-metabox",
    lz4hc_xattr_prefix_packed => "lz4hc-xattr-prefix-packed",
    lz4hc_zd => "lz4hc-zD",
    lz4hc => "lz4hc",
    lzma_c64k_tpfd => "lzma-C64k-tpfd",
    lzma_c64k => "lzma-C64k",
    lzma => "lzma",
    plain_48bit => "plain-48bit",
    plain_b1024 => "plain-b1024",
    plain_b512 => "plain-b512",
    plain_chunk64k_indexes => "plain-chunk64k-indexes",
    plain_chunk64k => "plain-chunk64k",
    plain_dot_omitted => "plain-dot-omitted",
    plain_extended => "plain-extended",
    plain_metabox => "plain-metabox",
    plain_noinline => "plain-noinline",
    plain_xattr_prefix => "plain-xattr-prefix",
    plain => "plain",
    zstd_c64k_tpfd => "zstd-C64k-tpfd",
    zstd_c64k => "zstd-C64k",
    zstd => "zstd",
}

/// The golden set is complete: a new golden image gets a test above.
#[test]
fn every_golden_image_is_listed() {
    let src = include_str!("erofs_input.rs");
    let dir = ferofs_testkit::shared_dir().join("testdata/erofs-utils-1.9.3");
    let mut missing = Vec::new();
    for e in std::fs::read_dir(&dir).expect("read golden dir") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if let Some(n) = name.strip_suffix(".erofs.zst") {
            if !src.contains(&format!("=> \"{n}\"")) {
                missing.push(n.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "golden images not re-encoded: {missing:?}"
    );
}

/// Our make-tree image (default options, with holes and every hard case) re-encoded
/// with `-E smallest` mounts as the tree; re-encoding with the options of the source
/// build gives the very bytes the directory build gave.
#[test]
fn make_tree_reencode() {
    if !kernel_available("make_tree_reencode") {
        return;
    }
    let (_fs, tree) = make_tree();
    let d = scratch("erofsin");
    let want = (digest(&tree), hole_map(&tree));
    for opts in [
        &[][..],
        &["-z", "none"][..],
        &["-E", "smallest"][..],
        &["-z", "zstd", "-C", "1048576", "-E", "dedupe"][..],
        &["-z", "lz4", "-m"][..],
        &[
            "-j",
            "1",
            "--all-root",
            "-T",
            "1234567",
            "--exclude-path",
            "data",
            "-E",
            "fragments",
        ][..],
    ] {
        let a = d.path().join("a.erofs");
        let b = d.path().join("b.erofs");
        build(&tree, &a, opts);
        build(&a, &b, opts);
        let (x, y) = (
            std::fs::read(&a).expect("read a"),
            std::fs::read(&b).expect("read b"),
        );
        assert!(
            x == y,
            "re-encoding with {opts:?} differs from the directory build"
        );
    }
    // Default build re-encoded with -E smallest: same tree, same holes.
    let a = d.path().join("a.erofs");
    let b = d.path().join("b.erofs");
    build(&tree, &a, &[]);
    build(&a, &b, &["-E", "smallest"]);
    let m = Mount::erofs(&b);
    assert_eq!(
        want.0,
        digest(m.path()),
        "-E smallest re-encode differs from the tree:\n{}",
        treecmp(&tree, m.path())
    );
    // A directory's hole map depends on the filesystem (tmpfs keeps page holes):
    // every hole the image has must be a hole of the tree's file.
    let img_holes = hole_map(m.path());
    assert!(
        !img_holes.is_empty(),
        "the re-encoded image lost every hole (tree has:\n{})",
        want.1
    );
    assert_eq!(
        img_holes,
        hole_map(Mount::erofs(&a).path()),
        "holes differ between the source image and its -E smallest re-encode"
    );
}

/// A truncated or corrupt source image: a clear error naming the image, no output.
#[test]
fn corrupt_source_image() {
    let d = scratch("erofsin");
    let src = golden("erofs-utils-1.9.3/lz4hc.erofs.zst");
    let bytes = std::fs::read(&src).expect("read golden");
    // Truncated: the data of most files is gone.
    let cut = d.path().join("cut.erofs");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write cut");
    // Corrupt: compressed data overwritten (the metadata stays valid).
    let bad = d.path().join("bad.erofs");
    let mut b = bytes.clone();
    let n = b.len();
    for x in &mut b[8192..n / 3] {
        *x = 0x5a;
    }
    std::fs::write(&bad, &b).expect("write bad");
    for input in [&cut, &bad] {
        let out = d.path().join("out.erofs");
        let r = run(&[&"build", &"-q", &"-z", &"zstd", input, &out]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{}: build succeeded", input.display());
        assert!(
            err.contains(&*input.to_string_lossy()),
            "error does not name the source image: {err}"
        );
        assert!(!out.exists(), "a failed build left {}", out.display());
        let left: Vec<_> = std::fs::read_dir(d.path())
            .expect("list scratch")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "cut.erofs" && n != "bad.erofs")
            .collect();
        assert!(left.is_empty(), "a failed build left {left:?}");
    }
}

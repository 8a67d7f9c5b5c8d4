//! `--chunksize`: uncompressed images whose files are chunk-based, with identical
//! chunks stored once, chunks of zeros as holes, and contiguous runs merged. The kernel
//! mount, fsck.erofs, `check` and `extract` must all see the source tree.

mod common;
use common::*;
use ferofs_testkit::{kernel_available, make_tree, noise};
use std::path::Path;

/// Files whose chunks repeat (`noise` seeds differ in more than bit 0: it sets it): a copy, a copy with a changed middle, zeros, data around
/// zeros, and small files.
fn chunky(dir: &Path) -> Vec<u8> {
    std::fs::create_dir_all(dir).expect("mkdir");
    let r1 = noise((1 << 20) + 123, 1);
    let mut r3 = r1.clone();
    r3[256 << 10..320 << 10].copy_from_slice(&noise(64 << 10, 10));
    let mut mixed = noise(64 << 10, 20);
    mixed.extend(std::iter::repeat_n(0u8, 128 << 10));
    mixed.extend(noise(5000, 30));
    for (name, data) in [
        ("r1", &r1[..]),
        ("r2", &r1[..]),
        ("r3", &r3[..]),
        ("zeros", &[0u8; 300_000][..]),
        ("mixed", &mixed[..]),
        ("small", b"hi\n"),
        ("empty", b""),
    ] {
        std::fs::write(dir.join(name), data).expect("write");
    }
    r1
}

fn extents(img: &Path, path: &str) -> Vec<serde_json::Value> {
    let st = json(&ok(&[&"stat", &"--json", &img, &path]));
    st["extents"].as_array().expect("extents").clone()
}

fn layout(img: &Path, path: &str) -> String {
    let st = json(&ok(&[&"stat", &"--json", &img, &path]));
    st["layout"].as_str().expect("layout").to_string()
}

fn physical(e: &serde_json::Value) -> u64 {
    e["physical"].as_u64().expect("physical")
}

/// The chunk format (`i_u` low 16 bits) of the inode at `path`.
fn chunk_format(img: &Path, path: &str) -> u16 {
    let st = json(&ok(&[&"stat", &"--json", &img, &path]));
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    let bs = info["block_size"].as_u64().expect("bs");
    let meta = info["meta_blkaddr"].as_u64().expect("meta");
    let nid = st["nid"].as_u64().expect("nid");
    let bytes = std::fs::read(img).expect("read");
    let at = (meta * bs + nid * 32 + 16) as usize;
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

#[test]
fn chunk_based_images_hold_the_tree_and_store_each_chunk_once() {
    if !kernel_available("chunk_based_images_hold_the_tree_and_store_each_chunk_once") {
        return;
    }
    let (fs, tree) = make_tree();
    chunky(&tree.join("chunky"));
    let x = fs.path().join("x");
    let plain = fs.path().join("plain.erofs");
    build(&tree, &plain, &["-z", "none"]);
    let plain_len = std::fs::metadata(&plain).expect("stat").len();
    for (bs, cs) in [
        (4096u32, 4096u32),
        (4096, 65536),
        (1024, 2048),
        (4096, 1 << 20),
    ] {
        let img = fs.path().join(format!("c{bs}-{cs}.erofs"));
        let (b, c) = (bs.to_string(), cs.to_string());
        build(&tree, &img, &["-z", "none", "-b", &b, "--chunksize", &c]);
        let what = format!("-b {bs} --chunksize {cs}");
        assert_image_holds(&img, &tree, &x, &what);
        // r1, the first of its kind, lies in one piece: flat, its tail inline.
        assert_eq!(layout(&img, "/chunky/r1"), "flat-inline", "{what}");
        assert_eq!(layout(&img, "/chunky/small"), "flat-inline", "{what}");
        let e1 = extents(&img, "/chunky/r1");
        let p1 = physical(&e1[0]);
        // The copy points at the original's blocks (its tail, which r1 keeps inline,
        // is stored behind them).
        assert_eq!(layout(&img, "/chunky/r2"), "chunk-based", "{what}");
        let e2 = extents(&img, "/chunky/r2");
        assert_eq!(physical(&e2[0]), p1, "{what}: {e2:?}");
        // Zeros are a hole.
        let z = extents(&img, "/chunky/zeros");
        assert!(z.iter().all(|e| e["kind"] == "hole"), "{what}: {z:?}");
        if cs <= 65536 {
            // r3 shares all but its changed 64 KiB with r1 and r2 (its tail is r2's,
            // stored right behind r1's blocks).
            let e3 = extents(&img, "/chunky/r3");
            assert_eq!(e3.len(), 3, "{what}: {e3:?}");
            assert_eq!(physical(&e3[0]), p1, "{what}");
            assert_eq!(e3[0]["length"].as_u64(), Some(256 << 10), "{what}");
            let l2 = e3[2]["logical"].as_u64().expect("l");
            assert_eq!(l2, 320 << 10, "{what}");
            assert_eq!(physical(&e3[2]), p1 + l2, "{what}");
            assert_eq!(
                e3[2]["length"].as_u64(),
                Some((1 << 20) + 123 - l2),
                "{what}"
            );
            // The zeros inside `mixed` take no blocks.
            let m = extents(&img, "/chunky/mixed");
            assert!(m.iter().any(|e| e["kind"] == "hole"), "{what}: {m:?}");
        }
        // Smaller than the image without chunks by at least the copy and the zeros.
        let len = std::fs::metadata(&img).expect("stat").len();
        if bs == 4096 {
            assert!(
                len + (1 << 20) + 290_000 <= plain_len,
                "{what}: {len} against {plain_len} without chunks"
            );
        }
        // The 4-byte block map (format = chunk bits only).
        let f = chunk_format(&img, "/chunky/r2");
        assert_eq!(f & !0x1f, 0, "{what}: format {f:#x}");
    }
    // 8-byte chunk indexes: the same tree through every reader.
    let img = fs.path().join("indexes.erofs");
    build(
        &tree,
        &img,
        &[
            "-z",
            "none",
            "--chunksize",
            "4096",
            "-E",
            "force-chunk-indexes",
        ],
    );
    assert_image_holds(&img, &tree, &x, "force-chunk-indexes");
    let f = chunk_format(&img, "/chunky/r2");
    assert_eq!(f & !0x1f, 0x20, "indexes: format {f:#x}");
    assert_eq!(
        physical(&extents(&img, "/chunky/r1")[0]),
        physical(&extents(&img, "/chunky/r2")[0])
    );
}

#[test]
fn chunk_dedupe_is_reproducible_and_can_be_turned_off() {
    let fs = ferofs_testkit::scratch("chunk-dedupe");
    let tree = fs.path().join("tree");
    chunky(&tree);
    let mut images = Vec::new();
    for j in ["1", "2", "3", "8"] {
        let img = fs.path().join(format!("j{j}.erofs"));
        build(&tree, &img, &["-z", "none", "--chunksize", "8192", "-j", j]);
        images.push(std::fs::read(&img).expect("read"));
    }
    assert!(
        images.windows(2).all(|w| w[0] == w[1]),
        "-j changes the image"
    );
    let img = fs.path().join("nodedupe.erofs");
    build(
        &tree,
        &img,
        &["-z", "none", "--chunksize", "8192", "-E", "^dedupe"],
    );
    assert_ne!(
        physical(&extents(&img, "/r1")[0]),
        physical(&extents(&img, "/r2")[0])
    );
    ok(&[&"check", &img]);
    // The summary counts what the shared chunks saved.
    let img = fs.path().join("report.erofs");
    let s = json(&ok(&[
        &"build",
        &"--json",
        &"-z",
        &"none",
        &"--chunksize",
        &"4096",
        &tree,
        &img,
    ]));
    let saved = s["dedupe_saved"].as_u64().expect("dedupe_saved");
    // r2 whole, and r3 but its changed 64 KiB (and the chunk where r1 ends).
    assert!(saved >= (2 << 20) - (72 << 10), "{s}");
}

#[test]
fn chunksize_and_inode_versions_are_checked() {
    let fs = ferofs_testkit::scratch("chunk-options");
    let tree = fs.path().join("tree");
    std::fs::create_dir_all(&tree).expect("mkdir");
    std::fs::write(tree.join("f"), b"x").expect("write");
    let img = fs.path().join("o.erofs");
    for (args, what) in [
        (&["-z", "none", "--chunksize", "3000"][..], "power of two"),
        (&["-z", "none", "--chunksize", "2048"][..], "power of two"),
        (&["-z", "lz4", "--chunksize", "4096"][..], "uncompressed"),
        (
            &["-z", "none", "-E", "force-chunk-indexes"][..],
            "--chunksize",
        ),
    ] {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"build"];
        a.extend(args.iter().map(|s| s as &dyn AsRef<std::ffi::OsStr>));
        a.push(&tree);
        a.push(&img);
        let out = run(&a);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(what), "{args:?}: {err}");
        assert!(!img.exists());
    }
    // Inode versions: every inode compact or extended, as asked.
    for (e, want) in [
        ("force-inode-compact", "compact"),
        ("force-inode-extended", "extended"),
    ] {
        build(&tree, &img, &["-E", e]);
        for p in ["/", "/f"] {
            let st = json(&ok(&[&"stat", &"--json", &img, &p]));
            assert_eq!(st["inode_format"], want, "{e} {p}");
        }
        ok(&[&"check", &img]);
    }
    // A file a compact inode cannot describe is an error naming it.
    use std::os::unix::fs::chown;
    chown(tree.join("f"), Some(70_000), None).expect("chown");
    let out = run(&[&"build", &"-E", &"force-inode-compact", &tree, &img]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("f: cannot be stored in a compact inode"),
        "{err}"
    );
    // No superblock checksum: the feature bit is off and every reader still reads it.
    build(&tree, &img, &["-E", "nosbcrc"]);
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert!(
        !info["feature_compat"].to_string().contains("sb_csum"),
        "{info}"
    );
    ok(&[&"check", &img]);
    ferofs_testkit::fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs: {e}"));
}

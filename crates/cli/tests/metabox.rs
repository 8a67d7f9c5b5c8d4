//! `-m` (metabox, Linux 6.17+) through the kernel: every algorithm at 4 KiB and 1 MiB
//! pclusters, with and without ztailpacking, builds the make-tree tree with its inodes
//! in the metabox; the kernel mount equals the tree, `ferofs check` passes, `ferofs
//! extract` gives the tree back, and an fsck.erofs that knows metabox images (1.9+)
//! passes. (Seeded random trees: `random_trees.rs`.)

mod common;
use common::*;
use ferofs_testkit::*;
use std::io::Read;
use std::path::Path;

const IN_METABOX: u64 = 1 << 63;

/// The superblock says metabox: one extension slot, 48-bit and metabox incompat bits,
/// the root's 64-bit nid in the metabox and the metabox inode's nid outside it.
/// Returns the metabox nid.
fn assert_metabox_superblock(img: &Path) -> u64 {
    let mut b = [0u8; 1024 + 144];
    std::fs::File::open(img)
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read superblock");
    let sb = &b[1024..];
    let u64_at = |o: usize| u64::from_le_bytes(sb[o..o + 8].try_into().expect("8 bytes"));
    assert_eq!(sb[0x0D], 1, "sb_extslots");
    let incompat = u32::from_le_bytes(sb[0x50..0x54].try_into().expect("4 bytes"));
    assert_eq!(incompat & 0x180, 0x180, "48bit and metabox: {incompat:#x}");
    assert_eq!(&sb[0x0E..0x10], &[0, 0], "blocks_hi");
    assert_eq!(u64_at(0x70), IN_METABOX, "rootnid_8b");
    let mb = u64_at(0x80);
    assert!(mb != 0 && mb & IN_METABOX == 0, "metabox_nid {mb:#x}");
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(info["root_nid"].as_u64(), Some(IN_METABOX));
    assert_eq!(info["metabox_nid"].as_u64(), Some(mb));
    assert_eq!(info["sb_size"].as_u64(), Some(144));
    mb
}

/// Every inode the root directory names lives in the metabox.
fn assert_inodes_in_metabox(img: &Path) {
    let st = json(&ok(&[&"stat", &"--json", &img, &"/"]));
    assert_eq!(st["nid"].as_u64(), Some(IN_METABOX), "{st}");
    let ls = json(&ok(&[&"ls", &"--json", &img, &"/"]));
    let entries = ls.as_array().expect("ls --json is an array");
    assert!(entries.len() >= 10, "{ls}");
    for e in entries {
        let nid = e["nid"].as_u64().unwrap_or(0);
        assert!(nid & IN_METABOX != 0, "{e}");
    }
}

fn matrix(alg: &str) {
    if !kernel_available(&format!("metabox_{alg}")) {
        return;
    }
    let (fs, tree) = make_tree();
    for c in ["4096", "1048576"] {
        for tail in [false, true] {
            let img = fs.path().join(format!("{alg}-{c}-{tail}.erofs"));
            let mut args = vec!["-z", alg, "-C", c, "-m"];
            if tail {
                args.extend(["-E", "ztailpacking"]);
            }
            let what = format!("{args:?}");
            build(&tree, &img, &args);
            assert_metabox_superblock(&img);
            assert_inodes_in_metabox(&img);
            assert_image_holds(&img, &tree, &fs.path().join("x"), &what);
            std::fs::remove_file(&img).expect("rm");
        }
    }
}

#[test]
fn metabox_lz4hc() {
    matrix("lz4hc");
}
#[test]
fn metabox_lzma() {
    matrix("lzma");
}
#[test]
fn metabox_deflate() {
    matrix("deflate");
}
#[test]
fn metabox_zstd() {
    matrix("zstd");
}

/// On the make-tree tree (many small files and directories) the metabox makes the
/// image smaller; without compression (`-z none -m`) it is still a valid image, and
/// `-m=BYTES` sets the metabox pcluster size.
#[test]
fn metabox_saves_space_and_variants_mount() {
    if !kernel_available("metabox_saves_space_and_variants_mount") {
        return;
    }
    let (fs, tree) = make_tree();
    let size = |args: &[&str]| -> u64 {
        let img = fs.path().join("s.erofs");
        build(&tree, &img, args);
        let n = std::fs::metadata(&img).expect("stat").len();
        std::fs::remove_file(&img).expect("rm");
        n
    };
    let plain = size(&["-z", "lz4hc", "-T", "0"]);
    let boxed = size(&["-z", "lz4hc", "-T", "0", "-m"]);
    assert!(boxed < plain, "-m {boxed} bytes, without {plain}");
    for args in [
        &["-z", "none", "-m"][..],
        &["-z", "zstd", "-C", "131072", "-m=4096"][..],
        &[
            "-z",
            "lzma",
            "-C",
            "65536",
            "-E",
            "ztailpacking",
            "--metabox=1048576",
        ][..],
        &["-b", "1024", "-z", "deflate", "-C", "8192", "-m"][..],
    ] {
        let img = fs.path().join("v.erofs");
        build(&tree, &img, args);
        assert_metabox_superblock(&img);
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
        fsck_metabox(&img, &format!("{args:?}"));
        std::fs::remove_file(&img).expect("rm");
    }
    // A metabox pcluster size needs compression, and a multiple of the block size.
    for bad in [&["-z", "none", "-m=4096"][..], &["-m=6000"][..]] {
        let mut c = ferofs();
        c.arg("build")
            .args(bad)
            .arg(&tree)
            .arg(fs.path().join("bad.erofs"));
        let out = c.output().expect("run ferofs");
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}

/// Files with one xattr they share (more than two carry it: a shared entry) and one of
/// their own (inline), in a metabox image with small blocks. Linux 6.17-6.18 read the
/// shared entries of such an inode through the page its inline entries left in the
/// buffer, a metabox page, when the two page numbers meet: the kernel lost
/// `user.common` from every file until ferofs kept such an inode's xattrs all inline.
/// Without `-m` the entry stays shared (the id is in the inode).
#[test]
fn metabox_inline_and_shared_xattrs_read_back_through_the_kernel() {
    if !kernel_available("metabox_inline_and_shared_xattrs_read_back_through_the_kernel") {
        return;
    }
    let fs = Tmpfs::new("64m");
    let tree = fs.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    for i in 0..6 {
        let f = tree.join(format!("f{i}"));
        std::fs::write(&f, format!("file {i}\n")).expect("write");
        set_xattr(&f, "user.common", b"one value every file has");
        set_xattr(&f, &format!("user.own{i}"), format!("value {i}").as_bytes());
    }
    // One file with the shared entry only (it stays shared: nothing inline before it).
    let f = tree.join("only-shared");
    std::fs::write(&f, b"x").expect("write");
    set_xattr(&f, "user.common", b"one value every file has");
    for bs in ["512", "1024", "4096"] {
        let img = fs.path().join(format!("x{bs}.erofs"));
        build(&tree, &img, &["-b", bs, "-z", "lz4hc", "-m"]);
        assert_image_holds(&img, &tree, &fs.path().join("x"), &format!("-b {bs} -m"));
        // Which inodes keep a shared id (`stat --json` lists them).
        let st = json(&ok(&[&"stat", &"--json", &img, &"/f0"]));
        assert_eq!(
            st["xattr_shared_ids"],
            serde_json::json!([]),
            "-b {bs}: {st}"
        );
        assert_eq!(
            st["xattrs"].as_array().map(Vec::len),
            Some(2),
            "-b {bs}: {st}"
        );
        let report = json(&ok(&[&"check", &"--json", &img]));
        assert_eq!(
            report["summary"]["metabox_mixed_xattrs"].as_u64(),
            Some(0),
            "{report}"
        );
        let st = json(&ok(&[&"stat", &"--json", &img, &"/only-shared"]));
        assert_eq!(
            st["xattr_shared_ids"],
            serde_json::json!([0]),
            "-b {bs}: {st}"
        );
        std::fs::remove_file(&img).expect("rm");
    }
    // `check` points such inodes out in images mkfs.erofs made (one here: /a.txt).
    let mkfs_img = workspace_root()
        .join("crates/reader/tests/data/mkfs-lzma-metabox-inline-and-shared-xattrs.erofs");
    let report = json(&ok(&[&"check", &"--json", &mkfs_img]));
    assert_eq!(
        report["summary"]["metabox_mixed_xattrs"].as_u64(),
        Some(1),
        "{report}"
    );
    let text = ok(&[&"check", &mkfs_img]);
    assert!(
        text.starts_with("note: 1 inode in the metabox has inline and shared xattrs"),
        "{text}"
    );
    let img = fs.path().join("plain.erofs");
    build(&tree, &img, &["-b", "1024", "-z", "lz4hc"]);
    let st = json(&ok(&[&"stat", &"--json", &img, &"/f0"]));
    assert_eq!(st["xattr_shared_ids"], serde_json::json!([0]), "{st}");
}

/// `-m=BYTES:ALG`: the metabox compressed with another algorithm than the data (an
/// index into the -z list, or a new one added to the image's list); the kernel reads it.
#[test]
fn metabox_with_its_own_algorithm() {
    if !kernel_available("metabox_with_its_own_algorithm") {
        return;
    }
    let (fs, tree) = make_tree();
    let img = |name: &str, args: &[&str]| {
        let p = fs.path().join(name);
        build(&tree, &p, args);
        p
    };
    let base = ["-z", "lzma", "-C", "65536"];
    let with = |m: &'static str| [&base[..], &[m]].concat();
    let own = img("own.erofs", &with("-m=4096"));
    let zero = img("zero.erofs", &with("-m=4096:0"));
    let lz4 = img("lz4.erofs", &with("-m=4096:lz4"));
    // Index 0 is the default: the same bytes.
    assert_eq!(
        std::fs::read(&own).expect("read"),
        std::fs::read(&zero).expect("read")
    );
    // LZ4 joins the image's algorithms and the metabox compresses less than LZMA's.
    let info = json(&ok(&[&"inspect", &"--json", &lz4]));
    assert_eq!(
        info["compression_algorithms"],
        serde_json::json!(["lz4", "lzma"]),
        "{info}"
    );
    let len = |p: &Path| std::fs::metadata(p).expect("stat").len();
    assert!(len(&lz4) > len(&own), "{} vs {}", len(&lz4), len(&own));
    // An index into a list of two.
    let two = img("two.erofs", &["-z", "lzma:lz4", "-C", "65536", "-m=4096:1"]);
    for p in [&lz4, &two] {
        assert_metabox_superblock(p);
        {
            let m = Mount::erofs(p);
            assert_same_tree(&tree, m.path());
        }
        fsck_metabox(p, &p.display().to_string());
        ok(&[&"check", &p]);
    }
    // An index past the list, or an algorithm without compression, is refused.
    for bad in [&with("-m=4096:1")[..], &["-z", "none", "-m=4096:lz4"][..]] {
        let out = ferofs()
            .arg("build")
            .arg("-q")
            .args(bad)
            .arg(&tree)
            .arg(fs.path().join("bad.erofs"))
            .output()
            .expect("run ferofs");
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}

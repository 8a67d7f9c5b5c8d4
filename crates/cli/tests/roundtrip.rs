//! The builder's ultimate test: the Linux kernel mounts what we write and shows exactly
//! the source tree (make-tree.py's digest covers every path, type, mode, owner, mtime to
//! the nanosecond, size, content, symlink target, device number, xattr incl. ACLs and
//! hardlink group). fsck.erofs must pass, and `ferofs extract` must give the same tree.

mod common;
use common::*;
use ferofs_testkit::{
    assert_same_tree, fsck_erofs, fsck_erofs_if_supported, kernel_available, make_tree,
    noise_bits24, Mount, Tmpfs,
};
use std::process::Command;

#[test]
fn make_tree_kernel_fsck_extract() {
    if !kernel_available("make_tree_kernel_fsck_extract") {
        return;
    }
    let (fs, tree) = make_tree();
    let img = fs.path().join("tree.erofs");
    build(&tree, &img, &[]);
    {
        let m = Mount::erofs(&img);
        assert_same_tree(&tree, m.path());
    }
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs failed:\n{e}"));
    let x = fs.path().join("extracted");
    ok(&[&"extract", &img, &x]);
    assert_same_tree(&tree, &x);
    // Sparse files stay sparse: only the data extents are allocated.
    for (f, most) in [
        ("data/sparse-100MiB.img", 1u64 << 20),
        ("data/sparse-hole-only.img", 0),
        ("data/sparse-tail-hole.img", 128 << 10),
    ] {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(x.join(f)).expect("stat");
        assert!(
            md.blocks() * 512 <= most,
            "{f}: {} bytes allocated",
            md.blocks() * 512
        );
    }
    let out = ok(&[&"check", &img]);
    assert!(
        out.starts_with("clean: 0 problems; 128 directories, 3240 entries, ")
            && out.contains(" 122954063 bytes of data read"),
        "{out}"
    );
    // No xattr the source lacks (mkfs.erofs adds trusted.overlay.origin; we must not).
    assert!(xattr::get(x.join("overlay"), "trusted.overlay.origin")
        .expect("getxattr")
        .is_none());
}

#[test]
fn every_block_size_mounts() {
    if !kernel_available("every_block_size_mounts") {
        return;
    }
    let (fs, tree) = make_tree();
    for bs in ["512", "1024", "2048"] {
        let img = fs.path().join(format!("b{bs}.erofs"));
        build(&tree, &img, &["-b", bs]);
        let m = Mount::erofs(&img);
        assert_same_tree(&tree, m.path());
        drop(m);
        fsck_erofs_if_supported(&img, bs.parse().expect("num"))
            .unwrap_or_else(|e| panic!("fsck.erofs -b {bs} failed:\n{e}"));
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        assert_eq!(info["block_size"], bs.parse::<u64>().expect("num"));
        std::fs::remove_file(&img).expect("rm");
    }
}

#[test]
fn reproducible_for_any_thread_count() {
    let (fs, tree) = make_tree();
    let a = fs.path().join("a.erofs");
    let b = fs.path().join("b.erofs");
    let c = fs.path().join("c.erofs");
    build(&tree, &a, &["-j", "1"]);
    build(&tree, &b, &["-j", "2"]);
    build(&tree, &c, &[]);
    let (ba, bb, bc) = (
        std::fs::read(&a).expect("a"),
        std::fs::read(&b).expect("b"),
        std::fs::read(&c).expect("c"),
    );
    assert!(ba == bb && bb == bc, "builds differ");
    // Derived UUID: non-zero, version-4 layout, and the same for the same content.
    let info = json(&ok(&[&"inspect", &"--json", &a]));
    let uuid = info["uuid"].as_str().expect("uuid").to_string();
    assert_ne!(uuid, "00000000-0000-0000-0000-000000000000");
    assert_eq!(&uuid[14..15], "4");
    // A random UUID changes only the UUID (and the checksum).
    let r = fs.path().join("r.erofs");
    build(&tree, &r, &["--uuid", "random"]);
    let br = std::fs::read(&r).expect("r");
    let diff: Vec<usize> = (0..ba.len()).filter(|&i| ba[i] != br[i]).collect();
    assert!(
        diff.iter()
            .all(|&i| (1028..1032).contains(&i) || (1072..1088).contains(&i)),
        "random uuid changed other bytes: {:?}",
        &diff[..diff.len().min(10)]
    );
}

/// A small tree with the cases the options touch.
fn small_tree(root: &std::path::Path) {
    let sh = format!(
        r#"set -e
cd {root}
mkdir -p a/b keep skip
printf 'hello\n' > a/hello.txt
printf 'data' > a/b/file.bin
printf 'x' > keep/one.txt
printf 'y' > skip/two
ln -s a/hello.txt link
chown 1234:5678 a/hello.txt
chown -h 4000000000:4000000001 link
touch -h -d @4102444800 link
touch -d @1600000000.123456789 a/hello.txt
touch -d @1500000000 a/b/file.bin keep/one.txt skip/two
touch -d @1500000000 a/b a keep skip .
"#,
        root = root.display()
    );
    ferofs_testkit::run(Command::new("sh").arg("-c").arg(sh));
}

#[test]
fn options_behave() {
    if !kernel_available("options_behave") {
        return;
    }
    let fs = Tmpfs::new("64M");
    let src = fs.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    small_tree(&src);
    let img = fs.path().join("o.erofs");

    // -T: build time and every mtime; every inode fits a compact inode except big ids.
    build(
        &src,
        &img,
        &[
            "-T",
            "1234567890",
            "-L",
            "demo-label",
            "-U",
            "01234567-89ab-cdef-0123-456789abcdef",
        ],
    );
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(info["build_time"], 1234567890);
    assert_eq!(info["label"], "demo-label");
    assert_eq!(info["uuid"], "01234567-89ab-cdef-0123-456789abcdef");
    assert_eq!(
        info["counts"]["extended_inodes"], 1,
        "only the symlink with 32-bit ids needs 64 bytes"
    );
    {
        let m = Mount::erofs(&img);
        for p in ["a/hello.txt", "a/b/file.bin", "link", "a", "."] {
            let md = std::fs::symlink_metadata(m.path().join(p)).expect("stat");
            use std::os::unix::fs::MetadataExt;
            assert_eq!((md.mtime(), md.mtime_nsec()), (1234567890, 0), "{p}");
        }
    }

    // --all-root, --force-uid/--force-gid.
    build(&src, &img, &["--all-root"]);
    {
        let m = Mount::erofs(&img);
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(m.path().join("link")).expect("stat");
        assert_eq!((md.uid(), md.gid()), (0, 0));
    }
    build(
        &src,
        &img,
        &["--force-uid", "77", "--force-gid", "4000000002"],
    );
    {
        let m = Mount::erofs(&img);
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(m.path().join("a/hello.txt")).expect("stat");
        assert_eq!((md.uid(), md.gid()), (77, 4000000002));
    }

    // Exclusions: a path (with its subtree) and a regex.
    build(
        &src,
        &img,
        &["--exclude-path", "skip", "--exclude-regex", r"\.txt$"],
    );
    {
        let m = Mount::erofs(&img);
        assert!(!m.path().join("skip").exists());
        assert!(!m.path().join("a/hello.txt").exists());
        assert!(!m.path().join("keep/one.txt").exists());
        assert!(m.path().join("a/b/file.bin").exists());
        assert!(m.path().join("keep").is_dir());
    }

    // SOURCE_DATE_EPOCH: build time, newer mtimes clamped, older kept to the ns.
    let out = ferofs()
        .env("SOURCE_DATE_EPOCH", "1550000000")
        .args(["build", "-q"])
        .arg(&src)
        .arg(&img)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(info["build_time"], 1550000000);
    {
        let m = Mount::erofs(&img);
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(m.path().join("a/hello.txt")).expect("stat");
        assert_eq!((md.mtime(), md.mtime_nsec()), (1550000000, 0), "clamped");
        let md = std::fs::symlink_metadata(m.path().join("link")).expect("stat");
        assert_eq!(md.mtime(), 1550000000, "clamped");
        let md = std::fs::symlink_metadata(m.path().join("a/b/file.bin")).expect("stat");
        assert_eq!(md.mtime(), 1500000000, "older mtimes are kept");
    }

    // --ignore-mtime: every inode shows the build time (newest mtime: 2100-01-01).
    build(&src, &img, &["--ignore-mtime"]);
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(info["build_time"], 4102444800i64);
    {
        let m = Mount::erofs(&img);
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::symlink_metadata(m.path().join("a/hello.txt")).expect("stat");
        assert_eq!(md.mtime(), 4102444800);
    }
    // -E noinline_data: file tails get their own blocks, the tree is the same.
    build(&src, &img, &["-E", "noinline_data"]);
    let st = json(&ok(&[&"stat", &"--json", &img, &"/a/hello.txt"]));
    assert_eq!(st["layout"], "flat-plain");
    let m = Mount::erofs(&img);
    assert_same_tree(&src, m.path());
}

#[test]
fn bad_options_are_refused() {
    let fs = ferofs_testkit::scratch("badopt");
    let img = fs.path().join("x.erofs");
    for args in [
        vec!["-b", "8192"],
        vec!["-b", "1000"],
        vec!["-L", "a-label-longer-than-15"],
        vec!["-U", "not-a-uuid"],
        vec!["-E", "bogus"],
    ] {
        let mut c = ferofs();
        c.arg("build").args(&args).arg(fs.path()).arg(&img);
        let out = c.output().expect("run");
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(!img.exists(), "{args:?} left an output");
    }
}

#[test]
fn failed_build_leaves_no_output() {
    if !kernel_available("failed_build_leaves_no_output") {
        return;
    }
    // Output on a 1 MiB tmpfs, source with 4 MiB of data: the write fails (ENOSPC).
    let small = Tmpfs::new("1M");
    let src_fs = Tmpfs::new("16M");
    // Incompressible (xorshift), so the default compressed build cannot shrink it.
    let data = noise_bits24(4 << 20, 0x9e37_79b9_7f4a_7c15);
    std::fs::write(src_fs.path().join("big"), data).expect("write");
    let img = small.path().join("out.erofs");
    let out = ferofs()
        .arg("build")
        .arg(src_fs.path())
        .arg(&img)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("out.erofs"),
        "error should name the output: {err}"
    );
    assert_eq!(
        std::fs::read_dir(small.path()).expect("ls").count(),
        0,
        "temp file left behind"
    );
    // A source that does not exist: error names it, nothing written.
    let missing = src_fs.path().join("nope");
    let out = ferofs()
        .arg("build")
        .arg(&missing)
        .arg(&img)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    assert!(!img.exists());
}

#[test]
fn sparse_file_over_4gib() {
    if !kernel_available("sparse_file_over_4gib") {
        return;
    }
    let fs = Tmpfs::new("64M");
    let src = fs.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(src.join("big.img")).expect("create");
        f.set_len(5 << 30).expect("truncate");
        f.write_all_at(b"start", 0).expect("w");
        f.write_all_at(b"past 4 GiB", (4 << 30) + 12345).expect("w");
        f.write_all_at(b"end", (5 << 30) - 3).expect("w");
    }
    let img = fs.path().join("s.erofs");
    build(&src, &img, &[]);
    let size = std::fs::metadata(&img).expect("stat").len();
    assert!(
        size < 1 << 20,
        "holes must not be stored: image is {size} bytes"
    );
    let st = json(&ok(&[&"stat", &"--json", &img, &"/big.img"]));
    assert_eq!(st["inode_format"], "extended");
    assert_eq!(st["layout"], "chunk-based");
    assert_eq!(st["size"], 5u64 << 30);
    let m = Mount::erofs(&img);
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(m.path().join("big.img")).expect("open");
    let mut b = [0u8; 10];
    f.read_exact_at(&mut b, (4 << 30) + 12345).expect("read");
    assert_eq!(&b, b"past 4 GiB");
    let mut e = [0u8; 3];
    f.read_exact_at(&mut e, (5 << 30) - 3).expect("read");
    assert_eq!(&e, b"end");
    f.read_exact_at(&mut b, 3 << 30).expect("read");
    assert_eq!(b, [0u8; 10]);
    drop(f);
    drop(m);
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs failed:\n{e}"));
}

/// Records without inline data may cross block boundaries (the kernel reads inodes,
/// xattrs and compressed indexes across blocks; mkfs.erofs writes them so too): the
/// builder streams them past block ends. Build a tree where that must happen (extended
/// inodes, inline xattrs of every length, compressed and plain files, inline tails),
/// check that records do cross, and that the kernel and fsck.erofs read it all.
#[test]
fn records_cross_block_boundaries() {
    if !kernel_available("records_cross_block_boundaries") {
        return;
    }
    let fs = Tmpfs::new("256M");
    let tree = fs.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    for i in 0..600u32 {
        let p = tree.join(format!("f{i:03}"));
        let body: Vec<u8> = match i % 3 {
            // Compressible: a compressed index follows the inode and xattrs.
            0 => format!("line {i} of a compressible file\n")
                .repeat(300)
                .into_bytes(),
            // Two full blocks: flat-plain, nothing inline.
            1 => vec![(i % 251) as u8; 8192],
            // A short tail: inline, so this record stays within one block.
            _ => vec![b'x'; (i as usize * 7) % 900 + 1],
        };
        std::fs::write(&p, &body).expect("write");
        let value = vec![b'v'; (i as usize * 13) % 300 + 1];
        xattr::set(&p, format!("user.k{i}"), &value).expect("setxattr");
        let uid = if i % 2 == 0 { 70_000 + i } else { i };
        std::os::unix::fs::chown(&p, Some(uid), Some(i)).expect("chown");
    }
    for opts in [&["-z", "none"][..], &["-z", "lz4hc", "-C", "4096"][..]] {
        let img = fs.path().join("cross.erofs");
        build(&tree, &img, opts);
        let image = ferofs_reader::Image::open(&img).expect("open");
        let bs = u64::from(image.block_size());
        let base = u64::from(image.superblock().meta_blkaddr) * bs;
        let (mut crossing, mut header_crossing) = (0, 0);
        image
            .walk(|_, ino| {
                let pos = base + ino.nid * 32;
                let core_end = pos + ino.meta_size;
                if (core_end - 1) / bs != pos / bs {
                    crossing += 1;
                }
                if ino.layout.is_compressed() && (core_end.div_ceil(8) * 8 + 7) / bs != pos / bs {
                    header_crossing += 1;
                }
                Ok(())
            })
            .expect("walk");
        assert!(crossing > 0, "{opts:?}: no inode + xattrs crosses a block");
        if opts.contains(&"lz4hc") {
            assert!(
                header_crossing > 0,
                "{opts:?}: no index in the block after its inode"
            );
        }
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
        fsck_erofs(&img).unwrap_or_else(|e| panic!("{opts:?}: fsck.erofs failed:\n{e}"));
        ok(&[&"check", &img]);
    }
}

/// Inline tails past an eighth of `--memory-limit` wait for the metadata stage in a
/// scratch file, not in memory: the image is the same byte for byte, and the kernel
/// reads it.
#[test]
fn inline_tails_past_the_budget_give_the_same_image() {
    let (fs, tree) = make_tree();
    // 200 files whose tails (100-3,900 bytes, 400 KB in all) go inline: more than the
    // 128 KiB a 1 MiB limit keeps in memory.
    let dir = tree.join("tails");
    std::fs::create_dir(&dir).expect("mkdir");
    for i in 0..200u64 {
        let n = 100 + (i * 379) % 3800;
        std::fs::write(
            dir.join(format!("t{i}")),
            ferofs_testkit::noise(n as usize, 2 * i + 2),
        )
        .expect("write");
    }
    for extra in [&["-z", "none"][..], &["-z", "lz4"], &["-z", "lz4hc", "-m"]] {
        let a = fs.path().join("a.erofs");
        let b = fs.path().join("b.erofs");
        build(&tree, &a, extra);
        // 1 MiB: 128 KiB of tails in memory, the make-tree tree has more.
        let mut small = extra.to_vec();
        small.extend(["--memory-limit", "1m"]);
        build(&tree, &b, &small);
        assert!(
            std::fs::read(&a).expect("read") == std::fs::read(&b).expect("read"),
            "{extra:?}: the image changed with the tails in a scratch file"
        );
        if kernel_available("inline_tails_past_the_budget_give_the_same_image") {
            let m = Mount::erofs(&b);
            assert_same_tree(&tree, m.path());
        }
    }
}

/// Rewrite make-tree's tree in place into what a compact-only image can show: ids past
/// 65535 become 65535 and every mtime becomes `argv[2]` seconds, or (argv[2] "48bit")
/// is cut to the second and clamped at 1970, or (argv[2] "ids") stays (what `-E 48bit,force-inode-compact` keeps
/// when the newest mtime is 2^32-1, as in make-tree's tree).
const COMPACT_VIEW: &str = r#"
import os, sys
root, mode = sys.argv[1], sys.argv[2]
def fix(p):
    st = os.lstat(p)
    os.lchown(p, min(st.st_uid, 65535), min(st.st_gid, 65535))
    if mode == "ids":
        return
    s = max(0, st.st_mtime_ns // 10**9) if mode == "48bit" else int(mode)
    os.utime(p, ns=(s * 10**9, s * 10**9), follow_symlinks=False)
for d, dirs, files in os.walk(root, topdown=False):
    for n in files + dirs:
        fix(os.path.join(d, n))
fix(root)
"#;

/// `-E force-inode-extended`, `-E nosbcrc` and `-E force-inode-compact` (with and
/// without the 48-bit layout) give images the kernel mounts as the tree, inode by
/// inode in the form asked.
#[test]
fn inode_forms_and_nosbcrc_mount_with_the_kernel() {
    if !kernel_available("inode_forms_and_nosbcrc_mount_with_the_kernel") {
        return;
    }
    let (fs, tree) = make_tree();
    let img = fs.path().join("forms.erofs");
    let x = fs.path().join("x");
    let form = |img: &std::path::Path, p: &str| {
        json(&ok(&[&"stat", &"--json", &img, &p]))["inode_format"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let probes = [
        "/",
        "/owners",
        "/times/ns-123456789",
        "/data/sparse-100MiB.img",
    ];

    build(&tree, &img, &["-E", "force-inode-extended,nosbcrc"]);
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert!(
        !info["feature_compat"].to_string().contains("sb_csum"),
        "{info}"
    );
    assert_image_holds(&img, &tree, &x, "force-inode-extended,nosbcrc");
    for p in probes {
        assert_eq!(form(&img, p), "extended", "{p}");
    }

    // Compact in the 48-bit layout: mtimes kept to the second.
    let view = |mode: &str| {
        ferofs_testkit::run(
            Command::new("python3")
                .args(["-c", COMPACT_VIEW])
                .arg(&tree)
                .arg(mode),
        )
    };
    // Built before the mtimes are rewritten: those with nanoseconds come out cut.
    view("ids");
    build(&tree, &img, &["-E", "48bit,force-inode-compact"]);
    view("48bit");
    assert_image_holds(&img, &tree, &x, "48bit,force-inode-compact");
    for p in probes {
        assert_eq!(form(&img, p), "compact", "{p}");
    }
    // -m implies the layout: the same mtimes.
    build(&tree, &img, &["-m", "-E", "force-inode-compact"]);
    assert_image_holds(&img, &tree, &x, "-m force-inode-compact");
    assert_eq!(form(&img, "/times/ns-123456789"), "compact");
    // Outside the layout every mtime is the build time.
    build(
        &tree,
        &img,
        &["-T", "1700000000", "-E", "force-inode-compact"],
    );
    view("1700000000");
    assert_image_holds(&img, &tree, &x, "force-inode-compact");
    for p in probes {
        assert_eq!(form(&img, p), "compact", "{p}");
    }
}

/// `--root-xattr-isize`: the root's xattr area reserved to at least the size asked (its
/// own xattrs kept), zeros the kernel lists nothing for; too large is refused.
#[test]
fn root_xattr_area_reserved() {
    if !kernel_available("root_xattr_area_reserved") {
        return;
    }
    let fs = Tmpfs::new("64M");
    let tree = fs.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    small_tree(&tree);
    let img = fs.path().join("r.erofs");
    let isize = |img: &std::path::Path| {
        json(&ok(&[&"stat", &"--json", &img, &"/"]))["xattr_isize"]
            .as_u64()
            .unwrap_or(u64::MAX)
    };
    build(&tree, &img, &[]);
    assert_eq!(isize(&img), 0);
    for (asked, want) in [("100", 100), ("4096", 4096), ("10", 16)] {
        build(&tree, &img, &["--root-xattr-isize", asked]);
        assert_eq!(isize(&img), want, "{asked}");
        let m = Mount::erofs(&img);
        assert_same_tree(&tree, m.path());
        drop(m);
        fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs {asked}: {e}"));
        ok(&[&"check", &img]);
    }
    // The root's own xattrs stay, the area grows behind them.
    let out = Command::new("setfattr")
        .args(["-n", "user.root", "-v", "here"])
        .arg(&tree)
        .status()
        .expect("setfattr");
    assert!(out.success());
    build(&tree, &img, &["--root-xattr-isize", "512"]);
    assert_eq!(isize(&img), 512);
    let m = Mount::erofs(&img);
    assert_same_tree(&tree, m.path());
    drop(m);
    let out = run(&[&"build", &"--root-xattr-isize", &"70000", &tree, &img]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 65532"));
}

/// `--xattr-prefix` (mkfs.erofs's): xattrs whose names start with a long prefix store
/// only the rest (the inline area shrinks by exactly the infix), the table sits where
/// each kind of image keeps it (plain behind the superblock; in the packed inode when
/// there is one, unless `-E plain-xattr-prefixes`; plain in a metabox image), and the
/// kernel, fsck.erofs 1.9.3 and `check` read every name back.
#[test]
fn long_xattr_prefixes() {
    if !kernel_available("long_xattr_prefixes") {
        return;
    }
    let fs = Tmpfs::new("64M");
    let tree = fs.path().join("tree");
    std::fs::create_dir_all(tree.join("d")).expect("mkdir");
    for i in 0..24 {
        let f = tree.join(format!("d/f{i}"));
        std::fs::write(&f, format!("file {i} ").repeat(i + 1)).expect("write");
        set_xattr(&f, "trusted.overlay.redirect", format!("/x/{i}").as_bytes());
        set_xattr(&f, "trusted.overlay.metacopy", b"");
        set_xattr(&f, "user.abc", format!("v{i}").as_bytes());
    }
    set_xattr(&tree.join("d"), "trusted.overlay.opaque", b"y");
    set_xattr(&tree.join("d"), "user.other", b"z");
    let img = fs.path().join("x.erofs");
    let isize = |img: &std::path::Path, p: &str| {
        json(&ok(&[&"stat", &"--json", &img, &p]))["xattr_isize"]
            .as_u64()
            .unwrap_or(u64::MAX)
    };
    let pfx = [
        "--xattr-prefix",
        "trusted.overlay.",
        "--xattr-prefix",
        "user.a",
    ];
    build(&tree, &img, &[]);
    let plain_sizes = (isize(&img, "/d/f3"), isize(&img, "/d"));
    // /d/f3: header 12 + one shared id (metacopy, on every file) + "overlay.redirect"
    // (4 + 16 + 4 -> 24) + "abc" (4 + 3 + 2 -> 12); /d: 12 + "overlay.opaque"
    // (4 + 14 + 1 -> 20) + "other" (4 + 5 + 1 -> 12).
    assert_eq!(plain_sizes, (52, 44));
    // (In a metabox image an inode's xattrs are all inline or all shared: /d/f3's
    // metacopy is inline there, 4 + 8 -> 12 bytes in place of its 4-byte id.)
    for (extra, plain, f3) in [
        (&[][..], true, 40),
        (&["-z", "lz4hc", "-E", "fragments"][..], false, 40),
        (
            &["-z", "lz4hc", "-E", "fragments,plain-xattr-prefixes"][..],
            true,
            40,
        ),
        (&["-z", "zstd", "--metabox"][..], true, 48),
        (
            &["-b", "1024", "-z", "lz4", "-E", "all-fragments"][..],
            false,
            40,
        ),
    ] {
        let args = [&pfx[..], extra].concat();
        build(&tree, &img, &args);
        // "overlay." and "a" are no longer stored: redirect 4 + 8 + 4 -> 16, abc
        // 4 + 2 + 2 -> 8 (12 + 4 + 16 + 8 = 40); opaque 4 + 6 + 1 -> 12.
        assert_eq!(
            (isize(&img, "/d/f3"), isize(&img, "/d")),
            (f3, 12 + 12 + 12),
            "{args:?}"
        );
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        assert_eq!(
            info["xattr_prefixes"],
            serde_json::json!(["trusted.overlay.", "user.a"]),
            "{args:?}"
        );
        let compat = info["feature_compat"].to_string();
        assert_eq!(
            compat.contains("plain_xattr_pfx"),
            plain,
            "{args:?}: {compat}"
        );
        // The plain table is at xattr_prefix_start * 4 of the image; the packed
        // inode's start is an offset in its data (which is not there).
        let b = std::fs::read(&img).expect("read image");
        let start = u32::from_le_bytes(b[1024 + 0x5C..1024 + 0x60].try_into().expect("4")) as usize;
        let mut table = vec![9u8, 0, 4];
        table.extend_from_slice(b"overlay.\0");
        table.extend_from_slice(&[2, 0, 1, b'a']);
        assert_eq!(
            b.get(start * 4..start * 4 + 16) == Some(&table[..]),
            plain,
            "{args:?}"
        );
        assert!(info["feature_incompat"]
            .to_string()
            .contains("xattr_prefixes"));
        assert_eq!(
            info["packed_nid"].as_u64().unwrap_or(0) > 0,
            args.iter().any(|a| a.contains("fragments")),
            "{args:?}"
        );
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
        ferofs_testkit::fsck_metabox(&img, &format!("{args:?}"));
        ok(&[&"check", &img]);
    }
    // An empty prefix, or more than 128, are refused.
    let out = run(&[&"build", &"--xattr-prefix", &"", &tree, &img]);
    assert!(!out.status.success());
    let many: Vec<String> = (0..129).map(|i| format!("user.p{i}.")).collect();
    let mut cmd = ferofs();
    cmd.arg("build");
    for p in &many {
        cmd.args(["--xattr-prefix", p]);
    }
    let out = cmd.arg(&tree).arg(&img).output().expect("run ferofs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 128"));
}

/// `--xattr-inode-digest` (mkfs.erofs's): every non-empty regular file carries
/// `sha256:` and its contents' SHA-256 in the named xattr (a long prefix the superblock
/// names), hidden from listings under the default name, visible under a namespaced one;
/// `stat` shows it, `check` verifies it (and reports a file whose data no longer
/// matches), the kernel and fsck.erofs read the image.
#[test]
fn inode_digest_fingerprints() {
    if !kernel_available("inode_digest_fingerprints") {
        return;
    }
    let fs = Tmpfs::new("64M");
    let tree = fs.path().join("tree");
    std::fs::create_dir_all(tree.join("d")).expect("mkdir");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(tree.join("big"), &big).expect("write");
    std::fs::write(tree.join("d/small"), b"small file\n").expect("write");
    std::fs::write(tree.join("d/empty"), b"").expect("write");
    std::fs::hard_link(tree.join("d/small"), tree.join("link")).expect("link");
    std::os::unix::fs::symlink("big", tree.join("sym")).expect("symlink");
    let sha = |p: &str| -> String {
        let out = Command::new("sha256sum")
            .arg(tree.join(p))
            .output()
            .expect("sha256sum");
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        format!("sha256:{}", s.split_whitespace().next().unwrap_or(""))
    };
    let img = fs.path().join("x.erofs");
    let fp = |img: &std::path::Path, p: &str| -> serde_json::Value {
        json(&ok(&[&"stat", &"--json", &img, &p]))["fingerprint"].clone()
    };
    for (extra, name) in [
        (&["--xattr-inode-digest"][..], "erofs.fingerprint.v1"),
        (
            &["-z", "lz4hc", "-E", "fragments", "--xattr-inode-digest"][..],
            "erofs.fingerprint.v1",
        ),
        (
            &[
                "--xattr-prefix",
                "trusted.",
                "--xattr-inode-digest=trusted.fp",
            ][..],
            "trusted.fp",
        ),
        (
            &["-z", "zstd", "--metabox", "--xattr-inode-digest=user.fp"][..],
            "user.fp",
        ),
    ] {
        build(&tree, &img, extra);
        for p in ["big", "d/small", "link"] {
            assert_eq!(fp(&img, &format!("/{p}")), sha(p), "{extra:?} {p}");
        }
        assert_eq!(fp(&img, "/d/empty"), serde_json::Value::Null, "{extra:?}");
        assert_eq!(fp(&img, "/sym"), serde_json::Value::Null, "{extra:?}");
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        assert!(
            info["feature_compat"].to_string().contains("ishare_xattrs"),
            "{extra:?}: {info}"
        );
        let prefixes = info["xattr_prefixes"].to_string();
        assert!(
            prefixes.contains(&format!("\"{name}\"")),
            "{extra:?}: {prefixes}"
        );
        ok(&[&"check", &img]);
        ferofs_testkit::fsck_metabox(&img, &format!("{extra:?}"));
        let m = Mount::erofs(&img);
        if name.starts_with("erofs.") {
            // No namespace: the kernel lists no such xattr.
            assert_same_tree(&tree, m.path());
        } else {
            let v = xattr::get(m.path().join("big"), name)
                .expect("getxattr")
                .expect("fingerprint xattr");
            let want = sha("big");
            assert_eq!(&v[..7], b"sha256:");
            assert_eq!(
                format!(
                    "sha256:{}",
                    v[7..]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                ),
                want
            );
            assert_eq!(
                xattr::get(m.path().join("d/empty"), name).expect("getxattr"),
                None
            );
        }
    }
    // Data that no longer matches its fingerprint: `check` says which file.
    build(&tree, &img, &["--xattr-inode-digest"]);
    let st = json(&ok(&[&"stat", &"--json", &img, &"/big"]));
    let at = st["extents"][0]["physical"]
        .as_u64()
        .expect("big's first block");
    let mut b = std::fs::read(&img).expect("read");
    b[at as usize + 5] ^= 0xFF;
    std::fs::write(&img, &b).expect("write");
    let out = run(&[&"check", &"--json", &img]);
    assert!(!out.status.success());
    let r = String::from_utf8_lossy(&out.stdout);
    assert!(r.contains("Fingerprint") && r.contains("/big"), "{r}");
    // Not with --tar-index (the data stays in the tar).
    let tar = fs.path().join("t.tar");
    let st = Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success());
    let ti = fs.path().join("ti.erofs");
    let out = run(&[
        &"build",
        &"--tar-index",
        &"--xattr-inode-digest",
        &"--tar",
        &tar,
        &ti,
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--xattr-inode-digest with --tar-index"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!ti.exists());
}

/// `extract --force` over a tree that is already there (a previous extraction, with
/// things planted in it): every directory is reused, every other entry replaced, and no
/// symbolic link found on the way is written through: a link where the image has a
/// file, and one where it has a directory, are replaced, their targets untouched.
/// Once, a link there took the file's data (`open` followed it), and a directory
/// already there failed the extraction ("File exists").
#[test]
fn extract_force_replaces_entries_and_never_writes_through_links() {
    let s = ferofs_testkit::scratch("extract-force");
    let d = s.path();
    let tree = d.join("tree");
    ferofs_testkit::run(Command::new("sh").arg("-c").arg(format!(
        r#"set -e
mkdir -p {t}/sub/deep {t}/dir
cd {t}
printf 'image data\n' > top
printf 'in sub\n' > sub/f
printf 'deep\n' > sub/deep/g
ln -s sub/f link
ln top hard
mkfifo pipe
chmod 0750 sub
"#,
        t = tree.display()
    )));
    let img = d.join("t.erofs");
    build(&tree, &img, &[]);
    let out = d.join("out");
    ok(&[&"extract", &img, &out]);
    assert_same_tree(&tree, &out);
    // Without --force a tree that is there is refused.
    let r = run(&[&"extract", &img, &out]);
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    assert!(String::from_utf8_lossy(&r.stderr).contains("is not empty (use --force)"));

    // Plant: links out of the tree where the image has a file and a directory, other
    // kinds where it has a link, a FIFO and a hardlink, a writable-only-by-mode dir.
    let outside = d.join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(d.join("victim"), b"precious").expect("write");
    ferofs_testkit::run(Command::new("sh").arg("-c").arg(format!(
        r#"set -e
cd {o}
rm top link pipe hard
ln -s ../victim top
ln -s ../victim hard
printf 'not a link' > link
mkdir pipe
rmdir pipe
printf 'not a pipe' > pipe
rm -r sub/deep
ln -s ../../outside sub/deep
chmod 0500 sub
printf 'kept' > extra
"#,
        o = out.display()
    )));
    ok(&[&"extract", &"--force", &img, &out]);
    assert_eq!(std::fs::read(d.join("victim")).expect("read"), b"precious");
    assert_eq!(std::fs::read_dir(&outside).expect("list").count(), 0);
    // What the image does not hold is left alone.
    std::fs::remove_file(out.join("extra")).expect("extra was kept");
    // (and the root's mtime, which removing it changed, set back)
    ferofs_testkit::run(Command::new("touch").arg("-r").arg(&tree).arg(&out));
    assert_same_tree(&tree, &out);

    // A directory where the image has a file is an error naming it, not a removal.
    std::fs::remove_file(out.join("top")).expect("rm");
    std::fs::create_dir(out.join("top")).expect("mkdir");
    std::fs::write(out.join("top/inside"), b"x").expect("write");
    let r = run(&[&"extract", &"--force", &img, &out]);
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("top"), "{err}");
    assert!(out.join("top/inside").exists());
}

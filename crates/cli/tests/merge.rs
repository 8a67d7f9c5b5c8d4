//! `ferofs build LOWER.erofs UPPER.erofs IMAGE`: EROFS layers merged as overlayfs
//! stacks them, the data copied or (`--by-reference`) left in the layers, which become
//! the image's extra devices; and mkfs.erofs's spelling of it (image sources,
//! `--clean=data`), as containerd's EROFS snapshotter runs it to merge layers.
//!
//! The layers hold every case of a merge: a file replaced, a whiteout hiding a
//! directory, an opaque directory, one name of a hardlinked pair replaced, new
//! directories, a symlink, a fifo, a file with a hole; the lower layer uncompressed
//! without inline tails (so its files are referred to), the upper one compressed (so
//! its files are copied). The expected tree is made by hand from the two; the kernel's
//! mount of each image must equal it.

mod common;
use common::*;
use ferofs_testkit::{assert_same_tree, kernel_available, noise, scratch, text_lines};
use std::path::{Path, PathBuf};
use std::process::Command;

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn put(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, data).expect("write");
}

/// chmod, chown and mtime of `from` onto `to`.
fn same_meta(from: &Path, to: &Path) {
    sh(Command::new("chmod").arg("--reference").arg(from).arg(to));
    sh(Command::new("chown")
        .arg("-h")
        .arg("--reference")
        .arg(from)
        .arg(to));
    sh(Command::new("touch").arg("-h").arg("-r").arg(from).arg(to));
}

/// The two layers' trees and the tree their stack shows (whiteout and opaque marker
/// kept, as overlayfs's lower layers hold them): (lower, upper, expected).
fn layers(t: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (l, u, e) = (t.join("lower"), t.join("upper"), t.join("expected"));
    put(&l, "etc/hostname", b"lower\n");
    put(&l, "etc/passwd", &text_lines(2000, 1));
    put(&l, "usr/bin/tool", &noise(300_000, 2));
    put(&l, "usr/lib/libx.so", &noise(20_000, 3));
    std::fs::hard_link(l.join("usr/lib/libx.so"), l.join("usr/lib/libx.so.1")).expect("link");
    put(&l, "var/cache/old", b"old");
    put(&l, "opt/gone/f", &noise(9000, 4));
    {
        let f = std::fs::File::create(l.join("sparse")).expect("create");
        f.set_len(1 << 20).expect("truncate");
        std::os::unix::fs::FileExt::write_all_at(&f, &noise(4096, 5), 512 << 10).expect("write");
    }
    std::os::unix::fs::symlink("usr/bin/tool", l.join("lnk")).expect("symlink");
    sh(Command::new("mkfifo").arg(l.join("fifo")));
    put(&u, "etc/hostname", b"upper\n");
    sh(Command::new("mknod")
        .arg(u.join("opt"))
        .args(["c", "0", "0"]));
    put(&u, "var/new", b"new");
    set_xattr(&u.join("var"), "trusted.overlay.opaque", b"y");
    put(&u, "usr/lib/libx.so.1", &noise(5000, 6));
    put(&u, "usr/share/doc/readme", &text_lines(30, 7));
    put(&u, "usr/bin/tool2", &noise(70_000, 8));
    std::fs::set_permissions(&u, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    // The stack: the lower tree, then what the upper one changes.
    sh(Command::new("cp").arg("-a").arg(&l).arg(&e));
    for gone in ["opt", "var", "etc/hostname", "usr/lib/libx.so.1"] {
        sh(Command::new("rm").arg("-rf").arg(e.join(gone)));
    }
    for new in [
        "opt",
        "var",
        "etc/hostname",
        "usr/lib/libx.so.1",
        "usr/share",
        "usr/bin/tool2",
    ] {
        sh(Command::new("cp")
            .arg("-a")
            .arg(u.join(new))
            .arg(e.join(new)));
    }
    // A directory holding a whiteout is marked for overlayfs (empty origin xattr).
    sh(Command::new("setfattr")
        .args(["-n", "trusted.overlay.origin"])
        .arg(&e));
    // Directories in both layers take the upper one's metadata.
    for d in ["etc", "usr/bin", "usr/lib", "usr", ""] {
        same_meta(&u.join(d), &e.join(d));
    }
    (l, u, e)
}

/// Mount `img` with `devices` as its extra devices (loop devices, read-only), run `f`
/// on the mount point.
fn with_kernel_mount(img: &Path, devices: &[&Path], f: impl FnOnce(&Path)) {
    let loops: Vec<String> = devices
        .iter()
        .map(|d| {
            ferofs_testkit::run(Command::new("losetup").args(["-f", "--show", "-r"]).arg(d))
                .trim()
                .to_string()
        })
        .collect();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let m = scratch("merge-mnt");
        let opts: String = std::iter::once("ro,loop".to_string())
            .chain(loops.iter().map(|l| format!("device={l}")))
            .collect::<Vec<_>>()
            .join(",");
        ferofs_testkit::run(
            Command::new("mount")
                .args(["-t", "erofs", "-o", &opts])
                .arg(img)
                .arg(m.path()),
        );
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(m.path())));
        let _ = Command::new("umount").arg(m.path()).status();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    }));
    for l in &loops {
        let _ = Command::new("losetup").arg("-d").arg(l).status();
    }
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn layers_merge_by_reference_and_by_copy() {
    if !kernel_available("layers_merge_by_reference_and_by_copy") {
        return;
    }
    let t = scratch("merge");
    let (l, u, e) = layers(t.path());
    let (li, ui) = (t.path().join("lower.erofs"), t.path().join("upper.erofs"));
    build(&l, &li, &["-z", "none", "-E", "noinline_data"]);
    build(&u, &ui, &[]);
    let x = t.path().join("x");

    // By reference: the metadata only, the layers its devices in the order given.
    let refimg = t.path().join("ref.erofs");
    let out = run(&[&"build", &"--by-reference", &li, &ui, &refimg]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The upper layer's two files smaller than a block (inline) and its compressed
    // text, and the lower one's file with a hole: copied, and said so. The upper
    // layer's noise did not compress (stored plain): referred to but for the tails.
    assert!(
        err.contains("warning: 4 files (") && err.contains("copied into the image"),
        "{err}"
    );
    let info = json(&ok(&[&"inspect", &"--json", &refimg]));
    assert_eq!(info["extra_devices"].as_u64(), Some(2), "{info}");
    // Each device's tag is its layer's UUID (as mkfs.erofs tags them), and a reader
    // given the layers in another order says so.
    for (k, layer) in [&li, &ui].iter().enumerate() {
        let l = json(&ok(&[&"inspect", &"--json", layer]));
        let uuid = l["uuid"].as_str().expect("uuid").replace('-', "");
        assert_eq!(
            info["devices"][k]["tag"].as_str(),
            Some(uuid.as_str()),
            "{info}"
        );
        let blocks = std::fs::metadata(layer).expect("stat").len() / 4096;
        assert_eq!(
            info["devices"][k]["blocks"].as_u64(),
            Some(blocks),
            "{info}"
        );
    }
    let out = run(&[&"ls", &"--device", &ui, &"--device", &li, &refimg, &"/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("extra device 1: an EROFS image with UUID"),
        "{err}"
    );
    let len = std::fs::metadata(&refimg).expect("stat").len();
    // The copies (4 KiB of the sparse file, 70 KB of noise) and the metadata; the
    // layers hold 1.4 MB.
    assert!(len <= 128 << 10, "reference image of {len} bytes");
    // The lower layer's files point into it: its tool starts where it does there.
    let at = |img: &Path, dev: &[&Path], p: &str| -> serde_json::Value {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"stat", &"--json"];
        for d in dev {
            args.push(&"--device");
            args.push(d);
        }
        args.push(&img);
        args.push(&p);
        json(&ok(&args))
    };
    let s = at(&refimg, &[&li, &ui], "/usr/bin/tool");
    assert_eq!(s["layout"].as_str(), Some("chunk-based"), "{s}");
    with_kernel_mount(&refimg, &[&li, &ui], |m| assert_same_tree(&e, m));
    let out = ok(&[&"check", &"--device", &li, &"--device", &ui, &refimg]);
    assert!(out.starts_with("clean: 0 problems"), "{out}");
    ok(&[&"extract", &"--device", &li, &"--device", &ui, &refimg, &x]);
    assert_same_tree(&e, &x);
    std::fs::remove_dir_all(&x).expect("rm");
    ferofs_testkit::fsck_metabox_devices(&refimg, &[&li, &ui], "merged by reference");

    // Layers with inline tails (`-z none`, the default layout): a file's full blocks
    // are referred to, its tail alone copied (a block of the image); files smaller
    // than a block are copied whole.
    let (lt, ut) = (
        t.path().join("lower-t.erofs"),
        t.path().join("upper-t.erofs"),
    );
    build(&l, &lt, &["-z", "none"]);
    build(&u, &ut, &["-z", "none"]);
    let tailimg = t.path().join("tails.erofs");
    ok(&[&"build", &"-q", &"--by-reference", &lt, &ut, &tailimg]);
    let tool = at(&tailimg, &[&lt, &ut], "/usr/bin/tool");
    assert_eq!(tool["layout"].as_str(), Some("chunk-based"), "{tool}");
    let ext = tool["extents"].as_array().expect("extents");
    let lt_len = std::fs::metadata(&lt).expect("stat").len();
    let tail_len = std::fs::metadata(&tailimg).expect("stat").len();
    // 300,000 bytes: 73 blocks in the lower layer (behind the image, where the
    // device table maps it), the last 992 bytes in the image.
    assert_eq!(ext.len(), 2, "{tool}");
    assert!(
        ext[0]["physical"].as_u64().expect("physical") >= tail_len,
        "{tool}"
    );
    assert!(
        ext[1]["physical"].as_u64().expect("physical") < tail_len,
        "{tool}"
    );
    assert_eq!(ext[1]["logical"].as_u64(), Some(73 * 4096), "{tool}");
    assert!(
        tail_len < 64 << 10 && lt_len > 300_000,
        "{tail_len} / {lt_len}"
    );
    with_kernel_mount(&tailimg, &[&lt, &ut], |m| assert_same_tree(&e, m));
    ferofs_testkit::fsck_metabox_devices(&tailimg, &[&lt, &ut], "tails by reference");

    // By copy, re-encoded, whiteouts and opaque markers stripped: a self-contained
    // image of the stack.
    let stripped = t.path().join("stripped");
    sh(Command::new("cp").arg("-a").arg(&e).arg(&stripped));
    sh(Command::new("rm").arg(stripped.join("opt")));
    sh(Command::new("setfattr")
        .args(["-x", "trusted.overlay.opaque"])
        .arg(stripped.join("var")));
    sh(Command::new("setfattr")
        .args(["-x", "trusted.overlay.origin"])
        .arg(&stripped));
    same_meta(&e, &stripped);
    let full = t.path().join("full.erofs");
    ok(&[
        &"build",
        &"-q",
        &"-z",
        &"lz4hc",
        &"--ovlfs-strip=1",
        &li,
        &ui,
        &full,
    ]);
    let info = json(&ok(&[&"inspect", &"--json", &full]));
    assert_eq!(info["extra_devices"].as_u64(), Some(0), "{info}");
    assert_image_holds(&full, &stripped, &x, "merged by copy");

    // mkfs.erofs's spelling: image sources are merged by reference (containerd's
    // layer merge: `--aufs --ovlfs-strip=1 --quiet`), `--clean=data` copies.
    let dref = t.path().join("dref.erofs");
    mkfs_dropin(
        t.path(),
        &[&"--aufs", &"--ovlfs-strip=1", &"--quiet", &dref, &li, &ui],
    );
    assert!(std::fs::metadata(&dref).expect("stat").len() <= 128 << 10);
    with_kernel_mount(&dref, &[&li, &ui], |m| assert_same_tree(&stripped, m));
    let dfull = t.path().join("dfull.erofs");
    mkfs_dropin(
        t.path(),
        &[&"--clean=data", &"--ovlfs-strip=1", &dfull, &li, &ui],
    );
    let info = json(&ok(&[&"inspect", &"--json", &dfull]));
    assert_eq!(info["extra_devices"].as_u64(), Some(0), "{info}");
    with_kernel_mount(&dfull, &[], |m| assert_same_tree(&stripped, m));

    // Anything but EROFS images among several sources: an error naming it, no image.
    let bad = t.path().join("bad.erofs");
    let out = run(&[&"build", &li, &u, &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is not an EROFS image") && err.contains("upper"),
        "{err}"
    );
    assert!(!bad.exists());
    let out = run(&[&"build", &"--by-reference", &l, &bad]);
    assert!(!out.status.success());
    assert!(!bad.exists());
    // By reference, the output cannot replace a layer it refers to.
    let before = std::fs::read(&ui).expect("read");
    let out = run(&[&"build", &"--by-reference", &li, &ui, &ui]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("would refer to"),
        "{err}"
    );
    assert_eq!(std::fs::read(&ui).expect("read"), before);
}

/// `ferofs build --base BASE.erofs --tar LAYER.tar IMAGE` (mkfs.erofs's
/// `--incremental=data`): an OCI layer laid on an image. The layer replaces a file,
/// deletes one (`.wh.`), makes a directory opaque (`.wh..wh..opq`) and only implies
/// `etc/` and the root, which keep the base's metadata.
#[test]
fn a_tar_layer_onto_a_base_image() {
    if !kernel_available("a_tar_layer_onto_a_base_image") {
        return;
    }
    let t = scratch("onto");
    let (l, _, _) = layers(t.path());
    let base = t.path().join("base.erofs");
    build(&l, &base, &[]);
    let t2 = t.path().join("t2");
    put(&t2, "etc/hostname", b"incremental\n");
    put(&t2, "etc/.wh.passwd", b"");
    put(&t2, "opt/.wh..wh..opq", b"");
    put(&t2, "opt/new", b"n");
    let tar = t.path().join("t2.tar");
    tar_of(&t2, &tar, &["etc/hostname", "etc/.wh.passwd", "opt"]);
    // The stack, by hand.
    let e = t.path().join("stack");
    sh(Command::new("cp").arg("-a").arg(&l).arg(&e));
    for gone in ["etc/hostname", "etc/passwd", "opt"] {
        sh(Command::new("rm").arg("-rf").arg(e.join(gone)));
    }
    std::fs::create_dir(e.join("opt")).expect("mkdir");
    for f in ["etc/hostname", "opt/new"] {
        sh(Command::new("cp").arg("-a").arg(t2.join(f)).arg(e.join(f)));
    }
    same_meta(&t2.join("opt"), &e.join("opt"));
    same_meta(&l.join("etc"), &e.join("etc"));
    same_meta(&l, &e);

    let img = t.path().join("out.erofs");
    let out = run(&[
        &"build",
        &"-q",
        &"--aufs",
        &"--ovlfs-strip=1",
        &"--base",
        &base,
        &"--tar",
        &tar,
        &img,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let x = t.path().join("x");
    assert_image_holds(&img, &e, &x, "a tar layer onto a base");
    // mkfs.erofs's spelling, as image builders run it layer by layer: the image
    // updated in place.
    let inc = t.path().join("inc.erofs");
    std::fs::copy(&base, &inc).expect("copy");
    mkfs_dropin(
        t.path(),
        &[
            &"--tar=f",
            &"--aufs",
            &"--ovlfs-strip=1",
            &"--sort=none",
            &"-Enoinline_data",
            &"--incremental=data",
            &"--quiet",
            &inc,
            &tar,
        ],
    );
    with_kernel_mount(&inc, &[], |m| assert_same_tree(&e, m));
    // In place: the old bytes kept but a few patched ones.
    let (old, new) = (
        std::fs::read(&base).expect("read"),
        std::fs::read(&inc).expect("read"),
    );
    assert!(new.len() > old.len());
    let changed = bytes_differing(&old, &new);
    assert!(changed <= 256, "{changed} old bytes changed");
    // A base that is not an image: an error, nothing written.
    let bad = t.path().join("bad.erofs");
    let out = run(&[&"build", &"--base", &tar, &"--tar", &tar, &bad]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an EROFS image"));
    assert!(!bad.exists());
}

/// A layer with smaller blocks whose size is not a whole number of the merged image's
/// blocks leaves a gap behind its device in the address space; a read that looks
/// ahead of a pcluster of the image (a copied, compressed file at its end) into that
/// gap reads the pcluster alone, not an error.
#[test]
fn a_short_layer_leaves_a_gap_reads_step_over() {
    let t = scratch("gap");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    put(&a, "small", &noise(100, 1));
    put(&b, "constant", &[7u8; 70_000]);
    let (ai, bi) = (t.path().join("a.erofs"), t.path().join("b.erofs"));
    build(
        &a,
        &ai,
        &["-b", "1024", "-z", "none", "-E", "noinline_data"],
    );
    build(&b, &bi, &["-z", "lz4"]);
    assert_ne!(std::fs::metadata(&ai).expect("stat").len() % 4096, 0);
    let m = t.path().join("m.erofs");
    ok(&[
        &"build",
        &"-q",
        &"-z",
        &"lz4",
        &"--by-reference",
        &ai,
        &bi,
        &m,
    ]);
    let out = ok(&[&"check", &"--device", &ai, &"--device", &bi, &m]);
    assert!(out.starts_with("clean: 0 problems"), "{out}");
    let got = ferofs()
        .args(["cat", "--device"])
        .arg(&ai)
        .arg("--device")
        .arg(&bi)
        .arg(&m)
        .arg("/constant")
        .output()
        .expect("cat");
    assert!(
        got.status.success() && got.stdout == [7u8; 70_000],
        "{got:?}"
    );
}

/// A POSIX tar of `paths` under `dir` at `tar`.
fn tar_of(dir: &Path, tar: &Path, paths: &[&str]) {
    sh(Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["--format=posix", "-cf"])
        .arg(tar)
        .args(paths));
}

/// Bytes of `a` and `b` that differ within the shorter one's length.
fn bytes_differing(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// `ferofs build --base IMAGE --tar LAYER.tar IMAGE` appends in place: the layer
/// replaces a name of a hardlinked pair (the other name's link count drops), adds a
/// directory tree under a directory it only implies (whose other subdirectories keep
/// their blocks, their ".." patched), deletes a file and makes a directory opaque.
/// The image's old bytes stay but for a few patched ones, a little is appended, and
/// the kernel's mount, fsck.erofs, `check` and `extract` show the stack. A second
/// layer with `-z none` goes onto the compressed image too; options that change the
/// whole image rebuild it (with a note); a layer that fails to read leaves the image
/// as it was; a root that grows past its record cannot be appended from stdin.
#[test]
fn a_layer_appended_in_place() {
    if !kernel_available("a_layer_appended_in_place") {
        return;
    }
    let t = scratch("inplace");
    let (l, _, _) = layers(t.path());
    let img = t.path().join("img.erofs");
    build(&l, &img, &[]);
    let old = std::fs::read(&img).expect("read");
    let t2 = t.path().join("t2");
    put(&t2, "etc/hostname", b"appended\n");
    put(&t2, "etc/.wh.passwd", b"");
    put(&t2, "opt/.wh..wh..opq", b"");
    put(&t2, "opt/new", b"n");
    put(&t2, "usr/lib/libx.so.1", &noise(7000, 9));
    put(&t2, "usr/share/deep/dir/new", &text_lines(400, 10));
    let tar = t.path().join("t2.tar");
    tar_of(
        &t2,
        &tar,
        &[
            "etc/hostname",
            "etc/.wh.passwd",
            "opt",
            "usr/lib/libx.so.1",
            "usr/share",
        ],
    );
    let e = t.path().join("stack");
    sh(Command::new("cp").arg("-a").arg(&l).arg(&e));
    for gone in ["etc/hostname", "etc/passwd", "opt", "usr/lib/libx.so.1"] {
        sh(Command::new("rm").arg("-rf").arg(e.join(gone)));
    }
    std::fs::create_dir(e.join("opt")).expect("mkdir");
    for f in ["etc/hostname", "opt/new", "usr/lib/libx.so.1", "usr/share"] {
        sh(Command::new("cp").arg("-a").arg(t2.join(f)).arg(e.join(f)));
    }
    same_meta(&t2.join("opt"), &e.join("opt"));
    for d in ["etc", "usr/lib", "usr", ""] {
        same_meta(&l.join(d), &e.join(d));
    }

    let out = run(&[
        &"build",
        &"--aufs",
        &"--ovlfs-strip=1",
        &"--base",
        &img,
        &"--tar",
        &tar,
        &img,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("not appending"), "{err}");
    let new = std::fs::read(&img).expect("read");
    assert!(new.len() > old.len() && new.len() - old.len() <= 64 << 10);
    // The superblock, the root's record, two ".." entries and a link count.
    let changed = bytes_differing(&old, &new);
    assert!(changed > 0 && changed <= 256, "{changed} old bytes changed");
    let x = t.path().join("x");
    assert_image_holds(&img, &e, &x, "a layer appended in place");
    // Uncompressed files onto the compressed image, in place too.
    let t3 = t.path().join("t3");
    put(&t3, "var/more", &noise(12_345, 11));
    let tar3 = t.path().join("t3.tar");
    tar_of(&t3, &tar3, &["var/more"]);
    let out = run(&[
        &"build", &"-z", &"none", &"--base", &img, &"--tar", &tar3, &img,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("not appending"),
        "{err}"
    );
    sh(Command::new("cp")
        .arg("-a")
        .arg(t3.join("var/more"))
        .arg(e.join("var/more")));
    same_meta(&l.join("var"), &e.join("var"));
    assert_image_holds(&img, &e, &x, "a second layer appended in place");
    // A directory layer with a sparse file: uncompressed, its hole a null chunk, so the
    // image (which had no chunk-based files) gets that feature's flag.
    let t5 = t.path().join("t5");
    std::fs::create_dir_all(t5.join("var")).expect("mkdir");
    same_meta(&e, &t5);
    same_meta(&e.join("var"), &t5.join("var"));
    {
        let f = std::fs::File::create(t5.join("var/sparse2")).expect("create");
        f.set_len(3 << 20).expect("truncate");
        std::os::unix::fs::FileExt::write_all_at(&f, &noise(8192, 13), 2 << 20).expect("write");
    }
    let out = run(&[&"build", &"-z", &"none", &"--base", &img, &t5, &img]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("not appending"),
        "{err}"
    );
    sh(Command::new("cp")
        .arg("-a")
        .arg("--sparse=always")
        .arg(t5.join("var/sparse2"))
        .arg(e.join("var/sparse2")));
    same_meta(&t5.join("var"), &e.join("var"));
    same_meta(&t5, &e);
    assert_image_holds(&img, &e, &x, "a sparse file appended in place");

    // A layer that fails to read: an error, the image as it was.
    let before = std::fs::read(&img).expect("read");
    let broken = t.path().join("broken.tar");
    std::fs::write(&broken, &std::fs::read(&tar).expect("read")[..1500]).expect("write");
    let out = run(&[&"build", &"--base", &img, &"--tar", &broken, &img]);
    assert!(!out.status.success());
    assert!(
        std::fs::read(&img).expect("read") == before,
        "image changed"
    );

    // Options that change the whole image: rebuilt, with a note, same tree.
    let out = run(&[
        &"build", &"-E", &"dedupe", &"--base", &img, &"--tar", &tar3, &img,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("not appending") && err.contains("dedupe"),
        "{err}"
    );
    assert_image_holds(&img, &e, &x, "rebuilt with dedupe");

    // The root gains an xattr its record has no room for: from stdin, an error naming
    // --rewrite (the stream cannot be read again), the image as it was; from a file,
    // a rebuild.
    let t4 = t.path().join("t4");
    std::fs::create_dir(&t4).expect("mkdir");
    same_meta(&l, &t4);
    set_xattr(&t4, "user.big", &[7u8; 200]);
    let tar4 = t.path().join("t4.tar");
    sh(Command::new("tar")
        .arg("-C")
        .arg(&t4)
        .args([
            "--format=posix",
            "--xattrs",
            "--xattrs-include=user.*",
            "-cf",
        ])
        .arg(&tar4)
        .arg("."));
    let before = std::fs::read(&img).expect("read");
    let out = ferofs()
        .args(["build", "-z", "none", "--base"])
        .arg(&img)
        .args(["--tar", "-"])
        .arg(&img)
        .stdin(std::fs::File::open(&tar4).expect("open"))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--rewrite"), "{err}");
    assert!(
        std::fs::read(&img).expect("read") == before,
        "image changed"
    );
    let out = run(&[
        &"build", &"-z", &"none", &"--base", &img, &"--tar", &tar4, &img,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("not appending"),
        "{err}"
    );
    set_xattr(&e, "user.big", &[7u8; 200]);
    assert_image_holds(&img, &e, &x, "rebuilt for the root's xattr");
}

/// Every golden image mkfs.erofs 1.9.3 made takes a layer in place (`-z none`: any
/// compression, fragments, chunks, dedupe, xattr prefixes, small blocks), or, where
/// the new inodes cannot join it (a metabox), is rebuilt with a note (the 48-bit
/// layout, dot-omitted directories included, appends);
/// the result passes fsck.erofs and `check`, and its kernel mount equals the
/// whole-image rebuild's (`--rewrite`).
#[test]
fn every_golden_image_takes_a_layer_in_place() {
    if !kernel_available("every_golden_image_takes_a_layer_in_place") {
        return;
    }
    let t = scratch("inplace-golden");
    let l = t.path().join("l");
    put(&l, "data/rand", &noise(10_000, 12));
    put(&l, "newdir/sub/f", b"new\n");
    put(&l, "deep/.wh..wh..opq", b"");
    put(&l, "deep/y", b"y\n");
    let tar = t.path().join("l.tar");
    tar_of(&l, &tar, &["data/rand", "newdir", "deep"]);
    let dir = ferofs_testkit::shared_dir().join("testdata/erofs-utils-1.9.3");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("goldens")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".erofs.zst"))
        .collect();
    names.sort();
    assert!(names.len() >= 30, "{names:?}");
    for n in &names {
        let src = ferofs_testkit::golden(&format!("erofs-utils-1.9.3/{n}"));
        let (a, b) = (t.path().join("a.erofs"), t.path().join("b.erofs"));
        std::fs::copy(&src, &a).expect("copy");
        std::fs::copy(&src, &b).expect("copy");
        let out = run(&[
            &"build", &"-z", &"none", &"--aufs", &"--base", &a, &"--tar", &tar, &a,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{n}: {err}");
        let refused = n.contains("metabox");
        assert_eq!(err.contains("not appending"), refused, "{n}: {err}");
        ok(&[
            &"build",
            &"-q",
            &"-z",
            &"none",
            &"--aufs",
            &"--rewrite",
            &"--base",
            &b,
            &"--tar",
            &tar,
            &b,
        ]);
        ferofs_testkit::fsck_metabox(&a, n);
        ok(&[&"check", &a]);
        let ma = ferofs_testkit::Mount::erofs(&a);
        let mb = ferofs_testkit::Mount::erofs(&b);
        assert_same_tree(mb.path(), ma.path());
    }
}

/// The root and a directory the layer touches carry an xattr the image shares (more
/// than two inodes have it): their xattr areas are kept as stored, so the root still
/// fits its record and the append stays in place.
#[test]
fn shared_xattrs_of_the_image_stay_shared_in_place() {
    if !kernel_available("shared_xattrs_of_the_image_stay_shared_in_place") {
        return;
    }
    let t = scratch("inplace-shared");
    let s = t.path().join("s");
    put(&s, "a/f", b"1\n");
    std::fs::create_dir_all(s.join("b")).expect("mkdir");
    std::fs::create_dir_all(s.join("c")).expect("mkdir");
    for p in ["", "a", "b", "c", "a/f"] {
        set_xattr(&s.join(p), "user.lbl", b"same");
    }
    let img = t.path().join("img.erofs");
    build(&s, &img, &[]);
    let l = t.path().join("l");
    put(&l, "a/g", b"2\n");
    let tar = t.path().join("l.tar");
    tar_of(&l, &tar, &["a/g"]);
    let out = run(&[
        &"build", &"-z", &"none", &"--base", &img, &"--tar", &tar, &img,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("not appending"),
        "{err}"
    );
    let e = t.path().join("e");
    sh(Command::new("cp").arg("-a").arg(&s).arg(&e));
    sh(Command::new("cp")
        .arg("-a")
        .arg(l.join("a/g"))
        .arg(e.join("a/g")));
    same_meta(&s.join("a"), &e.join("a"));
    let x = t.path().join("x");
    assert_image_holds(&img, &e, &x, "shared xattrs in place");
}

/// Room `--root-xattr-isize` leaves in the root takes a layer's root xattrs in place,
/// and stays for the next append.
#[test]
fn root_xattr_room_lasts_across_appends() {
    if !kernel_available("root_xattr_room_lasts_across_appends") {
        return;
    }
    let t = scratch("inplace-rootroom");
    let s = t.path().join("s");
    put(&s, "a/f", b"1\n");
    let img = t.path().join("img.erofs");
    build(&s, &img, &["-z", "none", "--root-xattr-isize", "512"]);
    let e = t.path().join("e");
    sh(Command::new("cp").arg("-a").arg(&s).arg(&e));
    let x = t.path().join("x");
    for (k, v) in [("user.one", [1u8; 200]), ("user.two", [2u8; 200])] {
        let r = t.path().join(k);
        std::fs::create_dir(&r).expect("mkdir");
        same_meta(&s, &r);
        for (kk, vv) in [("user.one", [1u8; 200]), ("user.two", [2u8; 200])] {
            if kk <= k {
                set_xattr(&r, kk, &vv);
            }
        }
        let tar = t.path().join(format!("{k}.tar"));
        sh(Command::new("tar")
            .arg("-C")
            .arg(&r)
            .args([
                "--format=posix",
                "--xattrs",
                "--xattrs-include=user.*",
                "-cf",
            ])
            .arg(&tar)
            .arg("."));
        let out = run(&[
            &"build", &"-z", &"none", &"--base", &img, &"--tar", &tar, &img,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("not appending"),
            "{k}: {err}"
        );
        set_xattr(&e, k, &v);
        assert_image_holds(&img, &e, &x, k);
    }
}

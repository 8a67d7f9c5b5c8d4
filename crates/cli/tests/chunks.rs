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

/// `--blobdev BLOB` (mkfs.erofs's option): every file's data goes to BLOB as chunks
/// (deduplicated, zeros as holes), the image keeps only metadata and names BLOB as its
/// extra device. The kernel mounts the image with BLOB as `device=` and the two
/// concatenated alone; fsck.erofs (`--device`), `check` and `extract` read the tree;
/// a failed build leaves neither file; the options it needs are checked.
#[test]
fn blobdev_puts_the_data_on_an_extra_device() {
    if !kernel_available("blobdev_puts_the_data_on_an_extra_device") {
        return;
    }
    let (fs, tree) = make_tree();
    let r1 = chunky(&tree.join("chunky"));
    let x = fs.path().join("x");
    let img = fs.path().join("meta.erofs");
    let blob = fs.path().join("blob.bin");
    let plain = fs.path().join("plain.erofs");
    build(&tree, &plain, &["-z", "none", "--chunksize", "65536"]);
    let b = blob.to_str().expect("utf-8 path");
    build(
        &tree,
        &img,
        &["-z", "none", "--chunksize", "65536", "--blobdev", b],
    );
    let (img_len, blob_len) = (
        std::fs::metadata(&img).expect("stat").len(),
        std::fs::metadata(&blob).expect("stat").len(),
    );
    // The data is in the blob (r1 once: r2 and most of r3 share its chunks).
    assert!(blob_len >= r1.len() as u64, "blob of {blob_len} bytes");
    assert!(
        blob_len < 2 * r1.len() as u64 + (160 << 20),
        "blob of {blob_len} bytes"
    );
    let plain_len = std::fs::metadata(&plain).expect("stat").len();
    assert!(
        img_len + blob_len >= plain_len - (1 << 20) && img_len < plain_len / 2,
        "image {img_len}, blob {blob_len}, one image {plain_len}"
    );
    let info = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(info["extra_devices"].as_u64(), Some(1), "{info}");
    // ferofs reads the two concatenated (the device table puts the blob right behind
    // the image). Every file with data is chunk-based with 8-byte indexes, r2 on r1's
    // chunks.
    let both = fs.path().join("both.erofs");
    let mut joined = std::fs::read(&img).expect("read");
    joined.extend(std::fs::read(&blob).expect("read"));
    std::fs::write(&both, joined).expect("write");
    assert_eq!(layout(&both, "/chunky/small"), "chunk-based");
    assert_eq!(chunk_format(&both, "/chunky/r2") & 0x20, 0x20);
    assert_eq!(
        physical(&extents(&both, "/chunky/r1")[0]),
        physical(&extents(&both, "/chunky/r2")[0])
    );
    // The kernel: the blob as the extra device (a loop device), and concatenated.
    let loopdev = ferofs_testkit::run(
        std::process::Command::new("losetup")
            .args(["-f", "--show", "-r"])
            .arg(&blob),
    );
    let loopdev = loopdev.trim().to_string();
    let mounted = std::panic::catch_unwind(|| {
        let m = ferofs_testkit::scratch("blobdev-mnt");
        ferofs_testkit::run(
            std::process::Command::new("mount")
                .args(["-t", "erofs", "-o"])
                .arg(format!("ro,loop,device={loopdev}"))
                .arg(&img)
                .arg(m.path()),
        );
        let r = std::panic::catch_unwind(|| ferofs_testkit::assert_same_tree(&tree, m.path()));
        let _ = std::process::Command::new("umount").arg(m.path()).status();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    });
    let _ = std::process::Command::new("losetup")
        .arg("-d")
        .arg(&loopdev)
        .status();
    if let Err(e) = mounted {
        std::panic::resume_unwind(e);
    }
    ferofs_testkit::fsck_metabox_devices(&img, &[&blob], "--blobdev");
    assert_image_holds(&both, &tree, &x, "image + blob");
    // The image and the blob as they are: `--device` (check, extract, FUSE mount;
    // `diff` gives it to the image that has a device, not to the other).
    ok(&[&"diff", &"--device", &blob, &img, &plain]);
    ok(&[&"diff", &"--device", &blob, &plain, &img]);
    let out = ok(&[&"check", &img, &"--device", &blob]);
    assert!(out.starts_with("clean: 0 problems"), "{out}");
    ok(&[&"extract", &"--device", &blob, &img, &x]);
    ferofs_testkit::assert_same_tree(&tree, &x);
    std::fs::remove_dir_all(&x).expect("rm");
    {
        let m = ferofs_testkit::scratch("blobdev-fuse");
        ok(&[&"mount", &"--device", &blob, &img, &m.path()]);
        let r = std::panic::catch_unwind(|| ferofs_testkit::assert_same_tree(&tree, m.path()));
        let _ = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(m.path())
            .status();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    }
    // Re-encoded from the image and its blob (`build --device`): compressed, alone.
    let re = fs.path().join("re.erofs");
    ok(&[
        &"build",
        &"-q",
        &"-z",
        &"lz4",
        &"--device",
        &blob,
        &img,
        &re,
    ]);
    {
        let m = ferofs_testkit::Mount::erofs(&re);
        ferofs_testkit::assert_same_tree(&tree, m.path());
    }
    // Without the blob the data is missing (problems, not a crash); with one device
    // too many, a clear error.
    let out = run(&[&"check", &img]);
    assert_eq!(out.status.code(), Some(1), "check without the blob");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("give them with --device FILE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&[&"check", &both]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("--device"));
    let out = run(&[&"check", &img, &"--device", &blob, &"--device", &blob]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 extra device(s) given"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Reproducible, and the same blob for -j 1.
    let (img1, blob1) = (fs.path().join("m1.erofs"), fs.path().join("b1.bin"));
    let b1 = blob1.to_str().expect("utf-8 path");
    build(
        &tree,
        &img1,
        &[
            "-z",
            "none",
            "--chunksize",
            "65536",
            "--blobdev",
            b1,
            "-j",
            "1",
        ],
    );
    assert!(std::fs::read(&blob1).expect("read") == std::fs::read(&blob).expect("read"));
    // Refused: without --chunksize, with compression, with the block map, onto the
    // image itself; and a build that fails leaves no blob.
    let nob = fs.path().join("no.bin");
    let n = nob.to_str().expect("utf-8 path");
    let i = img.to_str().expect("utf-8 path");
    for bad in [
        &["-z", "none", "--blobdev", n][..],
        &["-z", "lz4", "--chunksize", "65536", "--blobdev", n][..],
        &[
            "-z",
            "none",
            "--chunksize",
            "65536",
            "-E",
            "force-inode-blockmap",
            "--blobdev",
            n,
        ][..],
        &["-z", "none", "--chunksize", "65536", "--blobdev", i][..],
    ] {
        let out = ferofs()
            .arg("build")
            .args(bad)
            .arg(&tree)
            .arg(&img)
            .output()
            .expect("run ferofs");
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(!nob.exists(), "{bad:?} left a blob");
    }
    let missing = fs.path().join("missing-source");
    let out = ferofs()
        .args([
            "build",
            "-z",
            "none",
            "--chunksize",
            "65536",
            "--blobdev",
            n,
        ])
        .arg(&missing)
        .arg(fs.path().join("never.erofs"))
        .output()
        .expect("run ferofs");
    assert!(!out.status.success());
    assert!(!nob.exists(), "a failed build left a blob");
}

/// `--vmdk-desc FILE` (mkfs.erofs's): a VMDK descriptor joining the image and its
/// extra device (the `--blobdev` blob; the `--tar-index` tar) in device-table order.
/// The disk its extents describe, put together byte for byte, mounts with the kernel
/// as the tree; the header's CID is the UUID's four words XORed; the drop-in takes it.
#[test]
fn vmdk_descriptor_joins_the_image_and_its_devices() {
    if !kernel_available("vmdk_descriptor_joins_the_image_and_its_devices") {
        return;
    }
    let (fs, tree) = make_tree();
    let img = fs.path().join("meta.erofs");
    let blob = fs.path().join("blob.bin");
    let desc = fs.path().join("disk.vmdk");
    let b = blob.to_str().expect("utf-8 path");
    let d = desc.to_str().expect("utf-8 path");
    // The disk a descriptor describes: each extent's sectors of its file (zeros past
    // the file's end, as a flat extent reads).
    let disk = |desc: &Path| -> Vec<u8> {
        let text = std::fs::read_to_string(desc).expect("read descriptor");
        let mut out = Vec::new();
        for l in text.lines().filter(|l| l.starts_with("RW ")) {
            let q: Vec<&str> = l.split('"').collect();
            let n: usize = q[0]["RW ".len()..]
                .trim()
                .trim_end_matches("FLAT")
                .trim()
                .parse()
                .expect("sectors");
            let at: usize = q[2].trim().parse().expect("offset");
            let f = std::fs::read(q[1]).expect("extent file");
            let mut part = vec![0u8; n * 512];
            let have = f.len().saturating_sub(at * 512).min(n * 512);
            part[..have].copy_from_slice(&f[at * 512..at * 512 + have]);
            out.extend(part);
        }
        out
    };
    let uuid_cid = |img: &Path| -> String {
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        let hex: String = info["uuid"].as_str().expect("uuid").replace('-', "");
        let bytes: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        let cid = bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .fold(0, |a, w| a ^ w);
        format!("CID={cid:x}\n")
    };
    build(
        &tree,
        &img,
        &[
            "-z",
            "none",
            "--chunksize",
            "4096",
            "--blobdev",
            b,
            "--vmdk-desc",
            d,
        ],
    );
    let text = std::fs::read_to_string(&desc).expect("descriptor");
    assert!(
        text.starts_with("# Disk DescriptorFile\nversion=1\n"),
        "{text}"
    );
    assert!(text.contains(&uuid_cid(&img)), "{text}");
    assert!(text.contains("createType=\"twoGbMaxExtentFlat\""), "{text}");
    let img_len = std::fs::metadata(&img).expect("stat").len();
    assert!(
        text.contains(&format!(
            "RW {} FLAT \"{}\" 0\n",
            img_len / 512,
            img.display()
        )),
        "{text}"
    );
    assert!(text.contains(&format!("FLAT \"{b}\" 0\n")), "{text}");
    let whole = fs.path().join("disk.img");
    std::fs::write(&whole, disk(&desc)).expect("write disk");
    {
        let m = ferofs_testkit::Mount::erofs(&whole);
        ferofs_testkit::assert_same_tree(&tree, m.path());
    }
    // Tar index mode: the tar is the device (of a tree tar can hold: no socket).
    let small = fs.path().join("small");
    chunky(&small.join("c"));
    let tar = fs.path().join("t.tar");
    let st = std::process::Command::new("tar")
        .args(["--format=posix", "-cf"])
        .arg(&tar)
        .arg("-C")
        .arg(&small)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success());
    let ti = fs.path().join("ti.erofs");
    ok(&[
        &"build",
        &"-q",
        &"--tar-index",
        &"--tar",
        &tar,
        &"--vmdk-desc",
        &desc,
        &ti,
    ]);
    let text = std::fs::read_to_string(&desc).expect("descriptor");
    assert!(
        text.contains(&format!("FLAT \"{}\" 0\n", tar.display())),
        "{text}"
    );
    std::fs::write(&whole, disk(&desc)).expect("write disk");
    {
        let m = ferofs_testkit::Mount::erofs(&whole);
        ferofs_testkit::assert_same_tree(&small, m.path());
    }
    // The drop-in's spelling.
    let img2 = fs.path().join("m2.erofs");
    let desc2 = fs.path().join("d2.vmdk");
    mkfs_dropin(
        fs.path(),
        &[
            &"--quiet",
            &"--chunksize=4096",
            &format!("--blobdev={}", fs.path().join("b2.bin").display()),
            &format!("--vmdk-desc={}", desc2.display()),
            &img2,
            &tree,
        ],
    );
    assert!(std::fs::read_to_string(&desc2)
        .expect("descriptor")
        .contains("b2.bin\" 0\n"));
}

//! Where `build` writes: a block device in place (never replacing its node), an image
//! behind `--offset` zeros that every reader finds with the same `--offset`, the file a
//! symbolic link points at, and nothing else.

mod common;
use common::*;
use ferofs_testkit::{assert_same_tree, kernel_available, run as run_cmd, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over a sparse file of `size` bytes, detached when dropped.
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn new(backing: &Path, size: u64) -> Self {
        let f = std::fs::File::create(backing).expect("create backing file");
        f.set_len(size).expect("size backing file");
        let dev = run_cmd(Command::new("losetup").args(["-f", "--show"]).arg(backing));
        Loop {
            dev: PathBuf::from(dev.trim()),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

fn small_tree(root: &Path) {
    std::fs::create_dir_all(root.join("d")).expect("mkdir");
    std::fs::write(root.join("a.txt"), "hello\n".repeat(3000)).expect("write");
    std::fs::write(root.join("d/b"), b"bee").expect("write");
    std::os::unix::fs::symlink("a.txt", root.join("link")).expect("symlink");
}

fn is_block_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

#[test]
fn a_block_device_is_written_in_place() {
    if !kernel_available("a_block_device_is_written_in_place") {
        return;
    }
    let d = scratch("out-device");
    let tree = d.path().join("tree");
    small_tree(&tree);
    let lo = Loop::new(&d.path().join("backing"), 16 << 20);
    build(&tree, &lo.dev, &["-z", "lz4hc"]);
    // The node is still the device, and the device holds the image.
    assert!(is_block_device(&lo.dev), "{} replaced", lo.dev.display());
    ok(&[&"check", &lo.dev]);
    let mnt = scratch("out-device-mnt");
    run_cmd(
        Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
            .arg(&lo.dev)
            .arg(mnt.path()),
    );
    assert_same_tree(&tree, mnt.path());
    // While it is mounted, a build refuses to touch it.
    let out = run(&[&"build", &"-q", &tree, &lo.dev]);
    let _ = Command::new("umount").arg(mnt.path()).status();
    assert!(!out.status.success(), "built over a mounted device");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("busy"), "{err}");
    ok(&[&"check", &lo.dev]);
    // An image larger than the device fails, naming it, and leaves no superblock.
    let big = d.path().join("big");
    std::fs::create_dir_all(&big).expect("mkdir");
    std::fs::write(big.join("noise"), ferofs_testkit::noise(20 << 20, 5)).expect("write");
    let out = run(&[&"build", &"-q", &"-z", &"none", &big, &lo.dev]);
    assert!(!out.status.success(), "built 20 MiB into 16 MiB");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not fit the device"), "{err}");
    assert!(is_block_device(&lo.dev));
    let out = run(&[&"check", &lo.dev]);
    assert_eq!(out.status.code(), Some(2), "a failed build left an image");
}

#[test]
fn an_image_behind_an_offset_reads_with_the_same_offset() {
    let d = scratch("out-offset");
    let tree = d.path().join("tree");
    small_tree(&tree);
    let img = d.path().join("disk.img");
    // An old file under the name: replaced, not written into.
    std::fs::write(&img, vec![0xAAu8; 3 << 20]).expect("write");
    build(&tree, &img, &["--offset", "1m", "-z", "lz4"]);
    let bytes = std::fs::read(&img).expect("read");
    assert!(
        bytes[..1 << 20].iter().all(|&b| b == 0),
        "the bytes before are not zeros"
    );
    assert_eq!(
        &bytes[(1 << 20) + 1024..(1 << 20) + 1028],
        &[0xe2, 0xe1, 0xf5, 0xe0]
    );
    // Without the offset there is no image; with it, every reader sees the tree.
    assert_eq!(run(&[&"check", &img]).status.code(), Some(2));
    // ... and the error says where it is.
    for cmd in ["check", "inspect"] {
        let out = run(&[&cmd, &img]);
        assert!(!out.status.success(), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("hint: an EROFS superblock is at byte 1049600: the image starts at --offset 1048576"),
            "{cmd}: {err}"
        );
    }
    ok(&[&"check", &"--offset", &"1048576", &img]);
    let x = d.path().join("x");
    ok(&[&"extract", &"--offset", &"1m", &img, &x]);
    assert_same_tree(&tree, &x);
    assert_eq!(ok(&[&"cat", &"--offset=1m", &img, &"/d/b"]), "bee");
    // fsck.erofs 1.9 (1.5 has no --offset) and the drop-in take the same offset.
    match ferofs_testkit::fsck_erofs_metabox() {
        Some(fsck) => {
            run_cmd(Command::new(fsck).arg("--offset=1048576").arg(&img));
        }
        None => eprintln!("SKIPPED fsck.erofs --offset: no fsck.erofs 1.9+"),
    }
    ok(&[&"fsck", &"--offset=1048576", &img]);
    // The kernel, through a loop device at that offset.
    if kernel_available("an_image_behind_an_offset_reads_with_the_same_offset") {
        let mnt = scratch("out-offset-mnt");
        run_cmd(
            Command::new("mount")
                .args(["-t", "erofs", "-o", "loop,ro,offset=1048576"])
                .arg(&img)
                .arg(mnt.path()),
        );
        let r = std::panic::catch_unwind(|| assert_same_tree(&tree, mnt.path()));
        let _ = Command::new("umount").arg(mnt.path()).status();
        r.expect("kernel mount at the offset");
    }
    // An offset past the end of the file is an error, not a read of nothing.
    let out = run(&[&"ls", &"--offset", &"1g", &img, &"/"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("past its end"));
    // The hash tree of --verity lies right behind the image: not with an offset.
    let out = run(&[&"build", &"--offset", &"4096", &"--verity", &tree, &img]);
    assert!(!out.status.success());
}

#[test]
fn a_symbolic_link_is_followed_and_other_outputs_are_refused() {
    let d = scratch("out-kinds");
    let tree = d.path().join("tree");
    small_tree(&tree);
    let real = d.path().join("images/real.erofs");
    std::fs::create_dir_all(real.parent().expect("parent")).expect("mkdir");
    let link = d.path().join("current.erofs");
    std::os::unix::fs::symlink("images/real.erofs", &link).expect("symlink");
    build(&tree, &link, &[]);
    assert!(std::fs::symlink_metadata(&link)
        .expect("stat")
        .file_type()
        .is_symlink());
    ok(&[&"check", &real]);
    // A FIFO and a character device are not outputs; both stay what they were.
    let fifo = d.path().join("fifo");
    run_cmd(Command::new("mkfifo").arg(&fifo));
    for out_path in [fifo.as_path(), Path::new("/dev/null")] {
        let out = run(&[&"build", &"-q", &tree, &out_path]);
        assert!(!out.status.success(), "{} taken", out_path.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("regular file or a block device"), "{err}");
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("stat")
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata("/dev/null")
        .expect("stat")
        .file_type()
        .is_char_device());
}

/// `--block-map` goes where `export --tar` goes: into a FIFO (which stays a FIFO),
/// through a link (which stays a link, a dangling one's target created), a directory
/// an error that leaves no image. It once renamed its scratch file over the name.
#[test]
fn the_block_map_writes_into_fifos_and_through_links() {
    use std::os::unix::fs::FileTypeExt;
    let d = scratch("map-kinds");
    let d = d.path();
    let tree = d.join("tree");
    small_tree(&tree);
    let map_of = |map: &Path, img: &str| {
        ok(&[
            &"build",
            &"-q",
            &"--reserve-data",
            &"--block-map",
            &map,
            &tree,
            &d.join(img),
        ])
    };
    map_of(&d.join("plain.map"), "plain.erofs");
    let want = std::fs::read(d.join("plain.map")).expect("read map");
    assert!(!want.is_empty());

    let fifo = d.join("fifo");
    run_cmd(Command::new("mkfifo").arg(&fifo));
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).expect("read fifo"))
    };
    map_of(&fifo, "fifo.erofs");
    // Checked before the reader is joined: with the FIFO replaced it would wait forever.
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("lstat")
        .file_type()
        .is_fifo());
    assert_eq!(reader.join().expect("reader"), want);

    std::fs::create_dir(d.join("maps")).expect("mkdir");
    std::fs::write(d.join("maps/old.map"), b"old").expect("write");
    for (link, target) in [
        ("link.map", "maps/old.map"),
        ("dangling.map", "maps/new.map"),
    ] {
        std::os::unix::fs::symlink(target, d.join(link)).expect("symlink");
        map_of(&d.join(link), &format!("{link}.erofs"));
        let ft = std::fs::symlink_metadata(d.join(link))
            .expect("lstat")
            .file_type();
        assert!(ft.is_symlink(), "{link}: {ft:?}");
        assert_eq!(std::fs::read(d.join(target)).expect("read"), want, "{link}");
    }

    let img = d.join("dir.erofs");
    let out = run(&[
        &"build",
        &"-q",
        &"--reserve-data",
        &"--block-map",
        &d.join("maps"),
        &tree,
        &img,
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("maps: is a directory"), "{err}");
    assert!(!img.exists());
    let mut left: Vec<String> = std::fs::read_dir(d)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    left.sort();
    assert!(left.is_empty(), "scratch files left: {left:?}");
}

/// The temporary file beside an output is created under a fresh name, never opened
/// through a link already there. It was `.NAME.ferofs-tmp-PID` (export: `.NAME.tmpPID`),
/// opened with O_TRUNC: in a shared directory a link planted under the next process ids
/// had a build as root truncate and fill the link's target, then rename the link onto
/// the output. Here the process id is known (a shell that waits, then `exec`s ferofs)
/// and the links are planted under it before ferofs starts.
#[test]
fn a_link_planted_under_a_temporary_name_is_not_written_through() {
    use std::io::Write;
    use std::process::Stdio;
    let d = scratch("planted");
    let d = d.path();
    let tree = d.join("tree");
    small_tree(&tree);
    let img = d.join("img.erofs");
    build(&tree, &img, &[]);
    let victim = d.join("victim");
    std::fs::write(&victim, b"precious").expect("write");
    let cases: [(&str, Vec<String>, String); 2] = [
        (
            "new.erofs",
            vec!["build".into(), "-q".into(), tree.display().to_string()],
            ".new.erofs.ferofs-tmp-".into(),
        ),
        (
            "new.tar",
            vec!["export".into(), img.display().to_string(), "--tar".into()],
            ".new.tar.tmp".into(),
        ),
    ];
    for (out, args, old_prefix) in cases {
        let mut sh = Command::new("sh")
            .arg("-c")
            .arg("read go && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_ferofs"))
            .args(&args)
            .arg(d.join(out))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let pid = sh.id();
        let planted = d.join(format!("{old_prefix}{pid}"));
        std::os::unix::fs::symlink("victim", &planted).expect("plant");
        sh.stdin
            .take()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("go");
        let o = sh.wait_with_output().expect("wait");
        assert!(o.status.success(), "{out}: {o:?}");
        let v = std::fs::read(&victim).expect("read");
        assert!(
            v == b"precious",
            "{out}: the link's target written, now {} bytes",
            v.len()
        );
        let ft = std::fs::symlink_metadata(d.join(out))
            .expect("lstat")
            .file_type();
        assert!(ft.is_file(), "{out}: {ft:?}");
        // The planted link is left as it was, and no temporary file beside it.
        assert!(std::fs::symlink_metadata(&planted)
            .expect("lstat")
            .file_type()
            .is_symlink());
        std::fs::remove_file(&planted).expect("rm");
        let left: Vec<String> = std::fs::read_dir(d)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    ok(&[&"check", &d.join("new.erofs")]);
}

#[test]
fn images_on_block_devices_are_sources_too() {
    if !kernel_available("images_on_block_devices_are_sources_too") {
        return;
    }
    let d = scratch("src-device");
    let tree = d.path().join("tree");
    small_tree(&tree);
    let img = d.path().join("a.erofs");
    build(&tree, &img, &["-z", "lz4"]);
    let mut images = vec![("erofs", img)];
    if ferofs_testkit::tool("mksquashfs").is_some() {
        let sq = d.path().join("a.sqfs");
        run_cmd(
            Command::new("mksquashfs")
                .arg(&tree)
                .arg(&sq)
                .args(["-quiet", "-no-progress"]),
        );
        images.push(("squashfs", sq));
    }
    for (kind, image) in images {
        let dev = run_cmd(
            Command::new("losetup")
                .args(["-r", "-f", "--show"])
                .arg(&image),
        );
        let lo = Loop {
            dev: PathBuf::from(dev.trim()),
        };
        let out = d.path().join(format!("from-{kind}.erofs"));
        build(&lo.dev, &out, &[]);
        // The same image as from the file (diff opens the device as an image too).
        let from_file = d.path().join(format!("from-{kind}-file.erofs"));
        build(&image, &from_file, &[]);
        ok(&[&"diff", &from_file, &out]);
        if kind == "erofs" {
            ok(&[&"diff", &tree, &out]);
            ok(&[&"diff", &lo.dev, &out]);
            ok(&[&"check", &lo.dev]);
        }
    }
}

#[test]
fn fsalignblks_rounds_the_image_size_up() {
    let d = scratch("out-align");
    let tree = d.path().join("tree");
    small_tree(&tree);
    for (n, blocks) in [
        (1u32, None),
        (200, Some(256u64)),
        (256, Some(256)),
        (3, None),
    ] {
        let img = d.path().join(format!("a{n}.erofs"));
        build(&tree, &img, &["--fsalignblks", &n.to_string()]);
        let len = std::fs::metadata(&img).expect("stat").len();
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        assert_eq!(info["blocks"].as_u64(), Some(len / 4096), "{n}");
        match blocks {
            Some(b) => assert_eq!(len, b * 4096, "--fsalignblks {n}"),
            // 3 rounds up to 4.
            None if n == 3 => assert_eq!(len % (4 * 4096), 0, "--fsalignblks 3: {len}"),
            None => {}
        }
        ok(&[&"check", &img]);
    }
}

/// The block of the first data extent of `path` in `img` that is stored on its own
/// (not inline, not a hole, not in the packed inode), or None.
fn first_data_block(img: &Path, path: Option<&str>, nid: Option<u64>) -> Option<u64> {
    let st = match (path, nid) {
        (Some(p), _) => json(&ok(&[&"stat", &"--json", &img, &p])),
        (None, Some(n)) => json(&ok(&[&"stat", &"--json", &img, &"--nid", &n.to_string()])),
        _ => unreachable!(),
    };
    st["extents"].as_array()?.iter().find_map(|e| {
        let k = e["kind"].as_str().unwrap_or("");
        if k == "inline" || k == "hole" || k.contains("fragment") {
            return None;
        }
        e["physical"].as_u64().map(|p| p / 4096)
    })
}

/// `--dsunit N` (mkfs.erofs's option): every file's first data block, the packed
/// inode's too, is at a multiple of N blocks, for flat, sparse, chunk-based and
/// compressed files (a file whose first chunk or pcluster is shared stays with the one
/// it shares); the kernel reads the image as the tree; the image is the same for any
/// `-j`; a unit larger than a chunk is ignored with a warning; on a block device the
/// gaps are zeros, so the device holds the same bytes as the file.
#[test]
fn dsunit_aligns_every_file_start() {
    if !kernel_available("dsunit_aligns_every_file_start") {
        return;
    }
    let d = scratch("out-dsunit");
    let tree = d.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).expect("mkdir");
    let noise = ferofs_testkit::noise(400_000, 9);
    let text = ferofs_testkit::text_lines(20_000, 4);
    std::fs::write(tree.join("one-block-and-tail"), &noise[..5000]).expect("write");
    std::fs::write(tree.join("noise"), &noise[..70_000]).expect("write");
    std::fs::write(tree.join("sub/noise-copy"), &noise[..70_000]).expect("write");
    std::fs::write(tree.join("text"), &text).expect("write");
    std::fs::write(tree.join("sub/tiny"), b"tiny").expect("write");
    // Shares its first 64 KiB chunk with `noise`, then differs.
    std::fs::write(
        tree.join("sub/shares-head"),
        [&noise[..65_536], &noise[200_000..300_000]].concat(),
    )
    .expect("write");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(tree.join("sparse")).expect("create");
        f.set_len(1 << 20).expect("size");
        f.write_all_at(&noise[..9000], 600_000).expect("write");
    }
    let files = [
        "/one-block-and-tail",
        "/noise",
        "/sub/noise-copy",
        "/text",
        "/sub/tiny",
        "/sub/shares-head",
        "/sparse",
    ];
    let unit = 8u64;
    for opts in [
        &["-z", "none"][..],
        &["-z", "none", "--chunksize", "65536"][..],
        &["-z", "lz4hc"][..],
        &["-z", "lz4hc", "-E", "smallest"][..],
        &["-z", "zstd", "-C", "65536", "-E", "dedupe,ztailpacking"][..],
    ] {
        let img = d.path().join("a.erofs");
        let args = [opts, &["--dsunit", "8", "-j", "2"][..]].concat();
        build(&tree, &img, &args);
        let mut aligned = 0;
        for f in files {
            if let Some(b) = first_data_block(&img, Some(f), None) {
                let shared = f == "/sub/noise-copy" || f == "/sub/shares-head";
                assert!(b % unit == 0 || shared, "{args:?}: {f} starts at block {b}");
                aligned += usize::from(b % unit == 0);
            }
        }
        assert!(aligned >= 3, "{args:?}: only {aligned} files with data");
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        if let Some(n) = info["packed_nid"].as_u64().filter(|&n| n > 0) {
            let b = first_data_block(&img, None, Some(n)).expect("packed inode data");
            assert_eq!(b % unit, 0, "{args:?}: packed inode at block {b}");
        }
        assert_image_holds(&img, &tree, &d.path().join("x"), &format!("{args:?}"));
        let one = d.path().join("j1.erofs");
        build(
            &tree,
            &one,
            &[opts, &["--dsunit", "8", "-j", "1"][..]].concat(),
        );
        assert_eq!(
            std::fs::read(&img).expect("read"),
            std::fs::read(&one).expect("read"),
            "{args:?}: -j 1 and -j 2 differ"
        );
        // Without the unit the same tree packs tighter.
        build(&tree, &one, opts);
        assert!(
            std::fs::metadata(&one).expect("stat").len()
                < std::fs::metadata(&img).expect("stat").len(),
            "{args:?}"
        );
    }
    // Larger than a chunk: ignored, said so.
    let out = run(&[
        &"build",
        &"-z",
        &"none",
        &"--chunksize",
        &"16384",
        &"--dsunit",
        &"8",
        &tree,
        &d.path().join("c.erofs"),
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--dsunit 8 ignored"), "{err}");
    // On a device holding old bytes the gaps are cleared: the device then holds the
    // file's image byte for byte.
    let lo = Loop::new(&d.path().join("backing"), 8 << 20);
    std::fs::write(&lo.dev, vec![0xA5u8; 8 << 20]).expect("fill device");
    for opts in [&["-z", "none"][..], &["-z", "lz4hc", "-E", "smallest"][..]] {
        let args = [opts, &["--dsunit", "8", "-T", "0"][..]].concat();
        let img = d.path().join("a.erofs");
        build(&tree, &img, &args);
        build(&tree, &lo.dev, &args);
        let want = std::fs::read(&img).expect("read");
        let mut got = std::fs::read(&lo.dev).expect("read device");
        got.truncate(want.len());
        assert!(got == want, "{args:?}: the device differs from the file");
    }
}

//! `ferofs build --tar`: tar streams and OCI layers into images.
//!
//! - the shared `tree.tar.zst` (file and stdin) mounts as the make-tree tree;
//! - GNU tar archives of that tree (gnu, oldgnu, posix with text ACLs; GNU and PAX
//!   0.0/0.1/1.0 sparse; gzip/xz/zstd/bzip2/lzma; stdin) give the very bytes a directory
//!   build gives, over a matrix of build options (every option works the same);
//! - `--aufs` layers equal mkfs.erofs 1.9.3's on the same layers, and a flattened
//!   stack equals the overlayfs mount of the layer images;
//! - hostile archives fail with an error naming the entry and leave nothing behind;
//!   tar's own rules (last wins, hardlinks to overwritten files, base-256 ids, ns
//!   times, implicit directories) hold.

mod common;
use common::*;
use ferofs_testkit::{
    assert_same_tree, fsck_erofs, kernel_available, make_tree, run as run_cmd, scratch, shared_dir,
    Mount,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// GNU tar does not archive sockets: take `special/socket` out of a make-tree tree,
/// keeping its directory's mtime, so the tree is what a tar of it holds.
fn drop_socket(tree: &Path) {
    run_cmd(
        Command::new("python3")
            .args([
                "-c",
                "import os,sys; p=sys.argv[1]; st=os.lstat(p); os.remove(p+'/socket'); \
         os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))",
            ])
            .arg(tree.join("special")),
    );
}

/// `tar --create ARGS -f OUT -C DIR .`
fn gnu_tar(dir: &Path, out: &Path, args: &[&str]) {
    run_cmd(
        Command::new("tar")
            .arg("--create")
            .args(args)
            .arg("-f")
            .arg(out)
            .arg("-C")
            .arg(dir)
            .arg("."),
    );
}

/// `ferofs build -q ARGS IMAGE`, stdin from `stdin` when given.
fn build_tar(args: &[&dyn AsRef<std::ffi::OsStr>], img: &Path, stdin: Option<&Path>) {
    let mut c = ferofs();
    c.arg("build").arg("-q");
    for a in args {
        c.arg(a.as_ref());
    }
    c.arg(img);
    if let Some(s) = stdin {
        c.stdin(std::fs::File::open(s).expect("open stdin file"));
    }
    let out = c.output().expect("run ferofs build");
    assert!(
        out.status.success(),
        "ferofs build {:?} failed: {}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn same_bytes(a: &Path, b: &Path, what: &str) {
    let (x, y) = (
        std::fs::read(a).expect("read image"),
        std::fs::read(b).expect("read image"),
    );
    assert!(x == y, "{what}: {} and {} differ", a.display(), b.display());
}

fn layout(img: &Path, path: &str) -> String {
    let v = json(&ok(&[&"stat", &"--json", &img, &path]));
    v["layout"].as_str().unwrap_or_default().to_string()
}

#[test]
fn tree_tar_zst_from_file_and_stdin_mounts_as_the_tree() {
    if !kernel_available("tree_tar_zst_from_file_and_stdin_mounts_as_the_tree") {
        return;
    }
    let (fs, tree) = make_tree();
    drop_socket(&tree);
    let tar = shared_dir().join("testdata/tree.tar.zst");
    let img = fs.path().join("tar.erofs");
    build_tar(&[&"--tar", &tar], &img, None);
    {
        let m = Mount::erofs(&img);
        assert_same_tree(&tree, m.path());
    }
    let out = ok(&[&"check", &img]);
    assert!(
        out.starts_with("clean: 0 problems; ") && out.contains(" 3239 entries,"),
        "{out}"
    );
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs failed:\n{e}"));
    // Index mode: metadata only, files pointing into the tar, mounted with the tar as
    // an extra device (a block device: this kernel opens `device=` as one), and the
    // image and the tar concatenated mount alone (unified addressing).
    let plain = fs.path().join("tree.tar");
    run_cmd(
        Command::new("zstd")
            .args(["-d", "-q", "-f", "-o"])
            .arg(&plain)
            .arg(&tar),
    );
    let idx = fs.path().join("index.erofs");
    build_tar(&[&"--tar-index", &"--tar", &plain], &idx, None);
    let idx_len = std::fs::metadata(&idx).expect("stat").len();
    assert!(
        idx_len < 2 << 20,
        "index image of {idx_len} bytes holds data"
    );
    let loopdev = run_cmd(
        Command::new("losetup")
            .args(["-f", "--show", "-r"])
            .arg(&plain),
    );
    let loopdev = loopdev.trim().to_string();
    let result = std::panic::catch_unwind(|| {
        let m = scratch("index-mnt");
        run_cmd(
            Command::new("mount")
                .args(["-t", "erofs", "-o"])
                .arg(format!("ro,loop,device={loopdev}"))
                .arg(&idx)
                .arg(m.path()),
        );
        let r = std::panic::catch_unwind(|| assert_same_tree(&tree, m.path()));
        let _ = Command::new("umount").arg(m.path()).status();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    });
    let _ = Command::new("losetup").arg("-d").arg(&loopdev).status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    let both = fs.path().join("index+tar.img");
    let mut joined = std::fs::read(&idx).expect("read index");
    joined.extend_from_slice(&std::fs::read(&plain).expect("read tar"));
    std::fs::write(&both, joined).expect("write");
    {
        let m = Mount::erofs(&both);
        assert_same_tree(&tree, m.path());
    }
    std::fs::remove_file(&both).ok();
    // The same zstd stream on stdin (spooled) gives the same image.
    let img2 = fs.path().join("stdin.erofs");
    build_tar(&[&"--tar", &"-"], &img2, Some(&tar));
    same_bytes(&img, &img2, "tree.tar.zst from stdin");
    let left: Vec<_> = std::fs::read_dir(fs.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("ferofs-spool"))
        .collect();
    assert!(left.is_empty(), "spool left behind: {left:?}");
}

#[test]
fn gnu_tar_formats_and_streams_give_the_directory_build_bytes() {
    if !kernel_available("gnu_tar_formats_and_streams_give_the_directory_build_bytes") {
        return;
    }
    let (fs, tree) = make_tree();
    drop_socket(&tree);
    let d = fs.path();
    let xattrs = ["--xattrs", "--xattrs-include=*", "--acls"];
    // posix with ACLs as text only: SCHILY.acl.* turned into system.posix_acl_*.
    let text_acls = [
        "--format=posix",
        "--sparse",
        "--xattrs",
        "--xattrs-include=*",
        "--xattrs-exclude=system.*",
        "--acls",
    ];
    let tars: Vec<(&str, Vec<&str>)> = vec![
        ("posix-acltext", text_acls.to_vec()),
        ("gnu", [&["--format=gnu", "--sparse"][..], &xattrs].concat()),
        (
            "oldgnu",
            [&["--format=oldgnu", "--sparse"][..], &xattrs].concat(),
        ),
        (
            "posix-0.0",
            [
                &["--format=posix", "--sparse", "--sparse-version=0.0"][..],
                &xattrs,
            ]
            .concat(),
        ),
        (
            "posix-0.1",
            [
                &["--format=posix", "--sparse", "--sparse-version=0.1"][..],
                &xattrs,
            ]
            .concat(),
        ),
        (
            "posix-1.0",
            [
                &["--format=posix", "--sparse", "--sparse-version=1.0"][..],
                &xattrs,
            ]
            .concat(),
        ),
    ];
    let dir_img = d.join("dir.erofs");
    build(&tree, &dir_img, &["-z", "lz4"]);
    {
        let m = Mount::erofs(&dir_img);
        assert_same_tree(&tree, m.path());
    }
    for (name, args) in &tars {
        let t = d.join(format!("{name}.tar"));
        gnu_tar(&tree, &t, args);
        let img = d.join(format!("{name}.erofs"));
        build_tar(&[&"-z", &"lz4", &"--tar", &t], &img, None);
        same_bytes(&dir_img, &img, name);
    }
    // Holes stay holes (chunk-based, null chunks).
    let p10 = d.join("posix-1.0.tar");
    let img = d.join("posix-1.0.erofs");
    for f in ["data/sparse-100MiB.img", "data/sparse-hole-only.img"] {
        assert_eq!(layout(&img, f), "chunk-based", "{f}");
    }
    // Compressed streams, by magic, from a file and from stdin.
    for (tool, ext) in [
        (&["gzip", "-1"][..], "gz"),
        (&["xz", "-0", "-T1"][..], "xz"),
        (&["zstd", "-1", "-q"][..], "zst"),
        (&["bzip2", "-1"][..], "bz2"),
        (&["xz", "--format=lzma", "-0"][..], "lzma"),
    ] {
        let z = d.join(format!("posix.tar.{ext}"));
        let out = Command::new(tool[0])
            .args(&tool[1..])
            .arg("-c")
            .stdin(std::fs::File::open(&p10).expect("open tar"))
            .stdout(std::fs::File::create(&z).expect("create"))
            .status()
            .expect("run compressor");
        assert!(out.success(), "{tool:?}");
        let zi = d.join(format!("{ext}.erofs"));
        build_tar(&[&"-z", &"lz4", &"--tar", &z], &zi, None);
        same_bytes(&dir_img, &zi, ext);
        let si = d.join(format!("{ext}-stdin.erofs"));
        build_tar(&[&"-z", &"lz4", &"--tar", &"-"], &si, Some(&z));
        same_bytes(&dir_img, &si, &format!("{ext} on stdin"));
        std::fs::remove_file(&z).ok();
    }
    // Every build option works the same for tar input: same bytes as the directory.
    let sort = d.join("sort.txt");
    std::fs::write(&sort, "data/random-2MiB.bin\nfiles/readme.txt\n").expect("write");
    let sort = sort.to_string_lossy().into_owned();
    let matrix: Vec<Vec<&str>> = vec![
        vec!["-z", "none"],
        vec!["-E", "smallest"],
        vec!["-z", "zstd", "-C", "65536", "-E", "ztailpacking,dedupe"],
        vec!["-m"],
        vec!["-E", "all-fragments", "-b", "1024"],
        vec!["--all-root", "-T", "5", "--ignore-mtime"],
        vec!["--exclude-path", "data", "--exclude-regex", "^bigdir/1"],
        vec!["-z", "none", "-E", "dedupe,noinline_data", "-j", "1"],
        vec!["--sort", &sort, "-U", "random"],
    ];
    for opts in &matrix {
        let a = d.join("m-dir.erofs");
        let b = d.join("m-tar.erofs");
        build(&tree, &a, opts);
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = opts.iter().map(|s| s as _).collect();
        args.push(&"--tar");
        args.push(&p10);
        build_tar(&args, &b, None);
        if opts.contains(&"random") {
            // Random UUIDs: equal but for the superblock's UUID (and checksum).
            let m = Mount::erofs(&b);
            assert_same_tree(&tree, m.path());
            continue;
        }
        same_bytes(&a, &b, &format!("{opts:?}"));
    }
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs failed:\n{e}"));
}

/// Three OCI-style layers: the make-tree tree (less `overlay/`, whose own whiteouts
/// would mean something in a stack, and less the sparse files, which mkfs.erofs
/// 1.9.3 does not read from PAX), then two layers of whiteouts, opaque directories,
/// replacements and additions.
fn make_layers(tree: &Path, d: &Path) -> Vec<PathBuf> {
    let l2 = d.join("l2");
    let l3 = d.join("l3");
    let mk = |p: PathBuf| std::fs::create_dir_all(p).expect("mkdir");
    let w = |p: PathBuf, b: &str| std::fs::write(p, b).expect("write");
    mk(l2.join("files"));
    mk(l2.join("deep"));
    mk(l2.join("hardlinks"));
    mk(l2.join("links"));
    w(l2.join("files/.wh.readme.txt"), "");
    w(l2.join("files/size-512.txt"), "replaced in layer 2\n");
    w(l2.join(".wh.bigdir"), "");
    w(l2.join("deep/.wh..wh..opq"), "");
    w(l2.join("deep/fresh"), "fresh\n");
    w(l2.join("hardlinks/first"), "not linked any more\n");
    w(l2.join("added"), "added in layer 2\n");
    std::os::unix::fs::symlink("../added", l2.join("links/to-added")).expect("symlink");
    mk(l3.join("bigdir"));
    mk(l3.join("deep"));
    mk(l3.join("xattrs"));
    w(l3.join("bigdir/back"), "bigdir again\n");
    w(l3.join(".wh.added"), "");
    w(l3.join("deep/.wh.fresh"), "");
    w(l3.join("xattrs/.wh..wh..opq"), "");
    w(l3.join("xattrs/only"), "only file left\n");
    xattr::set(l3.join("xattrs/only"), "user.layer", b"3").expect("setxattr");
    for l in [&l2, &l3] {
        run_cmd(Command::new("chmod").arg("-R").arg("go-w").arg(l));
        // Fixed times: the layers' directories are newer than the tree's.
        run_cmd(Command::new("find").arg(l).args([
            "-exec",
            "touch",
            "-h",
            "-d",
            "@1700000000.5",
            "{}",
            "+",
        ]));
    }
    let xa = [
        "--format=posix",
        "--xattrs",
        "--xattrs-include=*",
        "--acls",
        "--numeric-owner",
    ];
    let mut v = Vec::new();
    for (i, (src, extra)) in [
        (
            tree.to_path_buf(),
            vec!["--exclude=./overlay", "--exclude=./data/sparse-*"],
        ),
        (l2, vec![]),
        (l3, vec![]),
    ]
    .into_iter()
    .enumerate()
    {
        let t = d.join(format!("layer{}.tar", i + 1));
        let args: Vec<&str> = extra.iter().copied().chain(xa).collect();
        gnu_tar(&src, &t, &args);
        v.push(t);
    }
    v
}

/// mkfs.erofs 1.9.3 (tar input needs 1.7+; Debian's 1.5 has none): `$FEROFS_MKFS_EROFS`
/// or the anchors build beside `shared/`.
fn mkfs_erofs_193() -> Option<PathBuf> {
    std::env::var_os("FEROFS_MKFS_EROFS")
        .map(PathBuf::from)
        .into_iter()
        .chain([shared_dir().join("../anchors/erofs-utils/bin/mkfs.erofs")])
        .find(|p| p.is_file())
}

#[test]
fn aufs_layers_match_mkfs_erofs_and_a_flattened_stack_matches_overlayfs() {
    if !kernel_available("aufs_layers_match_mkfs_erofs_and_a_flattened_stack_matches_overlayfs") {
        return;
    }
    let (fs, tree) = make_tree();
    let d = fs.path();
    let layers = make_layers(&tree, d);
    let mkfs = mkfs_erofs_193();
    let mut ours = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        // containerd's command line, with the layer on stdin.
        let img = d.join(format!("ours{}.erofs", i + 1));
        build_tar(
            &[
                &"--tar",
                &"-",
                &"--aufs",
                &"-E",
                &"noinline_data",
                &"--sort",
                &"none",
            ],
            &img,
            Some(l),
        );
        match &mkfs {
            Some(m) => {
                let theirs = d.join(format!("mkfs{}.erofs", i + 1));
                run_cmd(
                    Command::new(m)
                        .args([
                            "--tar=f",
                            "--aufs",
                            "--quiet",
                            "-Enoinline_data",
                            "--sort=none",
                        ])
                        .arg(&theirs)
                        .stdin(std::fs::File::open(l).expect("open layer")),
                );
                let (a, b) = (Mount::erofs(&theirs), Mount::erofs(&img));
                // mkfs.erofs 1.9.3 drops the nanoseconds of PAX mtimes: seconds here.
                let out = Command::new("python3")
                    .arg(shared_dir().join("testdata/treecmp.py"))
                    .arg("--mtime-sec")
                    .arg(a.path())
                    .arg(b.path())
                    .output()
                    .expect("treecmp");
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    text.trim_end().ends_with(" 0 differences"),
                    "layer {}: mkfs.erofs --aufs vs ours:\n{text}",
                    i + 1
                );
            }
            None => eprintln!(
                "SKIPPED mkfs.erofs comparison: no mkfs.erofs 1.9.3 (set FEROFS_MKFS_EROFS)"
            ),
        }
        ours.push(img);
    }
    // The layer images stacked by overlayfs (the kernel applying whiteouts and opaque
    // directories) against our flattened stack.
    let mounts: Vec<Mount> = ours.iter().map(|i| Mount::erofs(i)).collect();
    let lower = mounts
        .iter()
        .rev()
        .map(|m| m.path().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let ov = scratch("overlay");
    run_cmd(
        Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!("lowerdir={lower}"))
            .arg(ov.path()),
    );
    let flat = d.join("flat.erofs");
    build_tar(
        &[
            &"--tar", &layers[0], &"--tar", &layers[1], &"--tar", &layers[2],
        ],
        &flat,
        None,
    );
    // The reference a container runtime's unpacker gives: each layer extracted in
    // order by GNU tar, its whiteouts applied first to what the lower layers left
    // (`.wh.NAME` removes NAME, `.wh..wh..opq` empties its directory), the markers
    // themselves not extracted. One difference between unpacking and stacking is
    // real and left out: tar (like containerd's applier) keeps a lower layer's xattrs
    // on a directory an upper layer lists again, where overlayfs shows the upper
    // directory's alone; the reference drops them before each layer.
    let unpacked = scratch("unpacked");
    for l in &layers {
        let list = Command::new("tar")
            .arg("-tf")
            .arg(l)
            .output()
            .expect("tar -t");
        assert!(list.status.success(), "tar -t {}", l.display());
        for name in String::from_utf8_lossy(&list.stdout).lines() {
            if name.ends_with('/') {
                let d = unpacked.path().join(name.trim_start_matches("./"));
                for x in xattr::list(&d).into_iter().flatten() {
                    xattr::remove(&d, &x).expect("drop a lower layer's directory xattr");
                }
                continue;
            }
            let p = Path::new(name.trim_start_matches("./"));
            let (Some(dir), Some(base)) = (p.parent(), p.file_name()) else {
                continue;
            };
            let base = base.to_string_lossy();
            let target = unpacked.path().join(dir);
            if base == ".wh..wh..opq" {
                for e in std::fs::read_dir(&target).into_iter().flatten().flatten() {
                    let q = e.path();
                    if q.is_dir() && !q.is_symlink() {
                        std::fs::remove_dir_all(&q).expect("opaque: rmdir");
                    } else {
                        std::fs::remove_file(&q).expect("opaque: rm");
                    }
                }
            } else if let Some(gone) = base.strip_prefix(".wh.") {
                let q = target.join(gone);
                if q.is_dir() && !q.is_symlink() {
                    std::fs::remove_dir_all(&q).expect("whiteout: rmdir");
                } else if q.symlink_metadata().is_ok() {
                    std::fs::remove_file(&q).expect("whiteout: rm");
                }
            }
        }
        run_cmd(
            Command::new("tar")
                .args([
                    "--extract",
                    "--xattrs",
                    "--xattrs-include=*",
                    "--acls",
                    "--numeric-owner",
                    "--same-permissions",
                    "--exclude=.wh.*",
                    "-f",
                ])
                .arg(l)
                .arg("-C")
                .arg(unpacked.path()),
        );
    }
    let result = std::panic::catch_unwind(|| {
        let f = Mount::erofs(&flat);
        assert!(!f.path().join("bigdir/0").exists() && f.path().join("bigdir/back").exists());
        assert!(!f.path().join("added").exists() && !f.path().join("deep/level-01").exists());
        assert!(!f.path().join("files/readme.txt").exists());
        assert_same_tree(ov.path(), f.path());
        // The overlayfs stack of the layer images equals the unpacked layers.
        assert_same_tree(unpacked.path(), ov.path());
    });
    let _ = Command::new("umount").arg(ov.path()).status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    // --ovlfs-strip: no whiteouts, no opaque markers.
    let strip = d.join("strip.erofs");
    build_tar(
        &[&"--tar", &layers[1], &"--aufs", &"--ovlfs-strip"],
        &strip,
        None,
    );
    let ls = ok(&[&"ls", &strip, &"files"]);
    assert!(!ls.contains("readme.txt"), "{ls}");
    let v = json(&ok(&[&"stat", &"--json", &strip, &"deep"]));
    assert_eq!(v["xattrs"], serde_json::json!([]), "{v}");
    let v = json(&ok(&[&"stat", &"--json", &ours[1], &"deep"]));
    assert!(
        v["xattrs"].to_string().contains("trusted.overlay.opaque"),
        "{v}"
    );
    drop(mounts);
    // --ovlfs-strip on a directory (the tree's overlay/ holds a whiteout and an opaque
    // directory): as mkfs.erofs 1.9.3 strips them.
    let sd = d.join("strip-dir.erofs");
    build(&tree, &sd, &["--ovlfs-strip", "-z", "lz4"]);
    let ls = ok(&[&"ls", &sd, &"overlay"]);
    assert!(
        !ls.contains("whiteout") && ls.contains("opaque-dir"),
        "{ls}"
    );
    let v = json(&ok(&[&"stat", &"--json", &sd, &"overlay/opaque-dir"]));
    assert_eq!(v["xattrs"], serde_json::json!([]), "{v}");
    if let Some(m) = &mkfs {
        let theirs = d.join("strip-dir-mkfs.erofs");
        run_cmd(
            Command::new(m)
                .args(["--quiet", "--ovlfs-strip=1", "-zlz4"])
                .arg(&theirs)
                .arg(&tree),
        );
        let (a, b) = (Mount::erofs(&theirs), Mount::erofs(&sd));
        let out = Command::new("python3")
            .arg(shared_dir().join("testdata/treecmp.py"))
            .arg("--mtime-sec")
            .arg(a.path())
            .arg(b.path())
            .output()
            .expect("treecmp");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.trim_end().ends_with(" 0 differences"),
            "--ovlfs-strip on a directory:\n{text}"
        );
    }
}

/// Archives written by Python's tarfile: (name, python statements using `t`, a
/// TarFile, and helpers `f(name, data, **attrs)`).
fn py_tar(path: &Path, fmt: &str, body: &str) {
    let script = format!(
        "import tarfile, io, sys\n\
         t = tarfile.open(sys.argv[1], 'w', format=tarfile.{fmt})\n\
         def f(name, data=b'', **kw):\n\
         \x20   ti = tarfile.TarInfo(name); ti.size = len(data); ti.mtime = 1000\n\
         \x20   for k, v in kw.items(): setattr(ti, k, v)\n\
         \x20   t.addfile(ti, io.BytesIO(data))\n\
         {body}\n\
         t.close()\n"
    );
    run_cmd(Command::new("python3").arg("-c").arg(script).arg(path));
}

fn cat(img: &Path, p: &str) -> String {
    ok(&[&"cat", &img, &p])
}

#[test]
fn tar_rules_last_wins_hardlinks_ids_times_implicit_dirs() {
    let d = scratch("tar-rules");
    let t = d.path().join("rules.tar");
    py_tar(
        &t,
        "GNU_FORMAT",
        "f('dup', b'first')\n\
         f('dup', b'second!')\n\
         f('/abs/file', b'abs')\n\
         f('./a', b'version 1')\n\
         ti = tarfile.TarInfo('b'); ti.type = tarfile.LNKTYPE; ti.linkname = 'a'; t.addfile(ti)\n\
         f('a', b'version 2')\n\
         f('big-ids', b'x', uid=3000000000, gid=2**31, mtime=1700000000)\n\
         f('implicit/dir/leaf', b'leaf', mtime=1800000000)\n\
         ti = tarfile.TarInfo('dev'); ti.type = tarfile.CHRTYPE; ti.devmajor = 4095; ti.devminor = 1048575; t.addfile(ti)",
    );
    let img = d.path().join("rules.erofs");
    build_tar(&[&"-z", &"none", &"--tar", &t], &img, None);
    assert_eq!(cat(&img, "dup"), "second!");
    assert_eq!(cat(&img, "abs/file"), "abs");
    // `b` links the inode `a` had; `a` was replaced afterwards.
    assert_eq!(cat(&img, "b"), "version 1");
    assert_eq!(cat(&img, "a"), "version 2");
    let st = |p: &str| json(&ok(&[&"stat", &"--json", &img, &p]));
    assert_eq!(st("b")["nlink"], 1);
    let v = st("big-ids");
    assert_eq!(
        (v["uid"].as_u64(), v["gid"].as_u64()),
        (Some(3000000000), Some(1 << 31))
    );
    let v = st("implicit/dir");
    assert_eq!(v["mode"], "0755");
    assert_eq!(
        (v["uid"].as_u64(), v["mtime"].as_i64()),
        (Some(0), Some(1800000000))
    );
    let v = st("dev");
    assert_eq!(v["type"], "char-device", "{v}");
    assert_eq!(
        (v["rdev"]["major"].as_u64(), v["rdev"]["minor"].as_u64()),
        (Some(4095), Some(1048575))
    );
    // PAX: ns mtimes, SCHILY and LIBARCHIVE xattrs, a text ACL, long names.
    let p = d.path().join("pax.tar");
    let long = format!("{}/{}", "d".repeat(200), "n".repeat(200));
    py_tar(
        &p,
        "PAX_FORMAT",
        &format!(
            "f('ns', b'ns', pax_headers={{'mtime': '-1.25', 'SCHILY.xattr.user.s': 'schily', \
             'LIBARCHIVE.xattr.user.l%40b': 'bGliYXJjaGl2ZQ==', \
             'SCHILY.acl.access': 'user::rw-\\nuser:1234:r--\\ngroup::r--\\nmask::r--\\nother::---\\n'}})\n\
             f('{long}', b'long')"
        ),
    );
    let img = d.path().join("pax.erofs");
    build_tar(&[&"--tar", &p], &img, None);
    let v = json(&ok(&[&"stat", &"--json", &img, &"ns"]));
    assert_eq!(
        (v["mtime"].as_i64(), v["mtime_nsec"].as_u64()),
        (Some(-2), Some(750_000_000))
    );
    let x = v["xattrs"].to_string();
    assert!(x.contains("\"user.s\"") && x.contains("schily"), "{x}");
    assert!(
        x.contains("\"user.l@b\"") && x.contains("libarchive"),
        "{x}"
    );
    // Version 2, then (tag, perm, id) sorted: user::rw- user:1234:r-- group::r--
    // mask::r-- other::---.
    let acl = [
        "02000000", "0100", "0600", "ffffffff", "0200", "0400", "d2040000", "0400", "0400",
        "ffffffff", "1000", "0400", "ffffffff", "2000", "0000", "ffffffff",
    ]
    .concat();
    assert!(x.contains(&format!("\"{acl}\"")), "{x}");
    assert_eq!(cat(&img, &long), "long");
}

#[test]
fn hostile_tars_fail_naming_the_entry_and_leave_nothing() {
    let d = scratch("tar-hostile");
    let dir = d.path();
    let good = dir.join("good.tar");
    py_tar(
        &good,
        "USTAR_FORMAT",
        "f('f1', b'A' * 5000)\nf('f2', b'B' * 3000)",
    );
    let bytes = std::fs::read(&good).expect("read");
    let w = |n: &str, b: &[u8]| {
        let p = dir.join(n);
        std::fs::write(&p, b).expect("write");
        p
    };
    let trav = dir.join("trav.tar");
    py_tar(
        &trav,
        "USTAR_FORMAT",
        "f('ok', b'1')\nf('a/../../evil', b'x')",
    );
    let link = dir.join("link.tar");
    py_tar(
        &link,
        "USTAR_FORMAT",
        "ti = tarfile.TarInfo('l'); ti.type = tarfile.LNKTYPE; ti.linkname = 'nowhere'; t.addfile(ti)",
    );
    // f2's header starts after f1's header and 5120 bytes of data.
    let trunc_hdr = w("trunc-hdr.tar", &bytes[..512 + 5120 + 100]);
    let trunc_data = w("trunc-data.tar", &bytes[..512 + 2000]);
    // A header claiming 8 GiB, and a PAX header claiming 1 GiB.
    let mut huge = bytes[..512].to_vec();
    huge[..100].fill(0);
    huge[..4].copy_from_slice(b"huge");
    huge[124..136].copy_from_slice(b"77777777777\0");
    let mut pax = huge.clone();
    pax[..4].copy_from_slice(b"paxh");
    pax[156] = b'x';
    pax[124..136].copy_from_slice(b"10000000000\0");
    for h in [&mut huge, &mut pax] {
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h.extend_from_slice(&[b'x'; 2048]);
    }
    let huge = w("huge.tar", &huge);
    let pax = w("pax.tar", &pax);
    let mut flipped = bytes.clone();
    flipped[512 + 5120 + 10] ^= 1; // f2's name
    let badsum = w("badsum.tar", &flipped);
    let odd = dir.join("odd.tar");
    py_tar(
        &odd,
        "PAX_FORMAT",
        "f('fine', b'1')\n\
         ti = tarfile.TarInfo('longlink'); ti.type = tarfile.SYMTYPE; ti.linkname = 'x' * 5000; t.addfile(ti)",
    );
    let dev = dir.join("dev.tar");
    py_tar(
        &dev,
        "USTAR_FORMAT",
        "ti = tarfile.TarInfo('dev'); ti.type = tarfile.BLKTYPE; ti.devmajor = 4096; t.addfile(ti)",
    );
    // An .lzma stream whose header asks for a 2 GiB dictionary: refused, not
    // allocated.
    let mut lz = vec![0x5d, 0, 0, 0, 0x80];
    lz.extend([0xff; 8]);
    lz.extend([0; 2000]);
    let lzma = w("dict.tar.lzma", &lz);
    let cases: [(&Path, &[&str]); 10] = [
        (&lzma, &["lzma stream", "memory limit"]),
        (&badsum, &["bad header checksum", "tar byte 5632", "\"f1\""]),
        (&odd, &["\"longlink\"", "symlink target of 5000 bytes"]),
        (&dev, &["\"dev\"", "device number 4096:0"]),
        (&trav, &["a/../../evil", "\"..\""]),
        (&link, &["\"l\"", "nowhere"]),
        (
            &trunc_hdr,
            &["truncated archive", "header at tar byte 5632", "\"f1\""],
        ),
        (&trunc_data, &["truncated archive", "\"f1\""]),
        (&huge, &["truncated archive", "\"huge\"", "8589934591"]),
        (&pax, &["extended header of 1073741824 bytes"]),
    ];
    let img = dir.join("out.erofs");
    for (tar, want) in cases {
        for stdin in [false, true] {
            let mut c = ferofs();
            c.args(["build", "-q", "--tar"]);
            if stdin {
                c.arg("-").stdin(std::fs::File::open(tar).expect("open"));
            } else {
                c.arg(tar).stdin(Stdio::null());
            }
            let out = c.arg(&img).output().expect("run");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{} accepted", tar.display());
            for w in want {
                assert!(
                    err.contains(w),
                    "{} (stdin {stdin}): {w:?} not in: {err}",
                    tar.display()
                );
            }
            let names: Vec<String> = std::fs::read_dir(dir)
                .expect("ls")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".tar") && !n.ends_with(".lzma"))
                .collect();
            assert!(names.is_empty(), "left behind: {names:?} ({err})");
        }
    }
    build_tar(&[&"--tar", &good], &img, None);
    assert_eq!(cat(&img, "f2"), "B".repeat(3000));
}

#[test]
fn tar_index_mode_refuses_what_it_cannot_point_at() {
    let d = scratch("tar-index");
    let dir = d.path();
    let t = dir.join("a.tar");
    py_tar(&t, "USTAR_FORMAT", "f('f', b'x' * 1000)");
    let sparse_dir = dir.join("sp");
    std::fs::create_dir(&sparse_dir).expect("mkdir");
    let f = std::fs::File::create(sparse_dir.join("holes")).expect("create");
    f.set_len(1 << 20).expect("truncate");
    drop(f);
    std::fs::write(sparse_dir.join("data"), b"data").expect("write");
    let sp = dir.join("sparse.tar");
    gnu_tar(&sparse_dir, &sp, &["--format=posix", "--sparse"]);
    let gz = dir.join("a.tar.gz");
    run_cmd(Command::new("sh").arg("-c").arg(format!(
        "gzip -c {} > {}",
        t.display(),
        gz.display()
    )));
    let img = dir.join("out.erofs");
    let cases: [(Vec<&dyn AsRef<std::ffi::OsStr>>, &str); 4] = [
        (vec![&"--tar-index", &"--tar", &gz], "uncompressed tar"),
        (
            vec![&"--tar-index", &"-b", &"4096", &"--tar", &t],
            "512-byte blocks",
        ),
        (vec![&"--tar-index", &"--tar", &sp], "sparse file"),
        (vec![&"--tar-index", &"--tar", &t, &"--tar", &t], "one tar"),
    ];
    for (args, want) in cases {
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"build", &"-q"];
        all.extend(args);
        all.push(&img);
        let out = run(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{want}: {err}");
        assert!(!img.exists());
    }
    // What it can point at: an index image of 512-byte blocks, no data in it.
    build_tar(&[&"--tar-index", &"--tar", &t], &img, None);
    let v = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(v["block_size"], 512, "{v}");
    assert!(std::fs::metadata(&img).expect("stat").len() < 4096);
}

#[test]
fn gnu_sparse_maps_longer_than_the_header_holds() {
    // 12 data segments: the old GNU header holds 4, the rest go to extension blocks,
    // which come before the data and are not counted in its size.
    let d = scratch("tar-sparse-ext");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let f = src.join("many");
    run_cmd(Command::new("python3").arg("-c").arg(format!(
        "f = open({:?}, 'wb')\n\
         for i in range(12):\n\
         \x20   f.seek(i * 65536); f.write(b'seg%d' % i * 100)\n\
         f.truncate(12 * 65536 + 5000)",
        f.display().to_string()
    )));
    let want = std::fs::read(&f).expect("read");
    for fmt in ["gnu", "oldgnu"] {
        let t = d.path().join(format!("{fmt}.tar"));
        gnu_tar(&src, &t, &[&format!("--format={fmt}"), "--sparse"]);
        let img = d.path().join(format!("{fmt}.erofs"));
        build_tar(&[&"-z", &"none", &"--tar", &t], &img, None);
        let out = run(&[&"cat", &img, &"many"]);
        assert!(
            out.status.success() && out.stdout == want,
            "{fmt}: contents differ"
        );
        assert_eq!(layout(&img, "many"), "chunk-based", "{fmt}");
    }
}

#[test]
fn a_streamed_archive_is_spooled_not_held() {
    // 256 MiB of file data on stdin: peak memory stays far below it (the contents go
    // to a spool file beside the output), with and without compression.
    let d = scratch("tar-stream");
    let img = d.path().join("big.erofs");
    for z in ["none", "lz4"] {
        let mut gen = Command::new("python3")
            .arg("-c")
            .arg(
                "import sys, tarfile\n\
                 n = 256 << 20\n\
                 ti = tarfile.TarInfo('big'); ti.size = n; ti.mtime = 1\n\
                 out = sys.stdout.buffer\n\
                 out.write(ti.tobuf(format=tarfile.USTAR_FORMAT))\n\
                 blk = bytes(range(256)) * 4096\n\
                 for i in range(n // len(blk)): out.write(blk)\n\
                 out.write(b'\\0' * 1024)",
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3");
        let out = ferofs()
            .args(["build", "--json", "-z", z, "--tar", "-"])
            .arg(&img)
            .stdin(gen.stdout.take().expect("pipe"))
            .output()
            .expect("run ferofs");
        assert!(gen.wait().expect("wait python3").success());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(v["bytes_in"], 256u64 << 20);
        let rss = v["peak_rss_bytes"].as_u64().expect("peak_rss_bytes");
        assert!(rss < 128 << 20, "-z {z}: peak RSS {rss} bytes");
        let names: Vec<String> = std::fs::read_dir(d.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["big.erofs"], "spool left behind");
        std::fs::remove_file(&img).expect("rm");
    }
}

/// A headerball (mkfs.erofs's `--tar=headerball`): headers only, no file data. The
/// image holds every entry with its metadata and xattrs, each regular file its size of
/// zeros as a hole; it equals mkfs.erofs 1.9.3's (but for the tar-implied root's mode,
/// which mkfs.erofs makes 0777), mounts, and reads as zeros.
#[test]
fn a_headerball_gives_files_their_size_and_no_data() {
    let d = scratch("tar-headerball");
    let dir = d.path();
    let hb = dir.join("hb.tar");
    run_cmd(
        Command::new("python3")
            .arg("-c")
            .arg(
                "import tarfile, sys\n\
         t = tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT)\n\
         def e(name, typ=tarfile.REGTYPE, size=0, **kw):\n\
         \x20   ti = tarfile.TarInfo(name); ti.type = typ; ti.size = size; ti.mtime = 1700000000\n\
         \x20   for k, v in kw.items(): setattr(ti, k, v)\n\
         \x20   t.addfile(ti)  # the header only, whatever its size says\n\
         e('usr', tarfile.DIRTYPE, mode=0o755)\n\
         e('usr/bin', tarfile.DIRTYPE, mode=0o755)\n\
         e('usr/bin/tool', size=1234567, mode=0o755, uid=7, gid=8, pax_headers={\n\
         \x20   'SCHILY.xattr.trusted.overlay.redirect': '/ab/cdef0123',\n\
         \x20   'SCHILY.xattr.trusted.overlay.metacopy': ''})\n\
         e('usr/bin/empty', mode=0o644)\n\
         e('usr/bin/small', size=10, mode=0o600)\n\
         e('usr/bin/tool2', tarfile.LNKTYPE, linkname='usr/bin/tool')\n\
         e('usr/bin/sh', tarfile.SYMTYPE, linkname='tool', mode=0o777)\n\
         e('null', tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)\n\
         e('big', size=5 << 30, mode=0o644)\n\
         t.close()\n",
            )
            .arg(&hb),
    );
    assert_eq!(std::fs::metadata(&hb).expect("stat").len(), 10240);
    let img = dir.join("hb.erofs");
    ok(&[&"build", &"-q", &"--tar-headerball", &"--tar", &hb, &img]);
    let listing = ok(&[&"ls", &"-R", &img]);
    let lines: Vec<&str> = listing.lines().collect();
    let want = [
        ("-rw-r--r--   1     0     0 5368709120", "/big"),
        ("crw-rw-rw-   1     0     0       1, 3", "/null"),
        ("-rw-r--r--   1     0     0          0", "/usr/bin/empty"),
        (
            "lrwxrwxrwx   1     0     0          4",
            "/usr/bin/sh -> tool",
        ),
        ("-rw-------   1     0     0         10", "/usr/bin/small"),
        ("-rwxr-xr-x   2     7     8    1234567", "/usr/bin/tool"),
        ("-rwxr-xr-x   2     7     8    1234567", "/usr/bin/tool2"),
    ];
    for (meta, path) in want {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(meta) && l.ends_with(&format!(" {path}"))),
            "{meta} {path} not in:\n{listing}"
        );
    }
    assert_eq!(lines.len(), 10, "{listing}");
    let st = json(&ok(&[&"stat", &"--json", &img, &"/usr/bin/tool"]));
    assert_eq!(st["layout"], "chunk-based");
    let names: Vec<&str> = st["xattrs"]
        .as_array()
        .expect("xattrs")
        .iter()
        .map(|x| x["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        ["trusted.overlay.metacopy", "trusted.overlay.redirect"],
        "{st}"
    );
    assert_eq!(
        ferofs()
            .args(["cat"])
            .arg(&img)
            .arg("/usr/bin/small")
            .output()
            .expect("cat")
            .stdout,
        [0u8; 10]
    );
    // Every block of it is metadata: no data blocks for 5 GiB of zeros.
    assert!(std::fs::metadata(&img).expect("stat").len() <= 2 * 4096);
    ok(&[&"check", &img]);
    // From stdin, the same bytes.
    let img2 = dir.join("hb-stdin.erofs");
    build_tar(&[&"--tar-headerball", &"--tar", &"-"], &img2, Some(&hb));
    same_bytes(&img, &img2, "headerball on stdin");
    // Without the flag the headers after a file are taken for its data: refused.
    let out = ferofs()
        .args(["build", "-q", "--tar"])
        .arg(&hb)
        .arg(dir.join("no.erofs"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    // The drop-in, and mkfs.erofs 1.9.3 where it is built: the same tree.
    let img3 = dir.join("hb-dropin.erofs");
    ok(&[&"mkfs", &"--tar=headerball", &"--quiet", &img3, &hb]);
    assert_eq!(
        ok(&[&"ls", &"-R", &img3]),
        listing,
        "the drop-in's headerball"
    );
    if let Some(m) = mkfs_erofs_193() {
        let theirs = dir.join("hb-mkfs.erofs");
        run_cmd(
            Command::new(m)
                .arg("--tar=headerball")
                .arg("--quiet")
                .arg(&theirs)
                .arg(&hb),
        );
        let their = ok(&[&"ls", &"-R", &theirs]);
        assert_eq!(
            their.lines().skip(1).collect::<Vec<_>>(),
            lines[1..],
            "mkfs.erofs 1.9.3's headerball"
        );
    }
    if kernel_available("a_headerball_gives_files_their_size_and_no_data") {
        let m = Mount::erofs(&img);
        let md = std::fs::metadata(m.path().join("usr/bin/tool")).expect("stat");
        assert_eq!(md.len(), 1_234_567);
        let data = std::fs::read(m.path().join("usr/bin/tool")).expect("read");
        assert!(data.iter().all(|&b| b == 0));
        assert_eq!(
            xattr::get(m.path().join("usr/bin/tool"), "trusted.overlay.redirect")
                .expect("getxattr"),
            Some(b"/ab/cdef0123".to_vec())
        );
    }
    // A sparse entry's map is data: a headerball cannot hold one.
    refuses_a_sparse_entry(dir, "--tar-headerball", "sparse file in a headerball");
}

/// The lines of a block map: (first block, blocks, source offset, zeros at the end).
fn parse_block_map(text: &str) -> Vec<(u64, u64, u64, u64)> {
    text.lines()
        .map(|l| {
            // mkfs.erofs's `%08x %8x %08x[ %08u]`.
            assert!(l.len() == 26 || l.len() == 35, "line {l:?}");
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
            let zeroed = match f.get(3) {
                Some(z) => {
                    assert_eq!(z.len(), 8, "{l:?}");
                    z.parse().expect("decimal")
                }
                None => 0,
            };
            (hex(f[0]), hex(f[1]), hex(f[2]), zeroed)
        })
        .collect()
}

/// `--reserve-data` (mkfs.erofs's `--clean=rvsp`): every non-empty regular file gets
/// contiguous plain blocks holding zeros (a hole in the image file), even in a
/// compressed image; the block map says where each file's data is in the tar; copying
/// it there makes the image the tree (kernel mount). The drop-in's `--tar=f,MAP
/// --clean=rvsp` writes the same map, and mkfs.erofs 1.9.3 reserves the same files.
#[test]
fn reserved_data_is_filled_in_from_the_block_map() {
    let (fs, tree) = make_tree();
    drop_socket(&tree);
    let dir = fs.path();
    let zst = shared_dir().join("testdata/tree.tar.zst");
    let tar = dir.join("tree.tar");
    run_cmd(
        Command::new("zstd")
            .args(["-d", "-q", "-f", "-o"])
            .arg(&tar)
            .arg(&zst),
    );
    let img = dir.join("rvsp.erofs");
    let map = dir.join("rvsp.map");
    // The compressed stream: offsets are in the tar it decompresses to.
    build_tar(
        &[
            &"-z",
            &"lz4hc",
            &"--reserve-data",
            &"--block-map",
            &map,
            &"--tar",
            &zst,
        ],
        &img,
        None,
    );
    let text = std::fs::read_to_string(&map).expect("read map");
    let lines = parse_block_map(&text);
    // One line per non-empty regular file (hardlinks share one), contiguous from
    // block 1 in block order.
    let listing = ok(&[&"ls", &"-R", &"--json", &img]);
    let mut nids = std::collections::BTreeMap::new();
    let mut reg = 0;
    for e in json(&listing).as_array().expect("array") {
        let size = e["size"].as_u64().expect("size");
        if e["type"] == "file" && size > 0 {
            nids.insert(e["nid"].as_u64().expect("nid"), size);
            reg += 1;
        }
    }
    assert!(reg > 1000, "{reg} files");
    assert_eq!(lines.len(), nids.len(), "{text}");
    let mut next = 1;
    for &(blk, n, _, zeroed) in &lines {
        assert_eq!(blk, next, "{text}");
        assert!(n > 0 && zeroed < 4096);
        next += n;
    }
    let st = json(&ok(&[&"stat", &"--json", &img, &"/acl/file-acl"]));
    assert_eq!(st["layout"], "flat-plain", "{st}");
    let cat = |img: &Path, p: &str| {
        ferofs()
            .arg("cat")
            .arg(img)
            .arg(p)
            .output()
            .expect("cat")
            .stdout
    };
    assert_eq!(cat(&img, "/acl/file-acl"), [0u8; 11]);
    // Unwritten: the image file's reserved blocks take no disk space.
    let reserved: u64 = lines.iter().map(|l| l.1).sum::<u64>() * 4096;
    let md = std::fs::metadata(&img).expect("stat");
    use std::os::unix::fs::MetadataExt;
    assert!(
        md.blocks() * 512 + reserved / 2 < md.len(),
        "{} bytes on disk of {}, {reserved} reserved",
        md.blocks() * 512,
        md.len()
    );
    assert!(ok(&[&"check", &img]).starts_with("clean: 0 problems; "));
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs failed:\n{e}"));
    // Fill it in.
    {
        use std::os::unix::fs::FileExt;
        let t = std::fs::File::open(&tar).expect("open tar");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .expect("open image");
        for &(blk, n, at, zeroed) in &lines {
            let mut b = vec![0u8; (n * 4096 - zeroed) as usize];
            t.read_exact_at(&mut b, at).expect("read tar");
            f.write_all_at(&b, blk * 4096).expect("write image");
        }
    }
    assert_eq!(
        cat(&img, "/acl/file-acl"),
        std::fs::read(tree.join("acl/file-acl")).expect("read")
    );
    assert!(ok(&[&"check", &img]).starts_with("clean: 0 problems; "));
    if kernel_available("reserved_data_is_filled_in_from_the_block_map") {
        let m = Mount::erofs(&img);
        assert_same_tree(&tree, m.path());
    }
    // The build report counts the reserved bytes.
    let rep = json(&ok(&[
        &"build",
        &"--json",
        &"--reserve-data",
        &"--tar",
        &tar,
        &dir.join("report.erofs"),
    ]));
    assert_eq!(
        rep["reserved_bytes"].as_u64(),
        Some(nids.values().sum::<u64>())
    );
    assert_eq!(rep["bytes_in"], 0);
    // The drop-in: the same map.
    let img2 = dir.join("dropin.erofs");
    let map2 = dir.join("dropin.map");
    let mut a = std::ffi::OsString::from("--tar=f,");
    a.push(&map2);
    ok(&[
        &"mkfs",
        &"-zlz4hc",
        &a,
        &"--clean=rvsp",
        &"--quiet",
        &img2,
        &tar,
    ]);
    assert_eq!(std::fs::read_to_string(&map2).expect("read map"), text);
    // Index mode with a map file reserves the same blocks (uncompressed: the same).
    let mut a = std::ffi::OsString::from("--tar=i,");
    a.push(&map2);
    ok(&[&"mkfs", &a, &"--quiet", &img2, &tar]);
    assert_eq!(std::fs::read_to_string(&map2).expect("read map"), text);
    // mkfs.erofs 1.9.3 reserves the same files (its blocks in its own order).
    if let Some(m) = mkfs_erofs_193() {
        let img3 = dir.join("mkfs.erofs");
        let map3 = dir.join("mkfs.map");
        let mut a = std::ffi::OsString::from("--tar=f,");
        a.push(&map3);
        run_cmd(
            Command::new(m)
                .args(["-zlz4hc", "--clean=rvsp", "--quiet"])
                .arg(a)
                .arg(&img3)
                .arg(&tar),
        );
        let key = |v: Vec<(u64, u64, u64, u64)>| {
            let mut k: Vec<_> = v.into_iter().map(|l| (l.2, l.1, l.3)).collect();
            k.sort();
            k
        };
        assert_eq!(
            key(parse_block_map(
                &std::fs::read_to_string(&map3).expect("read")
            )),
            key(lines)
        );
    }
    // Sparse entries have no tar offset to fill from: refused.
    refuses_a_sparse_entry(dir, "--reserve-data", "cannot have its space reserved");
}

/// A GNU sparse (`S`) entry built with `flag` fails with `why` and leaves no image.
fn refuses_a_sparse_entry(dir: &Path, flag: &str, why: &str) {
    let sp = dir.join("sparse.tar");
    py_tar(&sp, "GNU_FORMAT", "f('a', b'x')");
    let mut b = std::fs::read(&sp).expect("read");
    b[156] = b'S';
    b[148..156].fill(b' ');
    let sum: u32 = b[..512].iter().map(|&x| u32::from(x)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    std::fs::write(&sp, &b).expect("write");
    let img = dir.join("sp.erofs");
    let out = ferofs()
        .args(["build", "-q", flag, "--tar"])
        .arg(&sp)
        .arg(&img)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(why),
        "{flag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!img.exists());
}

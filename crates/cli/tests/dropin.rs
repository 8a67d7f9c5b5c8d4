//! Drop-in command lines: the binary run as `mkfs.erofs` (a symlink) or as
//! `ferofs mkfs` takes mkfs.erofs's command line and builds the same image as the
//! equivalent `ferofs build`; options it does not implement are errors naming them.

mod common;
use common::*;
use ferofs_testkit::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// A small tree with a file, a symlink, a directory and an OCI whiteout.
fn tree(root: &Path) {
    std::fs::create_dir_all(root.join("etc/opt")).expect("mkdir");
    std::fs::write(root.join("etc/hostname"), b"ferofs\n").expect("write");
    let text: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("{i} ").into_bytes())
        .collect();
    std::fs::write(root.join("etc/opt/big.txt"), &text).expect("write");
    std::os::unix::fs::symlink("hostname", root.join("etc/name")).expect("symlink");
    std::fs::write(root.join("etc/.wh.gone"), b"").expect("write");
}

fn gid_of(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).expect("stat").gid()
}

/// Run the `mkfs.erofs` symlink `mkfs` with `args`, then IMAGE and SOURCE; it must
/// succeed.
fn mkfs_ok(mkfs: &Path, args: &[&str], img: &Path, src: &Path) {
    let out = Command::new(mkfs)
        .args(args)
        .arg(img)
        .arg(src)
        .output()
        .expect("run mkfs.erofs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A symlink `name` to the ferofs binary in `dir`.
fn tool_symlink(dir: &Path, name: &str) -> std::path::PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferofs"), &link).expect("symlink");
    link
}

#[test]
fn containerd_command_line_on_stdin_builds_what_ferofs_build_builds() {
    let d = scratch("dropin-containerd");
    let src = d.path().join("src");
    tree(&src);
    let layer = d.path().join("layer.tar");
    let st = Command::new("tar")
        .args(["--format=posix", "--sort=name", "-cf"])
        .arg(&layer)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success());
    let uuid = "c0ffee00-0000-4000-8000-000000000001";
    let mkfs = tool_symlink(d.path(), "mkfs.erofs");
    let a = d.path().join("a.erofs");
    // containerd's EROFS differ: the layer on stdin.
    let out = Command::new(&mkfs)
        .args([
            "--tar=f",
            "--aufs",
            "--quiet",
            "-Enoinline_data",
            "--sort=none",
            "-U",
            uuid,
        ])
        .arg("-zlz4hc")
        .arg(&a)
        .stdin(Stdio::from(std::fs::File::open(&layer).expect("open")))
        .output()
        .expect("run mkfs.erofs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "--quiet printed {:?}", out.stdout);
    let b = d.path().join("b.erofs");
    ok(&[
        &"build",
        &"-q",
        &"--tar",
        &layer,
        &"--aufs",
        &"-E",
        &"noinline_data",
        &"--sort",
        &"none",
        &"-U",
        &uuid,
        &"-z",
        &"lz4hc",
        &b,
    ]);
    assert_eq!(std::fs::read(&a).expect("a"), std::fs::read(&b).expect("b"));
    // The whiteout became an overlayfs whiteout (char 0:0).
    let st = json(&ok(&[&"stat", &"--json", &a, &"/etc/gone"]));
    assert_eq!(st["type"], "char-device", "{st}");
    assert_eq!(
        (st["rdev"]["major"].as_u64(), st["rdev"]["minor"].as_u64()),
        (Some(0), Some(0))
    );
    // `ferofs mkfs` takes the same command line.
    let c = d.path().join("c.erofs");
    let out = ferofs()
        .args([
            "mkfs",
            "--tar=f",
            "--aufs",
            "--quiet",
            "-Enoinline_data",
            "--sort=none",
            "-U",
            uuid,
            "-zlz4hc",
        ])
        .arg(&c)
        .arg(&layer)
        .output()
        .expect("run ferofs mkfs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&a).expect("a"), std::fs::read(&c).expect("c"));
}

#[test]
fn directory_command_lines_and_unimplemented_options() {
    let d = scratch("dropin-dir");
    let src = d.path().join("src");
    tree(&src);
    let mkfs = tool_symlink(d.path(), "mkfs.erofs");
    let a = d.path().join("a.erofs");
    let out = Command::new(&mkfs)
        .args([
            "-zlz4hc,level=12",
            "-C65536",
            "-Eztailpacking,fragments",
            "-T0",
            "--workers=2",
            "--quiet",
        ])
        .arg(&a)
        .arg(&src)
        .output()
        .expect("run mkfs.erofs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = d.path().join("b.erofs");
    build(
        &src,
        &b,
        &[
            "-z",
            "lz4hc,level=12",
            "-C",
            "65536",
            "-E",
            "ztailpacking,fragments",
            "-T",
            "0",
            "-j",
            "2",
        ],
    );
    assert_eq!(std::fs::read(&a).expect("a"), std::fs::read(&b).expect("b"));
    // No -z: an uncompressed image, as mkfs.erofs builds.
    let u = d.path().join("u.erofs");
    let out = Command::new(&mkfs)
        .arg("--quiet")
        .arg(&u)
        .arg(&src)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info = json(&ok(&[&"inspect", &"--json", &u]));
    assert!(!info.to_string().contains("lz4"), "{info}");
    // Unimplemented options fail, name the option, and leave no image.
    for opt in ["--oci=i", "--gzinfo", "--random-algorithms"] {
        let img = d.path().join("x.erofs");
        let out = Command::new(&mkfs)
            .arg(opt)
            .arg(&img)
            .arg(&src)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{opt} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        let name = opt.split('=').next().unwrap_or(opt);
        assert!(err.contains(name), "{opt}: {err}");
        assert!(!img.exists(), "{opt} left an image");
    }
}

/// `-T N --mkfs-time`: N is the build time only, every file keeps its mtime; with
/// `--all-time` after it (or no `--mkfs-time`) N is every file's mtime too.
#[test]
fn mkfs_time_sets_the_build_time_only() {
    let d = scratch("dropin-mkfs-time");
    let src = d.path().join("src");
    tree(&src);
    let hostname = src.join("etc/hostname");
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    std::fs::File::options()
        .write(true)
        .open(&hostname)
        .and_then(|f| f.set_modified(t))
        .expect("set mtime");
    let mkfs = tool_symlink(d.path(), "mkfs.erofs");
    for (args, file_mtime) in [
        (&["-T1000", "--mkfs-time"][..], 1_600_000_000),
        (&["--mkfs-time", "-T", "1000", "--all-time"][..], 1000),
        (&["-T1000"][..], 1000),
    ] {
        let img = d.path().join("t.erofs");
        mkfs_ok(&mkfs, &[args, &["--quiet"]].concat(), &img, &src);
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        assert_eq!(info["build_time"].as_i64(), Some(1000), "{args:?}: {info}");
        let st = json(&ok(&[&"stat", &"--json", &img, &"/etc/hostname"]));
        assert_eq!(st["mtime"].as_i64(), Some(file_mtime), "{args:?}: {st}");
        std::fs::remove_file(&img).expect("rm");
    }
    // --uid-offset / --gid-offset shift every owner, after --force-uid.
    let img = d.path().join("o.erofs");
    let args = [
        "--quiet",
        "--force-uid=7",
        "--uid-offset=100000",
        "--gid-offset",
        "200000",
    ];
    mkfs_ok(&mkfs, &args, &img, &src);
    for p in ["/", "/etc/hostname"] {
        let st = json(&ok(&[&"stat", &"--json", &img, &p]));
        assert_eq!(st["uid"].as_u64(), Some(100_007), "{st}");
        assert_eq!(
            st["gid"].as_u64(),
            Some(200_000 + u64::from(gid_of(&src))),
            "{st}"
        );
    }
    // ferofs build's own spelling; --mkfs-time needs -T.
    let img = d.path().join("b.erofs");
    build(&src, &img, &["-T", "1000", "--mkfs-time"]);
    let st = json(&ok(&[&"stat", &"--json", &img, &"/etc/hostname"]));
    assert_eq!(st["mtime"].as_i64(), Some(1_600_000_000), "{st}");
    let out = ferofs()
        .args(["build", "--mkfs-time"])
        .arg(&src)
        .arg(d.path().join("c.erofs"))
        .output()
        .expect("run");
    assert!(!out.status.success(), "--mkfs-time without -T accepted");
}

/// `--hard-dereference`: each name of a hardlinked file is a file of its own, same
/// bytes and metadata, nlink 1; the kernel mount shows two inodes.
#[test]
fn hard_dereference_stores_each_name_as_its_own_file() {
    let d = scratch("dropin-hard-dereference");
    let src = d.path().join("src");
    tree(&src);
    std::fs::hard_link(src.join("etc/opt/big.txt"), src.join("etc/big.again")).expect("link");
    let mkfs = tool_symlink(d.path(), "mkfs.erofs");
    let img = d.path().join("h.erofs");
    mkfs_ok(
        &mkfs,
        &["--quiet", "-zlz4hc", "--hard-dereference"],
        &img,
        &src,
    );
    let a = json(&ok(&[&"stat", &"--json", &img, &"/etc/opt/big.txt"]));
    let b = json(&ok(&[&"stat", &"--json", &img, &"/etc/big.again"]));
    assert_ne!(a["nid"], b["nid"]);
    for st in [&a, &b] {
        assert_eq!(st["nlink"].as_u64(), Some(1), "{st}");
        assert_eq!(st["size"], a["size"]);
        assert_eq!(st["mode"], a["mode"]);
    }
    assert_eq!(
        ok(&[&"cat", &img, &"/etc/big.again"]),
        std::fs::read_to_string(src.join("etc/opt/big.txt")).expect("read")
    );
    ok(&[&"check", &img]);
    // -x-1 (mkfs.erofs) / --no-xattrs: the source's xattrs stay out.
    set_xattr(&src.join("etc/hostname"), "user.note", b"kept?");
    for (args, want) in [(&["--quiet"][..], 1), (&["--quiet", "-x-1"], 0)] {
        let x = d.path().join("x.erofs");
        mkfs_ok(&mkfs, args, &x, &src);
        let st = json(&ok(&[&"stat", &"--json", &x, &"/etc/hostname"]));
        assert_eq!(
            st["xattrs"].as_array().map(Vec::len),
            Some(want),
            "{args:?}: {st}"
        );
        std::fs::remove_file(&x).expect("rm");
    }
    if ferofs_testkit::kernel_available("hard_dereference_stores_each_name_as_its_own_file") {
        use std::os::unix::fs::MetadataExt;
        let m = ferofs_testkit::Mount::erofs(&img);
        let x = std::fs::metadata(m.path().join("etc/opt/big.txt")).expect("stat");
        let y = std::fs::metadata(m.path().join("etc/big.again")).expect("stat");
        assert_ne!(x.ino(), y.ino());
        assert_eq!((x.nlink(), y.nlink()), (1, 1));
        assert_eq!(
            std::fs::read(m.path().join("etc/big.again")).expect("read"),
            std::fs::read(src.join("etc/opt/big.txt")).expect("read")
        );
    }
}

#[test]
fn fsck_and_dump_command_lines() {
    let d = scratch("dropin-fsck");
    let src = d.path().join("src");
    tree(&src);
    let img = d.path().join("a.erofs");
    build(&src, &img, &["-z", "lz4hc", "-E", "ztailpacking"]);
    let fsck = tool_symlink(d.path(), "fsck.erofs");
    let dump = tool_symlink(d.path(), "dump.erofs");
    let st = Command::new(&fsck)
        .arg("-d0")
        .arg(&img)
        .status()
        .expect("fsck");
    assert!(st.success());
    // --extract=DIR: the tree, checked as it is written.
    let x = d.path().join("x");
    let out = Command::new(&fsck)
        .arg(format!("--extract={}", x.display()))
        .args(["--xattrs", "--preserve"])
        .arg(&img)
        .output()
        .expect("fsck --extract");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let diff = ferofs()
        .arg("diff")
        .arg(&img)
        .arg(&x)
        .output()
        .expect("diff");
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    // dump.erofs: superblock, a file's contents, a directory listing.
    let out = Command::new(&dump)
        .arg("-s")
        .arg(&img)
        .output()
        .expect("dump -s");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Block size"));
    let out = Command::new(&dump)
        .args(["--path=/etc/hostname", "--cat"])
        .arg(&img)
        .output()
        .expect("dump --cat");
    assert_eq!(out.stdout, b"ferofs\n");
    let out = Command::new(&dump)
        .args(["--path=/etc", "--ls"])
        .arg(&img)
        .output()
        .expect("dump --ls");
    assert!(String::from_utf8_lossy(&out.stdout).contains("hostname"));
    // A damaged image fails the check; unimplemented options are named.
    let mut bytes = std::fs::read(&img).expect("read");
    let n = bytes.len();
    bytes[n - 4096..].iter_mut().for_each(|b| *b ^= 0x5a);
    let bad = d.path().join("bad.erofs");
    std::fs::write(&bad, &bytes).expect("write");
    let st = Command::new(&fsck).arg(&bad).output().expect("fsck bad");
    assert!(!st.status.success(), "a damaged image passed");
    // -p: the ratio after the check (lz4hc at 4 KiB pclusters: 62 % on this text).
    let out = Command::new(&fsck)
        .arg("-p")
        .arg(&img)
        .output()
        .expect("fsck -p");
    let text = String::from_utf8_lossy(&out.stdout);
    let pct: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Compression ratio: "))
        .and_then(|l| l.split('(').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(out.status.success() && pct > 20.0 && pct < 80.0, "{text}");
    // --no-sbcrc: a superblock checksum that does not match is not a problem (and an
    // extraction goes ahead).
    let mut bytes = std::fs::read(&img).expect("read");
    bytes[1028..1032].copy_from_slice(&[0; 4]);
    let crc = d.path().join("crc.erofs");
    std::fs::write(&crc, &bytes).expect("write");
    assert!(!Command::new(&fsck)
        .arg(&crc)
        .status()
        .expect("fsck")
        .success());
    assert!(Command::new(&fsck)
        .arg("--no-sbcrc")
        .arg(&crc)
        .status()
        .expect("fsck")
        .success());
    let xc = d.path().join("xc");
    assert!(Command::new(&fsck)
        .args(["--no-sbcrc", &format!("--extract={}", xc.display())])
        .arg(&crc)
        .status()
        .expect("fsck")
        .success());
    assert_eq!(
        std::fs::read(xc.join("etc/hostname")).expect("read"),
        b"ferofs\n"
    );
    // --no-preserve-perms: modes masked by the umask (0644 and 0755 under 027).
    let xp = d.path().join("xp");
    let st = Command::new("sh")
        .arg("-c")
        .arg("umask 027; exec \"$0\" --extract=\"$1\" --no-preserve-perms \"$2\"")
        .arg(&fsck)
        .arg(&xp)
        .arg(&img)
        .status()
        .expect("fsck --no-preserve-perms");
    assert!(st.success());
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::symlink_metadata(xp.join(p))
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(
        (mode("etc/hostname"), mode("etc/opt"), mode("etc/name")),
        (0o640, 0o750, 0o777)
    );
    // fsck.erofs --path / --nid check one subtree; dump.erofs --nid with --ls / --cat.
    let etc = json(&ok(&[&"stat", &"--json", &img, &"/etc"]))["nid"]
        .as_u64()
        .expect("nid");
    let host = json(&ok(&[&"stat", &"--json", &img, &"/etc/hostname"]))["nid"]
        .as_u64()
        .expect("nid");
    for opts in [
        vec!["--path=/etc".to_string()],
        vec![format!("--nid={etc}")],
        vec![format!("--nid={host}")],
    ] {
        let out = Command::new(&fsck)
            .args(&opts)
            .arg(&img)
            .output()
            .expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.starts_with("clean"),
            "{opts:?}: {out:?}"
        );
    }
    let out = Command::new(&dump)
        .args([format!("--nid={etc}"), "--ls".into()])
        .arg(&img)
        .output()
        .expect("dump --ls");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        ok(&[&"ls", &img, &"/etc"])
    );
    let out = Command::new(&dump)
        .args([format!("--nid={host}"), "--cat".into()])
        .arg(&img)
        .output()
        .expect("dump --cat");
    assert_eq!(
        out.stdout,
        std::fs::read(src.join("etc/hostname")).expect("read")
    );
    let xn = d.path().join("by-nid");
    let st = Command::new(&fsck)
        .arg(format!("--extract={}", xn.display()))
        .arg(format!("--nid={etc}"))
        .arg(&img)
        .status()
        .expect("fsck --extract --nid");
    assert!(st.success());
    assert_eq!(
        std::fs::read(xn.join("hostname")).expect("extracted"),
        std::fs::read(src.join("etc/hostname")).expect("read")
    );
    // One file to a path that is not a directory: the file is written there, as
    // fsck.erofs does; there again only with --overwrite; into a directory by name.
    let one = d.path().join("out/hostname.copy");
    for (extra, ok_) in [(None, true), (None, false), (Some("--overwrite"), true)] {
        let st = Command::new(&fsck)
            .arg(format!("--extract={}", one.display()))
            .arg(format!("--nid={host}"))
            .args(extra)
            .arg(&img)
            .output()
            .expect("fsck --extract one file");
        assert_eq!(st.status.success(), ok_, "{extra:?}: {st:?}");
    }
    assert_eq!(
        std::fs::read(&one).expect("extracted"),
        std::fs::read(src.join("etc/hostname")).expect("read")
    );
    let into = d.path().join("into");
    std::fs::create_dir(&into).expect("mkdir");
    ok(&[&"extract", &img, &into, &"--path", &"/etc/hostname"]);
    assert!(into.join("hostname").is_file());
    // An inode by number (the root here).
    let root = json(&ok(&[&"inspect", &"--json", &img]))["root_nid"]
        .as_u64()
        .expect("root nid");
    let out = Command::new(&dump)
        .arg(format!("--nid={root}"))
        .arg(&img)
        .output()
        .expect("dump --nid");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("Nid: {root} ")) && text.contains("directory"),
        "{text}"
    );
}

/// `dump.erofs --blkid-udev` (and `ferofs inspect --udev`): the udev properties, with
/// the label as blkid writes it, and the same values `blkid -o udev` gives.
#[test]
fn dump_blkid_udev() {
    let d = scratch("dropin-udev");
    let src = d.path().join("src");
    tree(&src);
    let img = d.path().join("a.erofs");
    build(&src, &img, &["-L", "my disk/1"]);
    let uuid = json(&ok(&[&"inspect", &"--json", &img]))["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let dump = tool_symlink(d.path(), "dump.erofs");
    let out = Command::new(&dump)
        .arg("--blkid-udev")
        .arg(&img)
        .output()
        .expect("dump --blkid-udev");
    assert!(out.status.success());
    let want = format!(
        "ID_FS_UUID={uuid}\nID_FS_UUID_ENC={uuid}\nID_FS_TYPE=erofs\nID_FS_USAGE=filesystem\n\
         ID_FS_LABEL=my_disk/1\nID_FS_LABEL_ENC=my\\x20disk\\x2f1\n"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    assert_eq!(ok(&[&"inspect", &"--udev", &img]), want);
    // util-linux's blkid, when there is one, reads the same values.
    if let Some(blkid) = tool("blkid") {
        let b = Command::new(blkid)
            .args(["-p", "-o", "udev"])
            .arg(&img)
            .output()
            .expect("blkid");
        let theirs = String::from_utf8_lossy(&b.stdout);
        for line in want.lines() {
            assert!(
                theirs.lines().any(|l| l == line),
                "blkid lacks {line:?}: {theirs}"
            );
        }
    }
}

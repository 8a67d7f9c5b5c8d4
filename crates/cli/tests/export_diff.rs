//! `ferofs export` and `ferofs diff`.
//!
//! Export: images of the make-tree tree (ours at two settings, and a golden mkfs.erofs
//! image) go through `ferofs export` and a GNU tar extraction as root; the result must
//! have the make-tree digest of the source (less the socket, which tar cannot hold):
//! every path, type, mode, owner, ns mtime, content, symlink target, device number,
//! xattr, ACL and hardlink group. Holes must come out as holes. Plain, `.tar.zst` and
//! stdout variants, and a `--path` subtree.
//!
//! Diff: a copy of the tree gets one change of each kind; `ferofs diff` must list
//! exactly those, dir vs dir, image vs dir and image vs image, and exit 0 on equal
//! trees, 1 on different ones, 2 on errors.

mod common;
use common::*;
use ferofs_testkit::{assert_same_tree, golden, kernel_available, make_tree, run, Mount, Tmpfs};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Run a Python snippet with arguments (exact-ns time handling and odd file types).
fn py(code: &str, args: &[&Path]) {
    let mut c = Command::new("python3");
    c.arg("-c").arg(code).args(args);
    run(&mut c);
}

/// Remove the socket from a make-tree tree, keeping its directory's mtime (tar cannot
/// hold sockets: the extraction is compared with the tree without it).
fn drop_socket(tree: &Path) {
    py(
        "import os,sys\n\
         d=os.path.join(sys.argv[1],'special'); st=os.stat(d)\n\
         os.unlink(os.path.join(d,'socket')); os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))",
        &[tree],
    );
}

/// A GNU tar extraction into `dir` (the caller adds `-f FILE`), as root, restoring
/// everything.
fn gnu_tar_extract(tar_args: &[&str], dir: &Path) -> Command {
    std::fs::create_dir_all(dir).expect("create extraction dir");
    let mut c = Command::new("tar");
    c.args([
        "--xattrs",
        "--xattrs-include=*",
        "--acls",
        "--numeric-owner",
        "--same-owner",
        "-p",
    ])
    .args(tar_args)
    .arg("-C")
    .arg(dir);
    c
}

/// The sparse files of the tree came out sparse.
fn assert_holes(x: &Path) {
    let m = std::fs::metadata(x.join("data/sparse-100MiB.img")).expect("stat sparse file");
    assert_eq!(m.len(), 100 << 20);
    assert!(
        m.blocks() * 512 < 4 << 20,
        "sparse file not sparse after export + tar: {} bytes allocated",
        m.blocks() * 512
    );
    let m = std::fs::metadata(x.join("data/sparse-hole-only.img")).expect("stat hole-only");
    assert_eq!((m.len(), m.blocks()), (1 << 20, 0));
}

#[test]
fn export_our_images_through_gnu_tar() {
    if !kernel_available("export_our_images_through_gnu_tar") {
        return;
    }
    let (_fs, tree) = make_tree();
    let work = Tmpfs::new("1G");
    let w = work.path();
    let img = w.join("default.erofs");
    let packed = w.join("packed.erofs");
    build(&tree, &img, &[]);
    build(
        &tree,
        &packed,
        &["-z", "zstd", "-C", "131072", "-E", "smallest"],
    );
    drop_socket(&tree);

    // Plain .tar file; the socket is reported, not archived.
    let t = w.join("out.tar");
    let out = run_ferofs(&[&"export", &img, &"--tar", &t]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/special/socket: socket not exported"),
        "no socket warning: {err}"
    );
    let x = w.join("x");
    run(gnu_tar_extract(&["-x"], &x).arg("-f").arg(&t));
    assert_same_tree(&tree, &x);
    assert_holes(&x);
    // The archive is whole records, as GNU tar writes them.
    assert_eq!(std::fs::metadata(&t).expect("stat tar").len() % 10240, 0);

    // The same tree from the packed image as .tar.zst; the bytes of the tar inside
    // are the same as from the default image (same tree, same order, same headers).
    let tz = w.join("out.tar.zst");
    ok(&[&"export", &packed, &"--tar", &tz]);
    let inner = Command::new("zstd")
        .arg("-dc")
        .arg(&tz)
        .output()
        .expect("run zstd -dc");
    assert!(inner.status.success());
    let plain = std::fs::read(&t).expect("read tar");
    assert!(
        inner.stdout == plain,
        "packed image's tar differs from the default image's"
    );
    std::fs::remove_file(&t).expect("rm tar");

    // Stdout, subtree, into tar's stdin.
    let y = w.join("y");
    let mut exp = ferofs()
        .args(["export", "--path", "/hardlinks", "--tar", "-"])
        .arg(&img)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn export");
    let mut tar = gnu_tar_extract(&["-x", "-f", "-"], &y);
    tar.stdin(exp.stdout.take().expect("stdout"));
    run(&mut tar);
    assert!(exp.wait().expect("wait export").success());
    assert_same_tree(&tree.join("hardlinks"), &y);
    let m = std::fs::metadata(y.join("nested/third")).expect("stat third");
    assert_eq!(m.nlink(), 3, "hardlink group not kept");
}

/// A damaged image: export fails with an error naming the file (or, for damaged
/// metadata, what the walk met), leaves no output and no temporary file, and does not
/// hang (the writer's, the workers' and the walker's errors all stop the others).
#[test]
fn export_of_a_damaged_image_fails_cleanly() {
    let src = ferofs_testkit::scratch("export-damaged");
    let d = src.path();
    std::fs::create_dir(d.join("t")).expect("mkdir");
    for i in 0..20u32 {
        let text: String = (0..20_000).map(|k| format!("line {i} {k}\n")).collect();
        std::fs::write(d.join(format!("t/f{i:02}.txt")), text).expect("write");
    }
    let img = d.join("a.erofs");
    build(&d.join("t"), &img, &[]);
    let st = json(&ok(&[&"stat", &"--json", &img, &"/f10.txt"]));
    let phys = st["extents"][0]["physical"]
        .as_u64()
        .expect("physical address");
    let mut bytes = std::fs::read(&img).expect("read image");
    let at = usize::try_from(phys).expect("usize");
    bytes[at..at + 4096].fill(0xff);
    let bad = d.join("bad-data.erofs");
    std::fs::write(&bad, &bytes).expect("write damaged image");
    let bad_meta = d.join("bad-meta.erofs");
    let len = std::fs::metadata(&img).expect("stat").len();
    let cut = usize::try_from(len / 2).expect("usize");
    std::fs::write(&bad_meta, &std::fs::read(&img).expect("read")[..cut]).expect("write");
    for (image, want) in [(&bad, "/f10.txt: read at offset 0"), (&bad_meta, "error")] {
        let out_dir = d.join("out");
        std::fs::create_dir_all(&out_dir).expect("mkdir out");
        let t = out_dir.join("x.tar.zst");
        let out = run_ferofs(&[&"export", image, &"--tar", &t]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{}: export succeeded",
            image.display()
        );
        assert!(err.contains(want), "{}: {err}", image.display());
        let left: Vec<_> = std::fs::read_dir(&out_dir).expect("ls").collect();
        assert!(
            left.is_empty(),
            "{}: output left behind: {left:?}",
            image.display()
        );
    }
}

/// The output named is written where it is: a FIFO (or a device: /dev/null, a tape)
/// stays what it is and gets the tar (export once renamed its temporary file over it,
/// and a torture run's `export --tar /dev/null` replaced the machine's /dev/null with
/// a regular file); a symbolic link stays a link and its target (even a dangling
/// one's) gets the tar; a directory is an error.
#[test]
fn export_writes_into_fifos_devices_and_through_links() {
    use std::os::unix::fs::FileTypeExt;
    let s = ferofs_testkit::scratch("export-kinds");
    let d = s.path();
    std::fs::create_dir(d.join("t")).expect("mkdir");
    std::fs::write(d.join("t/f"), b"tar me\n").expect("write");
    let img = d.join("a.erofs");
    build(&d.join("t"), &img, &[]);
    let plain = d.join("plain.tar");
    ok(&[&"export", &img, &"--tar", &plain]);
    let want = std::fs::read(&plain).expect("read tar");
    assert!(want.len() >= 1024, "{}", want.len());

    let fifo = d.join("fifo");
    run(Command::new("mkfifo").arg(&fifo));
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).expect("read fifo"))
    };
    ok(&[&"export", &img, &"--tar", &fifo]);
    // Checked before the reader is joined: with the FIFO replaced it would wait forever.
    let ft = std::fs::symlink_metadata(&fifo).expect("lstat").file_type();
    assert!(ft.is_fifo(), "{ft:?}");
    assert_eq!(reader.join().expect("reader"), want);

    std::fs::create_dir(d.join("real")).expect("mkdir");
    for (link, target) in [
        ("link.tar", "real/old.tar"),
        ("dangling.tar", "real/new.tar"),
    ] {
        if link == "link.tar" {
            std::fs::write(d.join(target), b"old").expect("write");
        }
        std::os::unix::fs::symlink(target, d.join(link)).expect("symlink");
        ok(&[&"export", &img, &"--tar", &d.join(link)]);
        let ft = std::fs::symlink_metadata(d.join(link))
            .expect("lstat")
            .file_type();
        assert!(ft.is_symlink(), "{link}: {ft:?}");
        assert_eq!(std::fs::read(d.join(target)).expect("read"), want, "{link}");
    }

    let out = run_ferofs(&[&"export", &img, &"--tar", &d.join("real")]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a directory"),
        "{out:?}"
    );
    assert!(std::fs::metadata(d.join("real")).expect("stat").is_dir());
}

fn run_ferofs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    common::run(args)
}

/// A golden mkfs.erofs image through export and GNU tar equals its kernel mount (less
/// the socket); `holes`: the image records the sparse files' holes (chunk-based).
/// `kernel`: copy the kernel mount as the expected tree; otherwise `ferofs extract`,
/// which golden_extract.rs holds equal to the kernel mount (the kernel reads an
/// all-fragments image's 100 MiB of zeros for a minute and a half).
fn export_golden(name: &str, holes: bool, kernel: bool) {
    if !kernel_available(name) {
        return;
    }
    let img = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
    let work = Tmpfs::new("1G");
    let w = work.path();
    let expected = w.join("expected");
    if kernel {
        let m = Mount::erofs(&img);
        run(Command::new("cp")
            .args(["-a", "--sparse=always"])
            .arg(m.path())
            .arg(&expected));
    } else {
        ok(&[&"extract", &img, &expected]);
    }
    drop_socket(&expected);
    let tz = w.join("g.tar.zst");
    ok(&[&"export", &img, &"--tar", &tz, &"-j", &"2"]);
    let x = w.join("x");
    run(gnu_tar_extract(&["--zstd", "-x"], &x).arg("-f").arg(&tz));
    assert_same_tree(&expected, &x);
    if holes {
        assert_holes(&x);
    }
}

#[test]
fn export_golden_chunked_through_gnu_tar() {
    // Chunk-based: null chunks are holes, which must become PAX sparse entries.
    export_golden("plain-chunk64k", true, true);
}

#[test]
fn export_golden_all_fragments_through_gnu_tar() {
    // Every file in the packed inode: reads go through the fragment path.
    export_golden("lz4hc-all-fragments", false, false);
}

/// Make one change of each kind to the copy `b` of a make-tree tree (times of the
/// directories touched are put back, so each change shows once).
const CHANGES: &str = r#"
import os, sys
b = sys.argv[1]
P = lambda r: os.path.join(b, r)
def keep_dir_time(rel, fn):
    st = os.stat(P(rel)); fn(); os.utime(P(rel), ns=(st.st_atime_ns, st.st_mtime_ns))
def keep_time(rel, fn):
    st = os.lstat(P(rel)); fn()
    os.utime(P(rel), ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
def poke():
    with open(P('files/size-4096.txt'), 'r+b') as f:
        f.seek(100); c = f.read(1); f.seek(100); f.write(bytes([c[0] ^ 1]))
keep_time('files/size-4096.txt', poke)
keep_time('files/readme.txt', lambda: os.chmod(P('files/readme.txt'), 0o600))
keep_time('files/one-byte', lambda: os.chown(P('files/one-byte'), 1234, 0))
st = os.stat(P('files/hundred-bytes.txt'))
os.utime(P('files/hundred-bytes.txt'), ns=(st.st_atime_ns, st.st_mtime_ns + 1))
keep_time('xattrs/user-one', lambda: os.setxattr(P('xattrs/user-one'), 'user.comment', b'hellO'))
def relink():
    st = os.lstat(P('links/short')); os.unlink(P('links/short'))
    os.symlink('../files/empty', P('links/short'))
    os.utime(P('links/short'), ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
keep_dir_time('links', relink)
def to_dir():
    st = os.stat(P('files/script.sh')); os.unlink(P('files/script.sh'))
    os.mkdir(P('files/script.sh'), 0o755); os.utime(P('files/script.sh'), ns=(st.st_atime_ns, st.st_mtime_ns))
def add():
    with open(P('files/new-file'), 'wb') as f: f.write(b'new\n')
    os.utime(P('files/new-file'), ns=(1600000000 * 10**9, 1600000000 * 10**9))
keep_dir_time('files', lambda: (to_dir(), add()))
keep_dir_time('xattrs', lambda: os.unlink(P('xattrs/none')))
def redev():
    st = os.lstat(P('special/char-1-3')); os.unlink(P('special/char-1-3'))
    os.mknod(P('special/char-1-3'), 0o20666, os.makedev(1, 5)); os.chmod(P('special/char-1-3'), 0o666)
    os.utime(P('special/char-1-3'), ns=(st.st_atime_ns, st.st_mtime_ns))
keep_dir_time('special', redev)
"#;

/// What `ferofs diff A B` prints for the changes above, in tree order.
const EXPECTED: &str = "\
changed  /files/hundred-bytes.txt: mtime 1600000000 -> 1600000000.000000001
added    /files/new-file (file)
changed  /files/one-byte: uid 0 -> 1234
changed  /files/readme.txt: mode 0644 -> 0600
changed  /files/script.sh: type file -> directory
changed  /files/size-4096.txt: content
changed  /links/short: target ../files/one-byte -> ../files/empty
changed  /special/char-1-3: rdev 1:3 -> 1:5
removed  /xattrs/none (file)
changed  /xattrs/user-one: xattr user.comment changed
";

fn diff(a: &Path, b: &Path, extra: &[&str]) -> (i32, String) {
    let out = ferofs()
        .arg("diff")
        .args(extra)
        .arg(a)
        .arg(b)
        .output()
        .expect("run ferofs diff");
    let code = out.status.code().expect("exit code");
    assert!(
        code == 2 || out.stderr.is_empty(),
        "diff printed errors: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn diff_finds_each_single_change() {
    if !kernel_available("diff_finds_each_single_change") {
        return;
    }
    let (fs, a) = make_tree();
    let b = fs.path().join("b");
    run(Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(&a)
        .arg(&b));
    // Equal trees: nothing printed, status 0 (and cp -a copied everything).
    assert_eq!(diff(&a, &b, &[]), (0, String::new()));
    let img_a = fs.path().join("a.erofs");
    build(&a, &img_a, &[]);
    assert_eq!(diff(&img_a, &a, &[]), (0, String::new()));

    py(CHANGES, &[&b]);
    let img_b = fs.path().join("b.erofs");
    build(&b, &img_b, &["-z", "zstd", "-C", "65536"]);
    for (x, y) in [(&a, &b), (&img_a, &b), (&a, &img_b), (&img_a, &img_b)] {
        let (code, text) = diff(x, y, &[]);
        assert_eq!(text, EXPECTED, "diff {} {}", x.display(), y.display());
        assert_eq!(code, 1);
    }
    // Reversed: added and removed swap, a -> b flips.
    let (code, text) = diff(&img_b, &img_a, &[]);
    assert_eq!(code, 1);
    assert!(text.contains("removed  /files/new-file (file)\n"), "{text}");
    assert!(text.contains("added    /xattrs/none (file)\n"), "{text}");
    assert!(
        text.contains("changed  /files/script.sh: type directory -> file\n"),
        "{text}"
    );

    // Ignore options drop exactly their lines.
    let (_, text) = diff(
        &img_a,
        &b,
        &["--ignore-times", "--ignore-owners", "--ignore-xattrs"],
    );
    let want: String = EXPECTED
        .lines()
        .filter(|l| !l.contains("mtime") && !l.contains("uid") && !l.contains("xattr user"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(text, want);

    // JSON lines: one object per difference.
    let (code, text) = diff(&img_a, &img_b, &["--json"]);
    assert_eq!(code, 1);
    let objs: Vec<serde_json::Value> = text.lines().map(json).collect();
    assert_eq!(objs.len(), EXPECTED.lines().count());
    assert_eq!(
        objs[0],
        serde_json::json!({"status": "changed", "path": "/files/hundred-bytes.txt", "type": "file",
            "changes": [{"field": "mtime", "a": "1600000000", "b": "1600000000.000000001"}]})
    );
    assert_eq!(
        objs[9]["changes"],
        serde_json::json!([{"field": "xattr", "name": "user.comment", "change": "changed"}])
    );

    // Quiet: status only. Errors: status 2.
    assert_eq!(diff(&a, &b, &["-q"]), (1, String::new()));
    let (code, _) = diff(&a, &fs.path().join("missing"), &[]);
    assert_eq!(code, 2);
}

/// A path relative to `root` as ferofs shows names: control characters and bytes
/// that are not UTF-8 as `\xNN`.
fn shown(root: &Path, p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let rel = p.strip_prefix(root).expect("under root");
    let mut out = String::from("/");
    for chunk in rel.as_os_str().as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Every entry below `dir` (itself included) by its path relative to `root`.
fn tree_entries(root: &Path, dir: &Path, out: &mut Vec<(String, std::fs::Metadata)>) {
    out.push((
        shown(root, dir),
        std::fs::symlink_metadata(dir).expect("lstat"),
    ));
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        let md = std::fs::symlink_metadata(&p).expect("lstat");
        if md.is_dir() {
            tree_entries(root, &p, out);
        } else {
            out.push((shown(root, &p), md));
        }
    }
}

#[test]
fn ls_recursive_lists_every_entry_with_its_metadata() {
    // A golden mkfs.erofs image against the tree it was made from.
    let img = golden("erofs-utils-1.9.3/lz4hc.erofs.zst");
    let (_fs, tree) = make_tree();
    let v = json(&ok(&[&"ls", &"-R", &"--json", &img]));
    let got = v.as_array().expect("array");
    let mut want = Vec::new();
    tree_entries(&tree, &tree, &mut want);
    assert_eq!(got.len(), want.len());
    let by_path: std::collections::HashMap<&str, &serde_json::Value> = got
        .iter()
        .map(|e| (e["path"].as_str().expect("path"), e))
        .collect();
    assert_eq!(by_path.len(), got.len(), "paths listed twice");
    for (path, md) in &want {
        let path = if path == "/" {
            "/"
        } else {
            path.trim_end_matches('/')
        };
        let e = by_path
            .get(path)
            .unwrap_or_else(|| panic!("{path} not listed"));
        assert_eq!(e["mode"], format!("{:04o}", md.mode() & 0o7777), "{path}");
        assert_eq!(e["uid"].as_u64(), Some(u64::from(md.uid())), "{path}");
        assert_eq!(e["gid"].as_u64(), Some(u64::from(md.gid())), "{path}");
        assert_eq!(e["mtime"].as_i64(), Some(md.mtime()), "{path}");
        if !md.is_dir() {
            assert_eq!(e["nlink"].as_u64(), Some(md.nlink()), "{path}");
        }
        if md.is_file() || md.file_type().is_symlink() {
            assert_eq!(e["size"].as_u64(), Some(md.size()), "{path}");
        }
    }
    // The text form: one line per entry, full paths, a symlink's target; a subtree
    // starts at its own path; by nid, paths are below the inode.
    let text = ok(&[&"ls", &"-R", &img, &"/hardlinks/"]);
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.rsplit(' ').next().expect("name"))
        .collect();
    assert_eq!(names.first(), Some(&"/hardlinks"));
    assert!(names.iter().all(|n| n.starts_with("/hardlinks")), "{text}");
    assert_eq!(
        names.len(),
        want.iter()
            .filter(|(p, _)| p.starts_with("/hardlinks"))
            .count()
    );
    let links = ok(&[&"ls", &"-R", &img, &"/links"]);
    assert!(
        links.contains("/links/absolute -> /usr/share/zoneinfo/UTC"),
        "{links}"
    );
    let nid = json(&ok(&[&"stat", &"--json", &img, &"/hardlinks"]))["nid"]
        .as_u64()
        .expect("nid")
        .to_string();
    let by_nid = ok(&[&"ls", &"-R", &img, &"--nid", &nid]);
    assert_eq!(by_nid.lines().count(), names.len());
    assert!(
        by_nid.lines().nth(1).is_some_and(|l| l.contains(" /")),
        "{by_nid}"
    );
}

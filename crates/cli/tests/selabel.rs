//! `--file-contexts` / `--mount-point`: SELinux labels as the kernel shows them, equal
//! to what mkfs.erofs (built with libselinux, as Debian's is) writes.

mod common;
use common::*;
use ferofs_testkit::{fsck_erofs, kernel_available, scratch, tool, Mount};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Every kind of inode, and a source label that the file contexts must replace.
fn tree(root: &Path) {
    let sh = format!(
        r#"set -e
cd {root}
mkdir -p bin etc lib vendor/firmware 'odd dir'
printf sh > bin/sh; printf ls > bin/ls; printf x > bin/x.sh
printf hosts > etc/hosts; printf conf > etc/app.conf; printf fw > vendor/firmware/a.bin
printf o > 'odd dir/f'
ln -s ../bin/sh lib/link; ln -s sh bin/sh2; ln bin/ls bin/ls-hard
mknod lib/null c 1 3; mknod lib/loop b 7 0; mkfifo lib/fifo
setfattr -n security.selinux -v source_label etc/hosts
setfattr -n security.selinux -v source_label etc/app.conf
setfattr -n user.kept -v 1 etc/app.conf
"#,
        root = root.display()
    );
    ferofs_testkit::run(Command::new("sh").arg("-c").arg(sh));
}

/// A scratch directory named after `what` holding [`tree`] in `src`.
fn scratch_tree(what: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let fs = scratch(what);
    let src = fs.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    tree(&src);
    (fs, src)
}

/// Rules that exercise each precedence case; `P` is the path prefix.
fn contexts(prefix: &str) -> String {
    format!(
        "# the whole tree, then more specific rules
{prefix}(/.*)?               u:object_r:system_file:s0
{prefix}/bin(/.*)?           u:object_r:bin_file:s0
# a plain path beats every regex, whatever its place
{prefix}/bin/sh      --      u:object_r:shell_exec:s0
{prefix}/bin/.*\\.sh  --     u:object_r:script:s0
# typed rules
{prefix}/lib/.*      -l      u:object_r:lib_link:s0
{prefix}/lib/null    -c      u:object_r:null_device:s0
{prefix}/lib/.*      -b      u:object_r:block_device:s0
{prefix}/lib/.*      -p      u:object_r:fifo:s0
{prefix}/bin/sh2     -l      u:object_r:sh_link:s0
# no label at all
{prefix}/etc/hosts           <<none>>
{prefix}/vendor/firmware/.*  u:object_r:firmware:s0
{prefix}/vendor/firmware/.*  u:object_r:firmware_later:s0
{prefix}/odd[[:space:]]dir/f  u:object_r:spaced:s0
"
    )
}

/// `security.selinux` of every path under the kernel mount of `img` (None: no label).
fn labels(img: &Path) -> BTreeMap<String, Option<String>> {
    let m = Mount::erofs(img);
    let out = ferofs_testkit::run(Command::new("find").arg(".").current_dir(m.path()));
    out.lines()
        .map(|rel| {
            let v = xattr::get(m.path().join(rel), "security.selinux")
                .expect("getxattr")
                .map(|v| String::from_utf8_lossy(&v).into_owned());
            (rel.to_string(), v)
        })
        .collect()
}

#[test]
fn file_contexts_label_every_inode() {
    if !kernel_available("file_contexts_label_every_inode") {
        return;
    }
    let (fs, src) = scratch_tree("selabel");
    let fc = fs.path().join("file_contexts");
    std::fs::write(&fc, contexts("/system")).expect("write");
    let img = fs.path().join("sys.erofs");
    ok(&[
        &"build",
        &"-q",
        &"--file-contexts",
        &fc,
        &"--mount-point",
        &"/system/",
        &src,
        &img,
    ]);
    let got = labels(&img);
    let want: BTreeMap<String, Option<String>> = [
        (".", Some("system_file")),
        ("./bin", Some("bin_file")),
        ("./bin/sh", Some("shell_exec")),
        ("./bin/x.sh", Some("script")),
        ("./bin/ls", Some("bin_file")),
        ("./bin/ls-hard", Some("bin_file")),
        ("./bin/sh2", Some("sh_link")),
        ("./etc", Some("system_file")),
        ("./etc/hosts", None),
        ("./etc/app.conf", Some("system_file")),
        ("./lib", Some("system_file")),
        ("./lib/link", Some("lib_link")),
        ("./lib/null", Some("null_device")),
        ("./lib/loop", Some("block_device")),
        ("./lib/fifo", Some("fifo")),
        ("./vendor", Some("system_file")),
        ("./vendor/firmware", Some("system_file")),
        ("./vendor/firmware/a.bin", Some("firmware_later")),
        ("./odd dir", Some("system_file")),
        ("./odd dir/f", Some("spaced")),
    ]
    .into_iter()
    .map(|(p, l)| (p.to_string(), l.map(|l| format!("u:object_r:{l}:s0"))))
    .collect();
    assert_eq!(got, want);
    // Other xattrs stay; the image checks clean.
    let m = Mount::erofs(&img);
    assert_eq!(
        xattr::get(m.path().join("etc/app.conf"), "user.kept").expect("getxattr"),
        Some(b"1".to_vec())
    );
    drop(m);
    ok(&[&"check", &img]);
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs: {e}"));

    // A bad file is an error naming its line, and no image is left.
    std::fs::write(&fc, "/a u:r:a:s0\n/b -z u:r:b:s0\n").expect("write");
    let bad = fs.path().join("bad.erofs");
    let out = run(&[&"build", &"--file-contexts", &fc, &src, &bad]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("file_contexts: line 2: unknown file type \"-z\""),
        "{err}"
    );
    assert!(!bad.exists());
}

/// Debian's mkfs.erofs is built with libselinux: the same rules give the same labels.
#[test]
fn labels_equal_mkfs_erofs() {
    if !kernel_available("labels_equal_mkfs_erofs") {
        return;
    }
    let Some(mkfs) = tool("mkfs.erofs") else {
        panic!("mkfs.erofs not installed (apt-get install erofs-utils)");
    };
    let help = Command::new(&mkfs)
        .arg("--help")
        .output()
        .expect("mkfs.erofs --help");
    let text = [help.stdout, help.stderr].concat();
    if !String::from_utf8_lossy(&text).contains("--file-contexts") {
        eprintln!("SKIPPED: {} is built without libselinux", mkfs.display());
        return;
    }
    let (fs, src) = scratch_tree("selabel-mkfs");
    let fc = fs.path().join("file_contexts");
    std::fs::write(&fc, contexts("")).expect("write");
    let (ours, theirs) = (fs.path().join("ours.erofs"), fs.path().join("theirs.erofs"));
    ok(&[&"build", &"-q", &"--file-contexts", &fc, &src, &ours]);
    ferofs_testkit::run(
        Command::new(&mkfs)
            .arg(format!("--file-contexts={}", fc.display()))
            .arg(&theirs)
            .arg(&src),
    );
    let (a, b) = (labels(&ours), labels(&theirs));
    assert_eq!(a, b);
    assert_eq!(a["./bin/sh"].as_deref(), Some("u:object_r:shell_exec:s0"));
}

/// `--fs-config-file` (Android's canned fs_config, as mkfs.erofs built for Android
/// reads it): every inode gets the listed owner and permission bits (its type stays),
/// capabilities become `security.capability`, the last line of a path wins; the kernel
/// shows exactly that. An unlisted path (here a name with a space, which no line can
/// hold) is an error naming it, and no image is left. The drop-in takes Android's
/// command line (`--mount-point`, `--fs-config-file`, `--product-out`) and builds the
/// same bytes.
#[test]
fn fs_config_sets_owners_modes_and_capabilities() {
    use std::os::unix::fs::MetadataExt;
    if !kernel_available("fs_config_sets_owners_modes_and_capabilities") {
        return;
    }
    let (fs, src) = scratch_tree("fsconfig");
    // (path, uid, gid, mode, capabilities)
    let entries: &[(&str, u32, u32, u32, u64)] = &[
        ("", 0, 0, 0o755, 0),
        ("bin", 0, 2000, 0o751, 0),
        ("bin/sh", 0, 2000, 0o4755, (1 << 12) | (1 << 13)),
        ("bin/x.sh", 1000, 1001, 0o700, 0),
        ("bin/ls", 0, 2000, 0o2755, 1 << 36),
        ("bin/ls-hard", 0, 2000, 0o2755, 1 << 36),
        ("bin/sh2", 0, 0, 0o777, 0),
        ("etc", 0, 0, 0o755, 0),
        ("etc/hosts", 0, 0, 0o644, 0),
        ("etc/app.conf", 1000, 1000, 0o600, 0),
        ("lib", 0, 0, 0o1777, 0),
        ("lib/link", 0, 0, 0o777, 0),
        ("lib/null", 0, 0, 0o666, 0),
        ("lib/loop", 0, 6, 0o660, 0),
        ("lib/fifo", 1000, 1000, 0o620, 0),
        ("vendor", 0, 2000, 0o755, 0),
        ("vendor/firmware", 0, 2000, 0o755, 0),
        ("vendor/firmware/a.bin", 0, 0, 0o444, 0),
    ];
    let mut text = String::from(" 9 9 0700\nsystem/etc/hosts 5 5 0600 selabel=x\n");
    for (p, u, g, m, c) in entries {
        if p.is_empty() {
            text.push_str(&format!("/ {u} {g} {m:04o}\n"));
        } else if *c != 0 {
            text.push_str(&format!(
                "/system/{p} {u} {g} {m:04o} capabilities={c:#x}\n"
            ));
        } else {
            text.push_str(&format!("system/{p} {u} {g} {m:o}\n"));
        }
    }
    let cfg = fs.path().join("fs_config");
    std::fs::write(&cfg, &text).expect("write");
    let img = fs.path().join("sys.erofs");
    // "odd dir" has no line (a path with a space cannot have one).
    let out = run(&[
        &"build",
        &"--fs-config-file",
        &cfg,
        &"--mount-point",
        &"/system",
        &src,
        &img,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("system/odd dir") && err.contains("not listed in the fs_config file"),
        "{err}"
    );
    assert!(!img.exists());
    std::fs::remove_dir_all(src.join("odd dir")).expect("rm");
    ok(&[
        &"build",
        &"-q",
        &"-z",
        &"lz4hc",
        &"--fs-config-file",
        &cfg,
        &"--mount-point",
        &"/system",
        &src,
        &img,
    ]);
    let m = Mount::erofs(&img);
    for (p, u, g, mode, caps) in entries {
        let path = m.path().join(p);
        let md = std::fs::symlink_metadata(&path).expect("stat");
        let src_md = std::fs::symlink_metadata(src.join(p)).expect("stat source");
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (*u, *g, *mode),
            "{p}"
        );
        assert_eq!(md.mode() & 0o170000, src_md.mode() & 0o170000, "{p}: type");
        if md.file_type().is_symlink() {
            continue;
        }
        let got = xattr::get(&path, "security.capability").expect("getxattr");
        if *caps == 0 {
            assert_eq!(got, None, "{p}");
        } else {
            let mut want = vec![1u8, 0, 0, 2];
            want.extend_from_slice(&(*caps as u32).to_le_bytes());
            want.extend_from_slice(&[0; 4]);
            want.extend_from_slice(&((*caps >> 32) as u32).to_le_bytes());
            want.extend_from_slice(&[0; 4]);
            assert_eq!(got, Some(want), "{p}");
        }
    }
    // The source's other xattrs stay.
    assert_eq!(
        xattr::get(m.path().join("etc/app.conf"), "user.kept").expect("getxattr"),
        Some(b"1".to_vec())
    );
    drop(m);
    ok(&[&"check", &img]);
    fsck_erofs(&img).unwrap_or_else(|e| panic!("fsck.erofs: {e}"));
    // Android's command line through the drop-in: the same image.
    let d = fs.path().join("dropin.erofs");
    mkfs_dropin(
        fs.path(),
        &[
            &"-zlz4hc",
            &"--quiet",
            &"--mount-point=/system/",
            &"--product-out=/nowhere",
            &format!("--fs-config-file={}", cfg.display()),
            &d,
            &src,
        ],
    );
    assert_eq!(
        std::fs::read(&img).expect("img"),
        std::fs::read(&d).expect("drop-in")
    );
    // A bad line is named.
    std::fs::write(&cfg, "system/bin 0 0\n").expect("write");
    let out = run(&[&"build", &"--fs-config-file", &cfg, &src, &img]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fs_config:1:"));
}

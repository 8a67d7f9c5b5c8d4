//! Shared helpers for the CLI end-to-end tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub fn ferofs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferofs"))
}

/// Run ferofs with args; panic with its output unless it succeeds. Returns stdout.
pub fn ok(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "ferofs {:?} failed: {}\n{}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = ferofs();
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().expect("run ferofs")
}

/// Build `src` into `img` with extra args.
pub fn build(src: &Path, img: &Path, extra: &[&str]) {
    let mut c = ferofs();
    c.arg("build").arg("-q");
    c.args(extra);
    c.arg(src).arg(img);
    let out = c.output().expect("run ferofs build");
    assert!(
        out.status.success(),
        "ferofs build {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("bad JSON ({e}): {s}"))
}

/// The kernel mount of `img` equals `tree`; an fsck.erofs that knows the image's
/// features (1.9+: 48-bit, metabox) and `ferofs check` pass; `ferofs extract` into `x`
/// (removed afterwards) gives `tree` back.
pub fn assert_image_holds(img: &Path, tree: &Path, x: &Path, what: &str) {
    {
        let m = ferofs_testkit::Mount::erofs(img);
        ferofs_testkit::assert_same_tree(tree, m.path());
    }
    ferofs_testkit::fsck_metabox(img, what);
    ok(&[&"check", &img]);
    ok(&[&"extract", &img, &x]);
    ferofs_testkit::assert_same_tree(tree, x);
    std::fs::remove_dir_all(x).expect("rm");
}

/// Set xattr `name` of `path` to `value` (setfattr, hex-encoded).
#[allow(dead_code)]
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let out = Command::new("setfattr")
        .arg("-n")
        .arg(name)
        .arg("-v")
        .arg(format!(
            "0x{}",
            value.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ))
        .arg(path)
        .output()
        .expect("run setfattr");
    assert!(
        out.status.success(),
        "setfattr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run ferofs as `mkfs.erofs` (the drop-in: a symlink of that name in `dir`, made on
/// first use) with `args`; panic with its stderr unless it succeeds.
pub fn mkfs_dropin(dir: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let link = dir.join("mkfs.erofs");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferofs"), &link).expect("symlink");
    }
    let out = Command::new(&link)
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .expect("run mkfs.erofs");
    assert!(
        out.status.success(),
        "mkfs.erofs {:?}: {}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}

//! `build --verity` and `check --verity`: the appended dm-verity tree is the one
//! `veritysetup format` writes for the same image (byte for byte, given the same salt
//! and UUID), the image in front of it is unchanged, two builds give the same bytes,
//! `ferofs check --verity` names a flipped data block, and (as root, on a kernel with
//! device-mapper) `veritysetup open` accepts the image, the verity device mounts as
//! EROFS with the source's tree, and a flipped byte gives EIO.
//!
//! Needs veritysetup (cryptsetup-bin; scripts/test installs it). The kernel test needs
//! root and loop devices (FEROFS_SKIP_KERNEL=1 skips loudly) and a kernel with
//! device-mapper's verity target: without it the test is skipped loudly, or fails
//! when FEROFS_REQUIRE_DM_VERITY=1.

mod common;
use common::*;
use ferofs_testkit::run as sh;
use ferofs_testkit::{
    assert_same_tree, fsck_erofs, kernel_available, make_tree, scratch, tool, Mount,
};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn veritysetup() -> PathBuf {
    tool("veritysetup").expect("veritysetup not installed (apt-get install cryptsetup-bin)")
}

/// Pseudo-random (incompressible) bytes.
fn rnd(seed: u32, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A tree big enough for two tree levels (more than 128 data blocks).
fn tree(dir: &Path) {
    fs::create_dir_all(dir.join("d/e")).expect("mkdir");
    fs::write(dir.join("big"), rnd(7, 1_500_000)).expect("write");
    fs::write(dir.join("d/small"), b"small file\n").expect("write");
    fs::write(dir.join("d/e/mid"), rnd(9, 20_000)).expect("write");
    let text: Vec<u8> = b"compressible line of text\n"
        .iter()
        .copied()
        .cycle()
        .take(100_000)
        .collect();
    fs::write(dir.join("text"), text).expect("write");
    std::os::unix::fs::symlink("d/small", dir.join("link")).expect("symlink");
}

/// `build --verity --json` with `extra`: the summary's verity object.
fn build_verity(src: &Path, img: &Path, extra: &[&str]) -> Value {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"build", &"--verity", &"--json"];
    for e in extra {
        args.push(e);
    }
    args.push(&src);
    args.push(&img);
    let j = json(&ok(&args));
    let v = j["verity"].clone();
    assert!(v.is_object(), "no verity object: {j}");
    v
}

fn field(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} is no number: {v}"))
}

/// `veritysetup format` of `data` into a new hash file; its root hash.
fn veritysetup_format(data: &Path, hash: &Path, salt: &str, uuid: &str) -> String {
    fs::write(hash, b"").expect("create hash file");
    let out = sh(Command::new(veritysetup())
        .arg("format")
        .arg(format!("--salt={salt}"))
        .arg(format!("--uuid={uuid}"))
        .arg(data)
        .arg(hash));
    out.lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| panic!("no root hash in veritysetup's output:\n{out}"))
}

/// `veritysetup verify IMAGE IMAGE ROOT --hash-offset=H` (userspace, no kernel).
fn veritysetup_verify(img: &Path, root: &str, hash_offset: u64) -> std::process::Output {
    Command::new(veritysetup())
        .arg("verify")
        .arg(img)
        .arg(img)
        .arg(root)
        .arg(format!("--hash-offset={hash_offset}"))
        .output()
        .expect("run veritysetup verify")
}

#[test]
fn verity_tree_equals_veritysetup_format() {
    let tmp = scratch("verity-format");
    let src = tmp.path().join("src");
    tree(&src);
    // (name, build options, --verity options)
    for (name, opts, salt) in [
        ("plain", vec!["-z", "none"], vec![]),
        ("lz4hc", vec![], vec![]),
        ("salted", vec!["-z", "lz4"], vec!["--verity-salt", "00ff10"]),
        ("nosalt", vec!["-z", "none"], vec!["--verity-salt", "-"]),
        (
            "metabox",
            vec!["-z", "lz4hc", "-m", "-E", "smallest"],
            vec![],
        ),
    ] {
        let extra: Vec<&str> = opts.iter().chain(&salt).copied().collect();
        let img = tmp.path().join(format!("{name}.erofs"));
        let v = build_verity(&src, &img, &extra);
        // The image in front of the tree: what a build without --verity writes.
        let bare = tmp.path().join(format!("{name}.bare.erofs"));
        build(&src, &bare, &opts);
        let (image, bytes) = (
            fs::read(&img).expect("read"),
            fs::read(&bare).expect("read"),
        );
        let hash_offset = num(&v, "hash_offset");
        assert_eq!(
            bytes.len() as u64,
            hash_offset,
            "{name}: hash offset is the image's end"
        );
        assert!(
            image.starts_with(&bytes),
            "{name}: --verity changed the image"
        );
        assert_eq!(image.len() as u64, num(&v, "file_bytes"), "{name}");
        assert_eq!(num(&v, "data_blocks") * 4096, hash_offset, "{name}");
        // Reproducible.
        let again = tmp.path().join(format!("{name}.again.erofs"));
        let w = build_verity(&src, &again, &extra);
        for k in [
            "root_hash",
            "salt",
            "uuid",
            "data_blocks",
            "hash_offset",
            "hash_blocks",
        ] {
            assert_eq!(v[k], w[k], "{name}: {k} differs between two builds");
        }
        assert_eq!(
            fs::read(&again).expect("read"),
            image,
            "{name}: two builds differ"
        );
        // veritysetup, given the same salt and UUID, writes the same hash area.
        let salt = match field(&v, "salt") {
            s if s.is_empty() => "-".to_string(),
            s => s,
        };
        let hash = tmp.path().join(format!("{name}.hash"));
        let root = veritysetup_format(&bare, &hash, &salt, &field(&v, "uuid"));
        assert_eq!(root, field(&v, "root_hash"), "{name}: root hash");
        let area = fs::read(&hash).expect("read hash file");
        assert!(
            image[hash_offset as usize..] == area[..],
            "{name}: the hash area differs from veritysetup's ({} vs {} bytes)",
            image.len() as u64 - hash_offset,
            area.len()
        );
        let out = veritysetup_verify(&img, &root, hash_offset);
        assert!(
            out.status.success(),
            "{name}: veritysetup verify: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let salted = build_verity(
        &src,
        &tmp.path().join("s2.erofs"),
        &["--verity-salt", "00FF10"],
    );
    assert_eq!(field(&salted, "salt"), "00ff10");
}

#[test]
fn verity_build_prints_root_hash_and_veritysetup_line() {
    let tmp = scratch("verity-print");
    let src = tmp.path().join("src");
    tree(&src);
    let img = tmp.path().join("app.erofs");
    // -q keeps stderr quiet; the root hash still goes to stdout.
    let r = run(&[&"build", &"-q", &"--verity", &src, &img]);
    assert!(r.status.success() && r.stderr.is_empty(), "{r:?}");
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    let get = |k: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {k:?} line in:\n{out}"))
    };
    let root = get("root hash ");
    assert_eq!(root.len(), 64, "{out}");
    assert_eq!(get("salt ").len(), 64, "{out}");
    let open = get("open with ");
    let len = fs::metadata(&img).expect("stat").len();
    let want = format!(
        "veritysetup open {} app {} {root} --hash-offset=",
        img.display(),
        img.display()
    );
    assert!(open.starts_with(&want), "{open}\nwant {want}");
    let off: u64 = open
        .rsplit('=')
        .next()
        .and_then(|s| s.parse().ok())
        .expect("hash offset");
    assert!(off < len && off.is_multiple_of(4096), "{open}");
    let v = veritysetup_verify(&img, &root, off);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    // inspect shows the tree's superblock.
    let i = json(&ok(&[&"inspect", &"--json", &img]));
    assert_eq!(i["verity"]["hash_offset"], off, "{i}");
    assert_eq!(
        i["verity"]["salt"].as_str(),
        Some(get("salt ").as_str()),
        "{i}"
    );
    let plain = tmp.path().join("plain.erofs");
    build(&src, &plain, &[]);
    assert!(json(&ok(&[&"inspect", &"--json", &plain]))["verity"].is_null());
    // What --verity cannot do.
    for bad in [
        vec!["-b", "1024"],
        vec!["--verity-salt", "abc"],
        vec!["--verity-salt", "zz"],
    ] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"build", &"-q", &"--verity"];
        for b in &bad {
            args.push(b);
        }
        let bad_img = tmp.path().join("bad.erofs");
        args.push(&src);
        args.push(&bad_img);
        let r = run(&args);
        assert!(!r.status.success(), "{bad:?} accepted");
        assert!(!bad_img.exists(), "{bad:?} left an image");
    }
}

/// `ferofs check --verity ROOT IMAGE` with `extra`: (exit code, stdout).
fn check_verity(img: &Path, root: &str, extra: &[&str]) -> (i32, String) {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"check", &"--verity", &root];
    for e in extra {
        args.push(e);
    }
    args.push(&img);
    let out = run(&args);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn physical(img: &Path, path: &str) -> u64 {
    let st = json(&ok(&[&"stat", &"--json", &img, &path]));
    st["extents"][0]["physical"]
        .as_u64()
        .unwrap_or_else(|| panic!("{path} has no data extent: {st}"))
}

fn flip(img: &Path, at: u64) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .expect("open image");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read byte");
    f.write_all_at(&[b[0] ^ 0x5A], at).expect("write byte");
}

#[test]
fn check_verity_names_a_flipped_block() {
    let tmp = scratch("verity-check");
    let src = tmp.path().join("src");
    tree(&src);
    for (name, extra) in [("plain", vec!["-z", "none"]), ("lz4hc", vec![])] {
        let img = tmp.path().join(format!("{name}.erofs"));
        let v = build_verity(&src, &img, &extra);
        let root = field(&v, "root_hash");
        let (code, out) = check_verity(&img, &root, &[]);
        assert_eq!(code, 0, "{name}: {out}");
        assert!(out.contains("all match"), "{name}: {out}");
        let j = json(&check_verity(&img, &root, &["--json"]).1);
        assert_eq!(j["summary"]["verity"]["mismatches"], 0, "{j}");
        assert_eq!(j["summary"]["verity"]["levels"], 2, "{j}");

        // A wrong root hash.
        let wrong = format!(
            "{}{}",
            if root.starts_with('0') { "1" } else { "0" },
            &root[1..]
        );
        let (code, out) = check_verity(&img, &wrong, &[]);
        assert_eq!(code, 1, "{name}: {out}");
        assert!(
            out.contains("(verity tree): the tree's top does not give the root hash"),
            "{out}"
        );
        // Not a root hash at all.
        assert_eq!(check_verity(&img, "abcd", &[]).0, 2);

        // One byte of /d/e/mid's data: its block, named with the file.
        let bad = tmp.path().join(format!("{name}.bad.erofs"));
        fs::copy(&img, &bad).expect("copy");
        let at = physical(&bad, "/d/e/mid") + 100;
        flip(&bad, at);
        let block = at / 4096;
        let (code, out) = check_verity(&bad, &root, &[]);
        assert_eq!(code, 1, "{name}: {out}");
        let want = format!("/d/e/mid: data block {block} (bytes {}..", block * 4096);
        assert!(out.contains(&want), "{name}: no {want:?} in\n{out}");
        assert!(out.contains("1 mismatch"), "{name}: {out}");
        let j = json(&check_verity(&bad, &root, &["--json"]).1);
        let p = j["problems"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["kind"] == "VerityDataBlock"))
            .unwrap_or_else(|| panic!("no VerityDataBlock: {j}"));
        assert_eq!(p["value"], block, "{j}");
        assert_eq!(p["paths"][0], "/d/e/mid", "{j}");
        // veritysetup agrees on where.
        let vs = veritysetup_verify(&bad, &root, num(&v, "hash_offset"));
        assert!(!vs.status.success());
        let err = String::from_utf8_lossy(&vs.stderr);
        assert!(err.contains(&format!("position {}", block * 4096)), "{err}");

        // A byte of the tree (the last hash block: level 0's last).
        let tree_bad = tmp.path().join(format!("{name}.tree.erofs"));
        fs::copy(&img, &tree_bad).expect("copy");
        let len = fs::metadata(&tree_bad).expect("stat").len();
        flip(&tree_bad, len - 4096);
        let (code, out) = check_verity(&tree_bad, &root, &[]);
        assert_eq!(code, 1, "{name}: {out}");
        assert!(out.contains("(verity tree): hash block"), "{name}: {out}");
    }
}

// ---- The kernel: the image with its tree mounts as it is; veritysetup open, mount, EIO.

#[test]
fn verity_image_mounts_as_plain_erofs() {
    if !kernel_available("verity_image_mounts_as_plain_erofs") {
        return;
    }
    let (_fs, src) = make_tree();
    let tmp = scratch("verity-plain-mount");
    let img = tmp.path().join("p.erofs");
    build_verity(&src, &img, &[]);
    let m = Mount::erofs(&img);
    assert_same_tree(&src, m.path());
    drop(m);
    if tool("fsck.erofs").is_some() {
        if let Err(e) = fsck_erofs(&img) {
            panic!("fsck.erofs of an image with its verity tree: {e}");
        }
    }
}

/// True when the kernel test can run: root, loop devices (see `kernel_available`) and
/// device-mapper with the verity target. A kernel without device-mapper is a loud
/// skip (no package installs it), a failure with FEROFS_REQUIRE_DM_VERITY=1.
fn dm_verity_available(test: &str) -> bool {
    if !kernel_available(test) {
        return false;
    }
    let _ = Command::new("modprobe").arg("dm-verity").status();
    let misc = fs::read_to_string("/proc/misc").unwrap_or_default();
    if misc
        .lines()
        .any(|l| l.trim_end().ends_with(" device-mapper"))
    {
        return true;
    }
    let why = "this kernel has no device-mapper (no device-mapper in /proc/misc, modprobe dm-verity failed)";
    if std::env::var("FEROFS_REQUIRE_DM_VERITY").is_ok_and(|v| v == "1") {
        panic!("kernel test {test} cannot run: {why} (FEROFS_REQUIRE_DM_VERITY=1)");
    }
    eprintln!("\n*** SKIPPED kernel test {test}: {why} ***\n");
    false
}

/// An open verity device (`veritysetup open`); closed on drop.
struct VerityDev {
    name: String,
}

impl VerityDev {
    fn open(img: &Path, name: &str, root: &str, hash_offset: u64) -> Self {
        sh(Command::new(veritysetup())
            .arg("open")
            .arg(img)
            .arg(name)
            .arg(img)
            .arg(root)
            .arg(format!("--hash-offset={hash_offset}")));
        VerityDev { name: name.into() }
    }
    fn path(&self) -> PathBuf {
        Path::new("/dev/mapper").join(&self.name)
    }
}

impl Drop for VerityDev {
    fn drop(&mut self) {
        // Bounded: a few tries while a just-unmounted device is still busy.
        for _ in 0..10 {
            let ok = Command::new(veritysetup())
                .arg("close")
                .arg(&self.name)
                .status()
                .is_ok_and(|s| s.success());
            if ok || !self.path().exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

/// A block device mounted read-only as EROFS; unmounted on drop.
struct DevMount {
    dir: tempfile::TempDir,
}

impl DevMount {
    fn new(dev: &Path) -> Self {
        let dir = scratch("verity-mnt");
        sh(Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
            .arg(dev)
            .arg(dir.path()));
        DevMount { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for DevMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn verity_kernel_open_mount_and_eio() {
    if !dm_verity_available("verity_kernel_open_mount_and_eio") {
        return;
    }
    let (_fs, src) = make_tree();
    fs::write(src.join("verity-victim"), rnd(11, 64 * 1024)).expect("write");
    let bystander = rnd(13, 64 * 1024);
    fs::write(src.join("verity-bystander"), &bystander).expect("write");
    let tmp = scratch("verity-kernel");
    let img = tmp.path().join("k.erofs");
    let v = build_verity(&src, &img, &[]);
    let root = field(&v, "root_hash");
    let hash_offset = num(&v, "hash_offset");
    let name = format!("ferofs-verity-test-{}", std::process::id());
    {
        let dev = VerityDev::open(&img, &name, &root, hash_offset);
        let mnt = DevMount::new(&dev.path());
        assert_same_tree(&src, mnt.path());
        drop(mnt);
        drop(dev);
    }
    // One byte of the victim's data changed: reading it fails with EIO, the rest of
    // the tree still reads.
    flip(&img, physical(&img, "/verity-victim") + 10);
    let dev = VerityDev::open(&img, &name, &root, hash_offset);
    let mnt = DevMount::new(&dev.path());
    let err =
        fs::read(mnt.path().join("verity-victim")).expect_err("read of a changed block succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let other = fs::read(mnt.path().join("verity-bystander")).expect("read a block not changed");
    assert!(other == bystander, "verity-bystander reads wrong bytes");
    drop(mnt);
    drop(dev);
}

/// `--fsverity-digests`: through the kernel's mount, every regular file of
/// `make-tree.py`'s tree (hardlinks, holes, empty and large files) carries a
/// `trusted.overlay.metacopy` xattr (version 0, length 36, flags 0, SHA-256) whose
/// digest is what `fsverity digest` computes from the source file, plain and packed; a
/// source file that already had the xattr gets the right value; `check` passes; without
/// the option no digest is added.
#[test]
fn fsverity_digests_equal_fsverity_utils_through_the_kernel() {
    if !kernel_available("fsverity_digests_equal_fsverity_utils_through_the_kernel") {
        return;
    }
    let fsverity = tool("fsverity").expect("fsverity not installed (apt-get install fsverity)");
    let (_fs, src) = make_tree();
    let out = scratch("fsverity-out");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    // Bounded by the tree.
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("ls").flatten() {
            let ft = e.file_type().expect("type");
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                files.push(e.path());
            }
        }
    }
    assert!(files.len() > 20, "tree too small: {}", files.len());
    // One source file claims a wrong digest already: it must be replaced.
    xattr::set(&files[0], "trusted.overlay.metacopy", &[0u8; 36]).expect("set xattr");
    for (name, extra) in [
        ("plain", vec!["-z", "none"]),
        (
            "packed",
            vec!["-z", "lz4hc", "-E", "smallest", "-C", "65536"],
        ),
    ] {
        let img = out.path().join(format!("{name}.erofs"));
        let mut args = vec!["--fsverity-digests"];
        args.extend(extra.iter().copied());
        build(&src, &img, &args);
        ok(&[&"check", &img]);
        let m = Mount::erofs(&img);
        for f in &files {
            let rel = f.strip_prefix(&src).expect("rel");
            let want = sh(Command::new(&fsverity).args(["digest", "--compact"]).arg(f));
            let v = xattr::get(m.path().join(rel), "trusted.overlay.metacopy")
                .expect("getxattr")
                .unwrap_or_else(|| panic!("{name}: {} has no digest", rel.display()));
            assert_eq!(v.len(), 36, "{name}: {}", rel.display());
            assert_eq!(v[..4], [0, 36, 0, 1], "{name}: {}", rel.display());
            let got: String = v[4..].iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, want.trim(), "{name}: {}", rel.display());
        }
        drop(m);
    }
    // Without the option the image carries no digests but the source's own xattr.
    let img = out.path().join("none.erofs");
    build(&src, &img, &["-z", "lz4"]);
    let m = Mount::erofs(&img);
    let rel = files[1].strip_prefix(&src).expect("rel");
    assert_eq!(
        xattr::get(m.path().join(rel), "trusted.overlay.metacopy").expect("getxattr"),
        None
    );
    drop(m);
}

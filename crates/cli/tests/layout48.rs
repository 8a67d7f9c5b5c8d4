//! `-E 48bit` and `-E dot-omitted` (Linux 6.15+) through the kernel: compact 32-byte
//! inodes carry every mtime that has no nanoseconds and lies within 2^32-1 s of the
//! epoch, so only the inodes that need more are extended; mtimes are never wrapped or
//! rounded (mkfs.erofs 1.9.3 does both, MANIFEST note E2). The kernel mount equals the
//! tree, `ferofs check` and `extract` pass, and an fsck.erofs that knows the 48-bit
//! layout (1.9+) passes.

mod common;
use common::*;
use ferofs_testkit::*;
use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Superblock fields: (feature_incompat, epoch, build_time, rootnid_2b, rootnid_8b).
fn sb_fields(img: &Path) -> (u32, i64, u32, u16, u64) {
    let mut b = [0u8; 1024 + 128];
    std::fs::File::open(img)
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read superblock");
    let sb = &b[1024..];
    let u32_at = |o: usize| u32::from_le_bytes(sb[o..o + 4].try_into().expect("4"));
    let u64_at = |o: usize| u64::from_le_bytes(sb[o..o + 8].try_into().expect("8"));
    (
        u32_at(0x50),
        u64_at(0x18) as i64,
        u32_at(0x6C),
        u16::from_le_bytes([sb[0x0E], sb[0x0F]]),
        u64_at(0x70),
    )
}

/// Every inode of `tree`, the root included, each hardlinked inode once.
fn inodes(tree: &Path) -> Vec<std::fs::Metadata> {
    let mut seen = HashSet::new();
    let mut all = Vec::new();
    let mut stack = vec![tree.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).expect("lstat");
        if md.is_dir() {
            for e in std::fs::read_dir(&p).expect("readdir") {
                stack.push(e.expect("entry").path());
            }
        }
        if seen.insert(md.ino()) {
            all.push(md);
        }
    }
    all
}

/// The mtime in whole seconds most inodes of `tree` have; ties go to the newest.
fn most_common_whole_second(tree: &Path) -> i64 {
    let mut count = std::collections::BTreeMap::<i64, usize>::new();
    for md in inodes(tree).iter().filter(|md| md.mtime_nsec() == 0) {
        *count.entry(md.mtime()).or_default() += 1;
    }
    let most = count.values().copied().max().expect("a whole-second mtime");
    count
        .iter()
        .rev()
        .find(|(_, n)| **n == most)
        .map(|(t, _)| *t)
        .expect("found")
}

/// Inodes of `tree` that a compact inode cannot hold in the 48-bit layout with epoch
/// `epoch`: an mtime with nanoseconds or out of reach, owner or link count over 16
/// bits, size over 32 bits.
fn needs_extended(tree: &Path, epoch: i64) -> usize {
    inodes(tree)
        .iter()
        .filter(|md| {
            md.mtime_nsec() != 0
                || !(0..=i64::from(u32::MAX)).contains(&(md.mtime() - epoch))
                || md.uid() > 0xFFFF
                || md.gid() > 0xFFFF
                || md.nlink() > 0xFFFF
                || md.size() > u64::from(u32::MAX)
        })
        .count()
}

#[test]
fn layout48_compact_inodes_keep_every_mtime() {
    if !kernel_available("layout48") {
        return;
    }
    let (fs, tree) = make_tree();
    // (options, -E with the 48-bit layout, -E without it, -m)
    for (common, new, old_e, metabox) in [
        (&["-z", "none"][..], "48bit", "", false),
        (
            &["-z", "lz4hc", "-C", "65536"][..],
            "smallest,48bit",
            "smallest",
            false,
        ),
        (
            &["-z", "zstd"][..],
            "dot-omitted,fragments",
            "fragments",
            false,
        ),
        (
            &["-z", "lzma", "-C", "1048576"][..],
            "all-fragments,dedupe",
            "all-fragments,dedupe",
            true,
        ),
    ] {
        let what = format!("{common:?} -E {new} -m {metabox}");
        let img = fs.path().join("48.erofs");
        let old = fs.path().join("old.erofs");
        let mut args = common.to_vec();
        args.extend(["-E", new]);
        if metabox {
            args.push("-m");
        }
        build(&tree, &img, &args);
        // The same build without the 48-bit layout (and without -m).
        let mut base = common.to_vec();
        if !old_e.is_empty() {
            base.extend(["-E", old_e]);
        }
        build(&tree, &old, &base);

        let (incompat, epoch, build_time, root2, root8) = sb_fields(&img);
        assert_eq!(incompat & 0x80, 0x80, "{what}: 48bit flag, {incompat:#x}");
        // The tree's newest mtime is 2^32-1 (times/u32-max): epoch 0, as mkfs.erofs.
        assert_eq!((epoch, build_time), (0, u32::MAX), "{what}");
        if metabox {
            assert_eq!((root2, root8 >> 63), (0, 1), "{what}: root in the metabox");
        } else {
            assert!(
                root2 != 0 && root8 == 0,
                "{what}: 16-bit root nid {root2}/{root8}"
            );
        }
        let (old_incompat, old_epoch, _, _, _) = sb_fields(&old);
        assert_eq!(old_incompat & 0x80, 0, "{what}: no 48bit flag without it");
        // Without the layout compact inodes show the epoch: the tree's most common
        // whole-second mtime (ties: the newest).
        assert_eq!(
            old_epoch,
            most_common_whole_second(&tree),
            "{what}: epoch = the most common mtime"
        );

        let info = json(&ok(&[&"inspect", &"--json", &img]));
        let ext = info["counts"]["extended_inodes"].as_u64().expect("count");
        assert_eq!(ext as usize, needs_extended(&tree, 0), "{what}");
        let old_info = json(&ok(&[&"inspect", &"--json", &old]));
        let old_ext = old_info["counts"]["extended_inodes"]
            .as_u64()
            .expect("count");
        assert!(
            old_ext > 20 * ext,
            "{what}: {old_ext} extended inodes before, {ext}"
        );
        let (new_len, old_len) = (
            std::fs::metadata(&img).expect("stat").len(),
            std::fs::metadata(&old).expect("stat").len(),
        );
        assert!(
            new_len < old_len,
            "{what}: {new_len} bytes against {old_len}"
        );

        if !metabox && common.contains(&"65536") {
            assert_encoded_extents(&img, "/data/mixed-5MiB.bin", &what);
        }
        assert_image_holds(&img, &tree, &fs.path().join("x"), &what);
    }
}

/// The compressed file `path` of `img` (no xattrs, nids from byte 0) is mapped by
/// 16-byte encoded-extent records: the map header says so and holds their count, and
/// every record is the extent `ferofs stat` reports (byte address, pcluster length,
/// algorithm lz4 = format 1, logical start).
fn assert_encoded_extents(img: &Path, path: &str, what: &str) {
    let st = json(&ok(&[&"stat", &"--json", &img, &path]));
    assert_eq!(
        st["layout"].as_str(),
        Some("compressed-full"),
        "{what}: {st}"
    );
    assert_eq!(st["inode_format"].as_str(), Some("compact"), "{what}");
    let extents = st["extents"].as_array().expect("extents");
    assert!(extents.len() > 10, "{what}: {} extents", extents.len());
    let bytes = std::fs::read(img).expect("read image");
    let nid = st["nid"].as_u64().expect("nid") as usize;
    // Compact inode (32 bytes), map header at 32, records at 48.
    let h = &bytes[nid * 32 + 32..nid * 32 + 40];
    let count = u32::from_le_bytes(h[0..4].try_into().expect("4"));
    assert_eq!(count as usize, extents.len(), "{what}: extent count");
    // EXTENTS with 16-byte records, FRAGMENT_PCLUSTER when the tail is a fragment.
    let advise = u16::from_le_bytes([h[4], h[5]]);
    let tail = extents.last().and_then(|e| e["kind"].as_str()) == Some("plain fragment");
    let want = if tail { 0x0025 } else { 0x0005 };
    assert_eq!(advise, want, "{what}: advise");
    assert_eq!((h[6], h[7]), (0, 0), "{what}: count high half");
    for (k, e) in extents.iter().enumerate() {
        let r = &bytes[nid * 32 + 48 + 16 * k..nid * 32 + 64 + 16 * k];
        let w = |o: usize| u32::from_le_bytes(r[o..o + 4].try_into().expect("4"));
        if tail && k + 1 == extents.len() {
            // The fragment's offset in the packed inode (below 4 GiB here), then the
            // logical start.
            assert_eq!(w(8), 0, "{what}: fragment record");
            assert_eq!(
                Some(u64::from(w(12))),
                e["logical"].as_u64(),
                "{what}: tail"
            );
            continue;
        }
        assert_eq!(e["kind"].as_str(), Some("lz4"), "{what}: {e}");
        assert_eq!(w(0), 65536 | 1 << 28, "{what}: record {k} plen");
        let pstart = u64::from(w(4)) | u64::from(w(8)) << 32;
        assert_eq!(
            Some(pstart),
            e["physical"].as_u64(),
            "{what}: record {k} pstart"
        );
        assert_eq!(
            Some(u64::from(w(12))),
            e["logical"].as_u64(),
            "{what}: record {k} lstart"
        );
    }
}

/// `-E dot-omitted`: no "." dirent in any directory (an empty directory holds only
/// "..": 14 bytes), the kernel still lists "." with the directory's own inode number.
#[test]
fn dot_omitted_directories_list_dot_through_the_kernel() {
    if !kernel_available("dot_omitted") {
        return;
    }
    let fs = tempfile::tempdir().expect("tempdir");
    let tree = fs.path().join("tree");
    std::fs::create_dir_all(tree.join("a/empty")).expect("mkdir");
    std::fs::write(tree.join("a/f"), b"x").expect("write");
    for (opt, empty_size) in [("dot-omitted", 14u64), ("48bit", 27)] {
        let img = fs.path().join(format!("{opt}.erofs"));
        build(&tree, &img, &["-E", opt]);
        let st = json(&ok(&[&"stat", &"--json", &img, &"/a/empty"]));
        assert_eq!(st["size"].as_u64(), Some(empty_size), "{opt}: {st}");
        let ls = json(&ok(&[&"ls", &"--json", &"-a", &img, &"/a"]));
        let names: Vec<&str> = ls
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(names, [".", "..", "empty", "f"], "{opt}");
        let m = Mount::erofs(&img);
        let a = m.path().join("a");
        let mut seen: Vec<String> = std::fs::read_dir(&a)
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        seen.sort();
        assert_eq!(seen, ["empty", "f"], "{opt}");
        // "." itself, through getdents (read_dir hides it): `ls -ai` shows it with
        // the directory's inode number.
        let out = std::process::Command::new("ls")
            .arg("-ai")
            .arg(&a)
            .output()
            .expect("ls");
        let text = String::from_utf8_lossy(&out.stdout);
        let ino = std::fs::metadata(&a).expect("stat").ino();
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == [&ino.to_string(), "."]),
            "{opt}: {text}"
        );
        assert_same_tree(&tree, m.path());
    }
}

/// Shifted dedupe under the 48-bit layout: a file that repeats another from an offset
/// shares its pclusters through encoded-extent records, the one where the copy ends a
/// partial reference (bit 27 of `plen`), and the kernel reads both files back.
#[test]
fn shifted_dedupe_writes_partial_extent_records() {
    if !kernel_available("layout48_partial") {
        return;
    }
    let fs = tempfile::tempdir().expect("tempdir");
    let tree = fs.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    // 2 MB of text: words of a 3,000-word vocabulary picked by xorshift (lz4 about
    // 2:1, so pclusters hold 100-130 KB and records beat the index).
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let words: Vec<Vec<u8>> = (0..3000)
        .map(|_| {
            let len = 2 + (next() % 8) as usize;
            (0..len).map(|_| b'a' + (next() % 16) as u8).collect()
        })
        .collect();
    let mut a = Vec::with_capacity(2_000_100);
    while a.len() < 2_000_000 {
        a.extend_from_slice(&words[(next() % 3000) as usize]);
        a.push(b' ');
    }
    std::fs::write(tree.join("a"), &a).expect("write");
    std::fs::write(tree.join("c"), &a[300_000..1_200_000]).expect("write");
    let img = fs.path().join("d.erofs");
    build(
        &tree,
        &img,
        &["-z", "lz4", "-C", "65536", "-E", "dedupe,48bit"],
    );
    let bytes = std::fs::read(&img).expect("read image");
    let st = json(&ok(&[&"stat", &"--json", &img, &"/c"]));
    let nid = st["nid"].as_u64().expect("nid") as usize;
    // The file's mtime has nanoseconds: an extended inode (64 bytes), the map header
    // behind it, the records 16-byte aligned behind that.
    assert_eq!(st["inode_format"].as_str(), Some("extended"), "{st}");
    let h = &bytes[nid * 32 + 64..nid * 32 + 72];
    assert_eq!(
        u16::from_le_bytes([h[4], h[5]]),
        0x0005,
        "advise: EXTENTS, 16 bytes"
    );
    let count = u32::from_le_bytes(h[0..4].try_into().expect("4")) as usize;
    let plen = |k: usize| {
        let o = nid * 32 + 80 + 16 * k;
        u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4"))
    };
    let partial: Vec<usize> = (0..count).filter(|&k| plen(k) >> 27 & 1 != 0).collect();
    // One: the shared extent in which c's copy of a ends.
    assert!(
        partial.len() == 1 && partial[0] > 0,
        "partial references {partial:?} among {count} records"
    );
    // Shared with `a`: some of c's pclusters are a's.
    let a_st = json(&ok(&[&"stat", &"--json", &img, &"/a"]));
    let phys = |s: &serde_json::Value| -> HashSet<u64> {
        s["extents"]
            .as_array()
            .expect("extents")
            .iter()
            .filter_map(|e| e["physical"].as_u64())
            .collect()
    };
    assert!(phys(&st).intersection(&phys(&a_st)).count() >= 5, "{st}");
    let m = Mount::erofs(&img);
    assert_same_tree(&tree, m.path());
    drop(m);
    ok(&[&"check", &img]);
    fsck_metabox(&img, "shifted dedupe, 48bit");
}

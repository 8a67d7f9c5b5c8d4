//! `ferofs check`: hand-corrupted images (built by our builder from a small tree, then
//! bytes patched at known places) must be reported with path and nid, all at once when
//! several are combined; clean images (ours and every golden image) report nothing.

mod common;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// A small tree with every structure the corruptions below need.
fn small_tree(dir: &Path) {
    fs::create_dir_all(dir.join("alpha/sub")).expect("mkdir");
    fs::create_dir_all(dir.join("beta")).expect("mkdir");
    fs::create_dir_all(dir.join("gamma")).expect("mkdir");
    fs::create_dir_all(dir.join("delta")).expect("mkdir");
    fs::write(dir.join("delta/zz1"), b"lost\n").expect("write");
    fs::write(dir.join("alpha/m1"), b"one\n").expect("write");
    fs::write(dir.join("alpha/m2"), b"two\n").expect("write");
    fs::write(dir.join("alpha/sub/deep"), b"deep\n").expect("write");
    fs::write(dir.join("beta/p1"), b"p1 data\n").expect("write");
    fs::write(dir.join("beta/p2"), b"p2 data\n").expect("write");
    fs::write(dir.join("hl1"), b"linked\n").expect("write");
    fs::hard_link(dir.join("hl1"), dir.join("gamma/hl2")).expect("link");
    fs::write(dir.join("xf"), b"has an xattr\n").expect("write");
    xattr::set(dir.join("xf"), "user.check", b"xattrvalue42").expect("set xattr");
    // Pseudo-random (incompressible) data, so the compressed image keeps it too.
    let mut x = 0x1234_5678u32;
    let mut rnd = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    };
    fs::write(dir.join("ov1"), rnd(12288)).expect("write");
    fs::write(dir.join("ov2"), rnd(8192)).expect("write");
    let text: Vec<u8> = b"compressible text line\n"
        .iter()
        .copied()
        .cycle()
        .take(65536)
        .collect();
    fs::write(dir.join("comp"), text).expect("write");
}

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    plain: PathBuf,
    lz4: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let src = dir.join("src");
    small_tree(&src);
    let plain = dir.join("plain.img");
    build(&src, &plain, &["-z", "none"]);
    let lz4 = dir.join("lz4.img");
    build(&src, &lz4, &["-z", "lz4"]);
    Fixture {
        _tmp: tmp,
        dir,
        plain,
        lz4,
    }
}

fn stat(img: &Path, path: &str) -> Value {
    json(&ok(&[&"stat", &"--json", &img, &path]))
}
fn nid(img: &Path, path: &str) -> u64 {
    stat(img, path)["nid"].as_u64().expect("nid")
}
/// Byte position of an inode (no metabox).
fn inode_pos(img: &Path, path: &str) -> usize {
    let i = json(&ok(&[&"inspect", &"--json", &img]));
    let meta = i["meta_blkaddr"].as_u64().expect("meta_blkaddr");
    let bs = i["block_size"].as_u64().expect("block_size");
    (meta * bs + nid(img, path) * 32) as usize
}
fn find(b: &[u8], pat: &[u8]) -> usize {
    let hits: Vec<usize> = b
        .windows(pat.len())
        .enumerate()
        .filter(|(_, w)| *w == pat)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "{:?} found {} times", pat, hits.len());
    hits[0]
}
/// Recompute the superblock checksum after patching (so only the patch is reported).
fn fix_checksum(b: &mut [u8]) {
    let n = ferofs_format::sb::checksum_len(4096);
    let c = ferofs_format::sb::compute_checksum(&b[1024..1024 + n]);
    b[1028..1032].copy_from_slice(&c.to_le_bytes());
}

/// One corruption: patches `b` and returns the (path, nid, kind) it must be reported as.
type Corruption = fn(&Path, &mut [u8]) -> (String, Option<u64>, &'static str);

fn swap_names(_: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // alpha's names are stored "." ".." "m1" "m2" "sub" back to back.
    let p = find(b, b"...m1m2sub");
    b[p + 3..p + 7].copy_from_slice(b"m2m1");
    ("/alpha/m1".into(), None, "UnsortedDirectory")
}
fn nid_past_end(_: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // beta: 4 dirents (12 bytes) then "...p1p2"; p1 is dirent 2.
    let blk = find(b, b"...p1p2") - 48;
    b[blk + 24..blk + 32].copy_from_slice(&0xFFFF_FFFFu64.to_le_bytes());
    ("/beta/p1".into(), Some(0xFFFF_FFFF), "NidOutOfRange")
}
fn dotdot(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // alpha/sub: 3 dirents then "...deep"; ".." is dirent 1.
    let blk = find(b, b"...deep") - 36;
    let beta = nid(img, "/beta");
    b[blk + 12..blk + 20].copy_from_slice(&beta.to_le_bytes());
    (
        "/alpha/sub".into(),
        Some(nid(img, "/alpha/sub")),
        "BadDotDot",
    )
}
fn bad_dir_block(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // delta: 3 dirents then "...zz1"; the first nameoff made impossible.
    let blk = find(b, b"...zz1") - 36;
    b[blk + 8..blk + 10].copy_from_slice(&0xFFFFu16.to_le_bytes());
    ("/delta".into(), Some(nid(img, "/delta")), "BadNameoff")
}
fn nlink(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    let p = inode_pos(img, "/hl1");
    assert_eq!(b[p] & 1, 1, "test expects extended inodes");
    b[p + 0x2C..p + 0x30].copy_from_slice(&5u32.to_le_bytes());
    ("/gamma/hl2".into(), Some(nid(img, "/hl1")), "BadNlink")
}
fn xattr_entry(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // Entry header (name_len, index, value_size) sits just before the name.
    let p = find(b, b"checkxattrvalue42");
    b[p - 4] = 0xFF;
    ("/xf".into(), Some(nid(img, "/xf")), "BadXattr")
}
fn overlap(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // In the lz4 image: ov2's uncompressed blocks moved onto comp's pcluster (blocks of
    // uncompressed data may overlap each other: block dedupe; never a pcluster).
    let c = &stat(img, "/comp")["extents"][0];
    assert!(
        c["kind"].as_str().expect("kind").starts_with("lz4"),
        "comp is compressed: {c}"
    );
    let at = c["physical"].as_u64().expect("comp extent");
    assert_eq!(stat(img, "/ov2")["layout"], "flat-plain");
    let p = inode_pos(img, "/ov2");
    let blk = (at / 4096) as u32;
    b[p + 0x10..p + 0x14].copy_from_slice(&blk.to_le_bytes());
    ("/ov2".into(), Some(nid(img, "/ov2")), "BlockOverlap")
}
fn shared_blocks(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // ov2's blocks moved one block into ov1's (12 KiB): mkfs.erofs's block dedupe
    // shares uncompressed blocks so (a file's blocks a run inside another's). Its
    // bytes change, but no structure is wrong: not a problem.
    let s1 = stat(img, "/ov1")["extents"][0]["physical"]
        .as_u64()
        .expect("ov1 extent");
    let p = inode_pos(img, "/ov2");
    let blk = (s1 / 4096 + 1) as u32;
    b[p + 0x10..p + 0x14].copy_from_slice(&blk.to_le_bytes());
    (String::new(), None, "")
}
fn meta_overlap(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    // comp's data moved onto the inode table: its bytes read fine, only the overlap
    // with the inode records tells.
    let i = json(&ok(&[&"inspect", &"--json", &img]));
    let meta = i["meta_blkaddr"].as_u64().expect("meta_blkaddr") as u32;
    let p = inode_pos(img, "/comp");
    b[p + 0x10..p + 0x14].copy_from_slice(&meta.to_le_bytes());
    ("/comp".into(), Some(nid(img, "/comp")), "MetaOverlap")
}
fn checksum(_: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    b[1028] ^= 0xFF;
    ("(superblock)".into(), None, "BadChecksum")
}
fn pcluster(img: &Path, b: &mut [u8]) -> (String, Option<u64>, &'static str) {
    let st = stat(img, "/comp");
    let e = &st["extents"][0];
    assert!(
        e["kind"].as_str().expect("kind").starts_with("lz4"),
        "comp is compressed: {st}"
    );
    let at = e["physical"].as_u64().expect("physical") as usize;
    let len = e["stored"].as_u64().expect("stored") as usize;
    b[at..at + len].fill(0xFF);
    ("/comp".into(), Some(nid(img, "/comp")), "")
}

/// `FEROFS_CHECK_KEEP=DIR` keeps a copy of each corrupted image there (to compare with
/// fsck.erofs by hand).
fn keep(img: &Path) {
    if let Some(dir) = std::env::var_os("FEROFS_CHECK_KEEP") {
        let dir = PathBuf::from(dir);
        fs::create_dir_all(&dir).expect("mkdir keep");
        fs::copy(img, dir.join(img.file_name().expect("name"))).expect("keep image");
    }
}

/// Run check on `img`; returns (exit code, problems).
fn check(img: &Path) -> (i32, Vec<Value>) {
    let out = run(&[&"check", &"--json", &img]);
    let code = out.status.code().expect("exit code");
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let probs = v["problems"].as_array().expect("problems").clone();
    assert_eq!(
        v["summary"]["problems"].as_u64(),
        Some(probs.len() as u64),
        "summary count"
    );
    (code, probs)
}

fn assert_reported(probs: &[Value], want: &(String, Option<u64>, &'static str)) {
    let (path, nid, kind) = want;
    let hit = probs.iter().any(|p| {
        p["paths"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(path)))
            && nid.is_none_or(|n| p["nid"].as_u64() == Some(n))
            && (kind.is_empty() || p["kind"].as_str() == Some(kind))
    });
    assert!(hit, "{want:?} not reported; got {probs:#?}");
}

const PLAIN: [(&str, Corruption); 8] = [
    ("bad_dir_block", bad_dir_block),
    ("swap_names", swap_names),
    ("nid_past_end", nid_past_end),
    ("dotdot", dotdot),
    ("nlink", nlink),
    ("xattr_entry", xattr_entry),
    ("meta_overlap", meta_overlap),
    ("checksum", checksum),
];

#[test]
fn each_corruption_is_reported_with_path_and_nid() {
    let fx = fixture();
    let (code, probs) = check(&fx.plain);
    assert_eq!((code, probs.len()), (0, 0), "clean image: {probs:#?}");
    let clean = fs::read(&fx.plain).expect("read image");
    let mut cases: Vec<(&str, Corruption, &PathBuf)> =
        PLAIN.iter().map(|(n, c)| (*n, *c, &fx.plain)).collect();
    cases.push(("pcluster", pcluster, &fx.lz4));
    cases.push(("overlap", overlap, &fx.lz4));
    for (name, corrupt, base) in cases {
        let mut b = fs::read(base).expect("read image");
        let want = corrupt(base, &mut b);
        if name != "checksum" {
            fix_checksum(&mut b);
        }
        let img = fx.dir.join(format!("{name}.img"));
        fs::write(&img, &b).expect("write image");
        keep(&img);
        let (code, probs) = check(&img);
        assert_eq!(code, 1, "{name}: exit status; {probs:#?}");
        assert_reported(&probs, &want);
        // Bad and expected values, exactly, where check knows both.
        let exact = |kind: &str, value: u64, expected: u64| {
            assert!(
                probs.iter().any(|p| p["kind"] == kind
                    && p["value"].as_u64() == Some(value)
                    && p["expected"].as_u64() == Some(expected)),
                "{name}: no {kind} with value {value}, expected {expected}: {probs:#?}"
            );
        };
        match name {
            "nlink" => exact("BadNlink", 5, 2),
            "dotdot" => exact("BadDotDot", nid(base, "/beta"), nid(base, "/alpha")),
            _ => {}
        }
        if name == "bad_dir_block" {
            // Reported as making its entries unreachable, and the walk went on.
            let p = probs
                .iter()
                .find(|p| p["kind"] == "BadNameoff")
                .expect("BadNameoff");
            assert!(
                p["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("unreachable")),
                "{p}"
            );
        }
        // The text form names the path too.
        let text = String::from_utf8_lossy(&run(&[&"check", &img]).stdout).into_owned();
        eprintln!("{name}:\n{text}");
        assert!(text.contains(&want.0), "{name}: text output: {text}");
        assert!(text.contains("CORRUPT: "), "{name}: summary line: {text}");
    }
    // Uncompressed blocks shared in part between two files (block dedupe): clean.
    let mut b = clean.clone();
    shared_blocks(&fx.plain, &mut b);
    fix_checksum(&mut b);
    let img = fx.dir.join("shared_blocks.img");
    fs::write(&img, &b).expect("write image");
    let (code, probs) = check(&img);
    assert_eq!((code, probs.len()), (0, 0), "shared blocks: {probs:#?}");
    // All plain corruptions in one image: every one is reported.
    let mut b = clean;
    let wants: Vec<_> = PLAIN.iter().map(|(_, c)| c(&fx.plain, &mut b)).collect();
    let img = fx.dir.join("all.img");
    fs::write(&img, &b).expect("write image");
    keep(&img);
    let (code, probs) = check(&img);
    assert_eq!(code, 1);
    for w in &wants {
        assert_reported(&probs, w);
    }
}

/// Problems of `check --json ARGS IMG`, with the exit status.
fn check_with(img: &Path, args: &[&str]) -> (i32, Vec<Value>, Value) {
    let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"check", &"--json"];
    for x in args {
        a.push(x);
    }
    a.push(&img);
    let out = run(&a);
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let probs = v["problems"].as_array().expect("problems").clone();
    (
        out.status.code().expect("exit code"),
        probs,
        v["summary"].clone(),
    )
}

/// Paths of all problems.
fn problem_paths(probs: &[Value]) -> Vec<String> {
    probs
        .iter()
        .flat_map(|p| p["paths"].as_array().cloned().unwrap_or_default())
        .filter_map(|x| x.as_str().map(String::from))
        .collect()
}

#[test]
fn path_and_nid_check_one_subtree() {
    let fx = fixture();
    let mut b = fs::read(&fx.plain).expect("read image");
    let wants = [
        swap_names(&fx.plain, &mut b),
        nid_past_end(&fx.plain, &mut b),
        dotdot(&fx.plain, &mut b),
        bad_dir_block(&fx.plain, &mut b),
        nlink(&fx.plain, &mut b),
    ];
    fix_checksum(&mut b);
    let img = fx.dir.join("scoped.img");
    fs::write(&img, &b).expect("write image");
    let (code, all, _) = check_with(&img, &[]);
    assert_eq!(code, 1);
    for w in &wants {
        assert_reported(&all, w);
    }
    // /beta: its lost entry only.
    let (code, probs, sum) = check_with(&img, &["--path", "/beta"]);
    assert_eq!(code, 1, "{probs:#?}");
    assert_reported(&probs, &wants[1]);
    assert!(
        problem_paths(&probs).iter().all(|p| p.starts_with("/beta")),
        "{probs:#?}"
    );
    assert_eq!(sum["directories"].as_u64(), Some(1), "{sum}");
    // /alpha: the unsorted names and the bad ".." of its subdirectory, nothing else.
    let (code, probs, _) = check_with(&img, &["--path", "alpha/"]);
    assert_eq!(code, 1);
    assert_reported(&probs, &wants[0]);
    assert_reported(&probs, &wants[2]);
    assert_eq!(probs.len(), 2, "{probs:#?}");
    // /alpha/sub by path: its parent is known, so its ".." is checked, exactly.
    let (code, probs, _) = check_with(&img, &["--path", "/alpha/sub"]);
    assert_eq!(code, 1);
    assert_eq!(probs.len(), 1, "{probs:#?}");
    assert_eq!(probs[0]["kind"], "BadDotDot");
    assert_eq!(probs[0]["value"].as_u64(), Some(nid(&fx.plain, "/beta")));
    assert_eq!(
        probs[0]["expected"].as_u64(),
        Some(nid(&fx.plain, "/alpha"))
    );
    // By nid the parent is what ".." says (as fsck.erofs takes it): clean.
    let sub = nid(&fx.plain, "/alpha/sub").to_string();
    let (code, probs, sum) = check_with(&img, &["--nid", &sub]);
    assert_eq!((code, probs.len()), (0, 0), "{probs:#?}");
    assert_eq!(sum["entries"].as_u64(), Some(2), "{sum}");
    // A hardlink seen by one of its names: fewer names than links is no problem
    // in a subtree; its data is read.
    let (code, probs, sum) = check_with(&img, &["--path", "/gamma"]);
    assert_eq!((code, probs.len()), (0, 0), "{probs:#?}");
    assert_eq!(sum["bytes_read"].as_u64(), Some(7), "{sum}");
    // One file; a clean subtree beside the corrupt ones.
    let (code, probs, sum) = check_with(&img, &["--path", "/beta/p2"]);
    assert_eq!((code, probs.len()), (0, 0), "{probs:#?}");
    assert_eq!(
        (sum["inodes"].as_u64(), sum["bytes_read"].as_u64()),
        (Some(1), Some(8))
    );
    let xf = nid(&fx.plain, "/xf").to_string();
    let (code, probs, _) = check_with(&img, &["--nid", &xf]);
    assert_eq!((code, probs.len()), (0, 0), "{probs:#?}");
    // The root by nid is the whole image, as in fsck.erofs.
    let root = nid(&fx.plain, "/").to_string();
    let (_, probs, _) = check_with(&img, &["--nid", &root]);
    assert_eq!(probs.len(), all.len());
    // Unknown path or nid: exit 2, naming it.
    let out = run(&[&"check", &"--path", &"/alpha/nope", &img]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/alpha/nope"));
    let out = run(&[&"check", &"--nid", &"99999999", &img]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("99999999"));
    // The drop-in: fsck.erofs --path / --nid without --extract.
    let out = run(&[&"fsck", &"--path=/beta", &img]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&[&"fsck", &format!("--nid={sub}"), &img]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn unopenable_image_exits_2() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let img = tmp.path().join("junk.img");
    fs::write(&img, vec![0u8; 8192]).expect("write");
    let out = run(&[&"check", &img]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn clean_images_report_nothing() {
    let fx = fixture();
    let src = fx.dir.join("src");
    let mut imgs = vec![fx.plain.clone(), fx.lz4.clone()];
    for (i, opts) in [
        &["-z", "lz4hc", "-C", "65536", "-E", "smallest"][..],
        &["-z", "zstd", "-E", "all-fragments"],
        &["-z", "none", "-b", "512"],
        &["-z", "lzma", "-m"],
    ]
    .iter()
    .enumerate()
    {
        let img = fx.dir.join(format!("opt{i}.img"));
        build(&src, &img, opts);
        imgs.push(img);
    }
    for g in fs::read_dir(ferofs_testkit::shared_dir().join("testdata/erofs-utils-1.9.3"))
        .expect("golden dir")
    {
        let name = g.expect("entry").file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".zst") {
            imgs.push(ferofs_testkit::golden(&format!(
                "erofs-utils-1.9.3/{stem}.zst"
            )));
        }
    }
    for img in imgs {
        let (code, probs) = check(&img);
        assert_eq!((code, probs.len()), (0, 0), "{}: {probs:#?}", img.display());
    }
}

/// A directory `dir` holding one sparse file `name` of `size` bytes: holes, then
/// "end\n" as its last 4 bytes.
fn sparse_tree(dir: &Path, name: &str, size: u64) {
    use std::os::unix::fs::FileExt;
    fs::create_dir(dir).expect("mkdir");
    let f = fs::File::create(dir.join(name)).expect("create");
    f.set_len(size).expect("set_len (sparse)");
    f.write_all_at(b"end\n", size - 4).expect("write");
}

/// A file of a terabyte of holes and 4 bytes, built with its fs-verity digest:
/// `check` verifies the holes by their map and reads only the data (it once filled a
/// buffer with zeros for every byte of a hole: a hostile 25 KB image claiming a 124 TB
/// sparse file kept it busy for hours); `diff` of the image with itself or its source
/// compares the data only.
#[test]
fn holes_are_checked_by_their_map_not_read() {
    let d = ferofs_testkit::scratch("check-holes");
    let src = d.path().join("src");
    let size: u64 = 1 << 40;
    sparse_tree(&src, "disk.img", size);
    let img = d.path().join("holes.erofs");
    // With an fs-verity digest: its Merkle tree takes the holes as runs of zero blocks
    // (it once read the terabyte of zeros from the source: hours).
    build(&src, &img, &["-z", "none", "--fsverity-digests"]);
    // The holes by the reader's extent list (another walk of the same map).
    let stat = ok(&[&"stat", &img, &"/disk.img"]);
    assert!(
        stat.contains("Xattr: trusted.overlay.metacopy = "),
        "{stat}"
    );
    let holes: u64 = stat
        .lines()
        .filter_map(|l| l.strip_prefix("Extent: ")?.strip_suffix(" hole"))
        .map(|r| {
            let (a, b) = r.split_once("..").expect("a..b");
            b.parse::<u64>().expect("end") - a.parse::<u64>().expect("start")
        })
        .sum();
    assert!(holes > size - (64 << 20), "{stat}");
    let (code, probs, sum) = check_with(&img, &[]);
    assert_eq!((code, probs.len()), (0, 0), "{probs:#?}");
    assert_eq!(sum["bytes_read"].as_u64(), Some(size), "{sum}");
    assert_eq!(sum["hole_bytes"].as_u64(), Some(holes), "{sum}");
    let text = ok(&[&"check", &img]);
    assert!(
        text.contains(&format!("{size} bytes of data read ({holes} in holes)")),
        "{text}"
    );
    let out = run(&[&"diff", &img, &img]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Image against its source: the directory's holes are found by SEEK_DATA (they
    // were once read, a terabyte of zeros); a changed data byte is still found.
    let out = run(&[&"diff", &"--ignore-xattrs", &img, &src]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(src.join("disk.img"))
            .expect("open");
        f.write_all_at(b"E", size - 4).expect("write");
    }
    let out = run(&[&"diff", &"--ignore-xattrs", &img, &src]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/disk.img"), "{text}");

    // A content fingerprint over holes: their zeros are hashed (without reading
    // them), and a changed data byte is still found.
    let src = d.path().join("fp");
    let size: u64 = 256 << 20;
    sparse_tree(&src, "one.img", size);
    let img = d.path().join("fp.erofs");
    build(&src, &img, &["-z", "none", "--xattr-inode-digest"]);
    let (code, probs, sum) = check_with(&img, &[]);
    assert_eq!((code, probs.len()), (0, 0), "{probs:#?}");
    assert_eq!(sum["bytes_read"].as_u64(), Some(size), "{sum}");
    assert!(
        sum["hole_bytes"].as_u64() > Some(size - (64 << 20)),
        "{sum}"
    );
    assert_eq!(sum["fingerprints_unverified"].as_u64(), Some(0), "{sum}");
    let mut b = fs::read(&img).expect("read");
    let at = b.windows(4).position(|w| w == b"end\n").expect("the data");
    b[at + 2] = b'D';
    fs::write(&img, &b).expect("write");
    let (code, probs, _) = check_with(&img, &[]);
    assert_eq!((code, probs.len()), (1, 1), "{probs:#?}");
    assert_eq!(probs[0]["kind"], "Fingerprint", "{probs:#?}");
}

/// A hostile flat file: no blocks (a hole) for its first terabyte, then an inline tail
/// that crosses its block. The mapping error after the hole is reported once, without
/// reading the hole first (the reader's hole_end used to fail as a whole on it, and
/// check then read the terabyte of zeros a megabyte at a time: hours); `extract` fails
/// on the file just as fast.
#[test]
fn a_mapping_error_after_a_hole_is_found_without_reading_the_hole() {
    let d = ferofs_testkit::scratch("check-hole-then-error");
    let src = d.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    fs::write(src.join("f"), &data).expect("write");
    let img = d.path().join("i.erofs");
    // (No superblock checksum: the inode may share its block.)
    build(
        &src,
        &img,
        &["-z", "none", "-E", "force-inode-extended,nosbcrc"],
    );
    assert_eq!(stat(&img, "/f")["layout"], "flat-inline");
    let p = inode_pos(&img, "/f");
    let f = nid(&img, "/f");
    let mut b = fs::read(&img).expect("read");
    // i_size: 1 TiB of blocks and a 4,095-byte tail; i_u: no start block.
    let size: u64 = (1 << 40) + 4095;
    b[p + 8..p + 16].copy_from_slice(&size.to_le_bytes());
    b[p + 16..p + 20].copy_from_slice(&u32::MAX.to_le_bytes());
    fs::write(&img, &b).expect("write");
    let (code, probs, sum) = check_with(&img, &[]);
    assert_eq!(code, 1);
    assert!(!probs.is_empty(), "{probs:#?}");
    for p in &probs {
        assert_eq!(p["kind"], "BadInlineData", "{probs:#?}");
        assert_eq!(p["nid"].as_u64(), Some(f), "{probs:#?}");
    }
    assert_eq!(sum["hole_bytes"].as_u64(), Some(1 << 40), "{sum}");
    let out = d.path().join("x");
    let r = run(&[&"extract", &img, &out]);
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("inline data crosses a block boundary"),
        "{err}"
    );
}

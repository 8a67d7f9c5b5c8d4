//! Fragments and dedupe (`-E fragments`, `all-fragments`, `dedupe`, the `smallest`
//! preset): every algorithm at 4 KiB and 1 MiB pclusters, with and without
//! ztailpacking, on the make-tree tree and on seeded trees full of small and duplicate
//! files — the kernel mount equals the tree, `ferofs extract` too, fsck.erofs passes
//! where its version knows the features — plus byte-identical images for any thread
//! count and the effects the features exist for.

mod common;
use common::*;
use ferofs_testkit::*;
use std::path::Path;

/// fsck.erofs learned fragments and dedupe in 1.6, DEFLATE in 1.7 and Zstandard in
/// 1.8; Debian 12 ships 1.5 (set FEROFS_FSCK_EROFS to a newer one).
fn fsck_knows(alg: &str) -> bool {
    let v = fsck_erofs_version().unwrap_or((0, 0));
    v >= (1, 6)
        && match alg {
            "deflate" => v >= (1, 7),
            "zstd" => v >= (1, 8),
            _ => true,
        }
}

fn inspect(img: &Path) -> serde_json::Value {
    json(&ok(&[&"inspect", &"--json", &img]))
}

fn incompat(img: &Path) -> Vec<String> {
    inspect(img)["feature_incompat"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Build, then: the kernel mount and `ferofs extract` equal the tree, `ferofs check`
/// passes, fsck.erofs passes when it knows the features.
fn roundtrip(src: &Path, img: &Path, scratch: &Path, alg: &str, args: &[&str]) {
    build(src, img, args);
    {
        let m = Mount::erofs(img);
        assert_same_tree(src, m.path());
    }
    ok(&[&"check", &img]);
    let x = scratch.join("x");
    ok(&[&"extract", &img, &x]);
    assert_same_tree(src, &x);
    std::fs::remove_dir_all(&x).expect("rm");
    let metabox_ok = !args.contains(&"-m") || fsck_erofs_version().unwrap_or((0, 0)) >= (1, 9);
    if fsck_knows(alg) && metabox_ok {
        fsck_erofs(img).unwrap_or_else(|e| panic!("{args:?}: fsck.erofs failed:\n{e}"));
    } else {
        eprintln!(
            "note: fsck.erofs {:?} does not know {alg} with fragments; the kernel mount is the check",
            fsck_erofs_version()
        );
    }
}

/// `-E` values; "smallest+m" is everything together: the preset and the metabox.
const FEATURES: [&str; 5] = [
    "fragments",
    "all-fragments",
    "dedupe",
    "smallest",
    "smallest+m",
];

fn matrix(alg: &str) {
    if !kernel_available(alg) {
        return;
    }
    let (fs, tree) = make_tree();
    for (i, c) in ["4096", "1048576"].into_iter().enumerate() {
        for (k, feat) in FEATURES.into_iter().enumerate() {
            // Half the runs with ztailpacking, alternating so each feature meets both.
            let tail = (i + k) % 2 == 1;
            let (feat, metabox) = match feat.strip_suffix("+m") {
                Some(f) => (f, true),
                None => (feat, false),
            };
            let e = if tail {
                format!("{feat},ztailpacking")
            } else {
                feat.to_string()
            };
            let img = fs.path().join(format!("{alg}-{c}-{feat}.erofs"));
            let mut args = vec!["-z", alg, "-C", c, "-E", &e];
            if metabox {
                args.push("-m");
            }
            roundtrip(&tree, &img, fs.path(), alg, &args);
            if feat != "dedupe" {
                assert!(
                    incompat(&img).iter().any(|f| f.contains("fragments")),
                    "{alg} {c} {e}: no fragments feature: {}",
                    inspect(&img)
                );
            }
            std::fs::remove_file(&img).expect("rm");
        }
    }
}

#[test]
fn lz4_packed_matrix() {
    matrix("lz4");
}
#[test]
fn lz4hc_packed_matrix() {
    matrix("lz4hc");
}
#[test]
fn lzma_packed_matrix() {
    matrix("lzma");
}
#[test]
fn deflate_packed_matrix() {
    matrix("deflate");
}
#[test]
fn zstd_packed_matrix() {
    matrix("zstd");
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn text(&mut self, n: usize) -> Vec<u8> {
        const W: [&str; 8] = [
            "erofs ", "tail ", "packed ", "inode\n", "of ", "the ", "a ", "x ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(W[self.below(8) as usize].as_bytes());
        }
        v.truncate(n);
        v
    }
    fn random(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A tree of many small files (text and random, 0..3 blocks), many exact copies of a
/// few of them (in other directories, some with xattrs or other owners), ten small
/// files under one name in directories of their own (a name group), files longer
/// than a big pcluster that share a prefix, a file of zeros and a sparse file.
fn gen(root: &Path, seed: u64) {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut originals: Vec<Vec<u8>> = Vec::new();
    for d in 0..6 {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir(&dir).expect("mkdir");
        for f in 0..40 {
            let size = match r.below(6) {
                0 => r.below(64),
                1 => r.below(4096),
                2 => 4096,
                3 => 4096 + r.below(8192),
                _ => r.below(1500),
            } as usize;
            let data = if r.below(4) == 0 {
                r.random(size)
            } else {
                r.text(size)
            };
            let ext = ["c", "h", "txt", "bin"][r.below(4) as usize];
            let p = dir.join(format!("f{f}.{ext}"));
            let copy = !originals.is_empty() && r.below(3) == 0;
            let data = if copy {
                originals[r.below(originals.len() as u64) as usize].clone()
            } else {
                data
            };
            std::fs::write(&p, &data).expect("write");
            if !copy && r.below(4) == 0 {
                originals.push(data);
            }
            if r.below(8) == 0 {
                let n = r.below(80) as usize;
                xattr::set(&p, "user.k", &r.random(n)).expect("xattr");
            }
            if r.below(8) == 0 {
                std::os::unix::fs::chown(&p, Some(1000), Some(1000)).expect("chown");
            }
        }
    }
    // Ten small files under one name: a group behind the other fragments.
    for k in 0..10 {
        let dir = root.join(format!("n{k}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let mut notice = b"NOTICE: ".to_vec();
        let n = r.below(3000) as usize;
        notice.extend(r.text(n));
        if k % 4 == 3 {
            let n = r.below(2000) as usize;
            notice.extend(r.random(n));
        }
        std::fs::write(dir.join("NOTICE"), &notice).expect("write");
        // A neighbour of its own: in inode order it would follow its NOTICE.
        let n = 1 + r.below(900) as usize;
        std::fs::write(dir.join(format!("x{k}.txt")), r.text(n)).expect("write");
    }
    let big = r.text(3 << 20);
    std::fs::write(root.join("big1.txt"), &big).expect("write");
    let mut big2 = big[..2 << 20].to_vec();
    big2.extend(r.random(300_000));
    std::fs::write(root.join("big2.txt"), &big2).expect("write");
    std::fs::write(root.join("big3.txt"), &big).expect("write");
    std::fs::write(root.join("zeros"), vec![0u8; 5 << 20]).expect("write");
    let sparse = std::fs::File::create(root.join("sparse")).expect("create");
    sparse.set_len(9 << 20).expect("truncate");
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(b"island", 4 << 20).expect("write");
}

#[test]
fn packed_random_trees_roundtrip_through_the_kernel() {
    if !kernel_available("packed_random_trees_roundtrip_through_the_kernel") {
        return;
    }
    let fs = Tmpfs::new("1G");
    let mut seed = 300;
    for alg in ["lz4", "lz4hc", "lzma", "deflate", "zstd"] {
        for (c, feat) in [("4096", "smallest"), ("1048576", "all-fragments,dedupe")] {
            seed += 1;
            let src = fs.path().join(format!("src{seed}"));
            std::fs::create_dir(&src).expect("mkdir");
            gen(&src, seed);
            let img = fs.path().join(format!("t{seed}.erofs"));
            roundtrip(
                &src,
                &img,
                fs.path(),
                alg,
                &["-z", alg, "-C", c, "-E", feat],
            );
            std::fs::remove_dir_all(&src).expect("rm");
            std::fs::remove_file(&img).expect("rm");
        }
    }
}

/// `ferofs build -q ARGS SRC IMG` run with at most `limit` open files (`ulimit -n`);
/// asserts that it succeeds (`what` names the case) and returns the image's bytes.
fn build_with_open_files(limit: u32, src: &Path, img: &Path, args: &[&str], what: &str) -> Vec<u8> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_ferofs"))
        .args(["build", "-q"])
        .args(args)
        .arg(src)
        .arg(img)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "{what} with {limit} open files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(img).expect("read")
}

#[test]
fn packed_images_are_identical_for_any_thread_count() {
    let d = scratch("packed-threads");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    gen(&src, 7);
    for e in ["smallest", "all-fragments=65536,dedupe,ztailpacking"] {
        let mut first: Option<Vec<u8>> = None;
        for j in ["1", "2", "3", "8"] {
            let img = d.path().join(format!("j{j}.erofs"));
            build(
                &src,
                &img,
                &["-z", "lz4hc", "-C", "65536", "-E", e, "-j", j],
            );
            // The NOTICE group sits back to back in the packed inode, in inode order.
            let notices: Vec<(u64, u64)> = (0..10)
                .map(|k| {
                    let (before, off, len) = fragment_layout(&img, &format!("/n{k}/NOTICE"));
                    assert!(before.is_empty(), "-E {e}: n{k}: {before:?}");
                    (off, len)
                })
                .collect();
            for w in notices.windows(2) {
                assert_eq!(w[1].0, w[0].0 + w[0].1, "-E {e}: {notices:?}");
            }
            let bytes = std::fs::read(&img).expect("read");
            match &first {
                None => first = Some(bytes),
                Some(f) => assert!(f == &bytes, "-E {e} -j {j} differs from -j 1"),
            }
        }
        // With 300 open files allowed, the spool keeps a handful of the fragments' files
        // open for the packed inode's second read and opens the rest again by path
        // (above, it keeps all): the same image.
        let img = d.path().join("few-files.erofs");
        let bytes = build_with_open_files(
            300,
            &src,
            &img,
            &["-z", "lz4hc", "-C", "65536", "-E", e, "-j", "2"],
            &format!("-E {e}"),
        );
        assert!(
            first.as_deref() == Some(&bytes[..]),
            "-E {e} with 300 open files differs"
        );
    }
}

/// A worker reads a batch of small files (up to a MiB of input) before it hands them to
/// the spool; each handle it keeps counts against the limit on open files from the
/// moment it is kept. 1,500 files of 40 bytes make one batch: with 300 open files
/// allowed, a build that kept every batch's handles until the batch was handed over
/// failed with "Too many open files" (at -j 8 on the linux tree, with 20,000 allowed).
#[test]
fn a_batch_of_tiny_files_stays_under_a_low_limit_on_open_files() {
    let d = scratch("packed-nofile");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let mut r = Rng(5);
    for i in 0..1500 {
        let mut t = format!("tiny {i}: ").into_bytes();
        t.extend(r.text(40 - t.len()));
        std::fs::write(src.join(format!("t{i:04}")), &t).expect("write");
    }
    let free = d.path().join("free.erofs");
    build(&src, &free, &["-z", "lz4", "-E", "smallest", "-j", "2"]);
    let want = std::fs::read(&free).expect("read");
    for j in ["2", "8"] {
        let img = d.path().join(format!("low-j{j}.erofs"));
        let bytes = build_with_open_files(
            300,
            &src,
            &img,
            &["-z", "lz4", "-E", "smallest", "-j", j],
            &format!("-j {j}"),
        );
        assert!(bytes == want, "-j {j} with 300 open files differs");
    }
}

fn image_blocks(img: &Path) -> u64 {
    std::fs::metadata(img).expect("stat").len() / 4096
}

#[test]
fn a_thousand_small_files_take_a_few_blocks_with_fragments() {
    let d = scratch("packed-small");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let mut r = Rng(99);
    for i in 0..1000 {
        let mut t = format!("file {i}: ").into_bytes();
        t.extend(r.text(100 - t.len()));
        std::fs::write(src.join(format!("f{i:04}.txt")), &t).expect("write");
    }
    let plain = d.path().join("plain.erofs");
    build(
        &src,
        &plain,
        &["-z", "lz4hc", "-T", "0", "-E", "noinline_data"],
    );
    let inline = d.path().join("inline.erofs");
    build(&src, &inline, &["-z", "lz4hc", "-T", "0"]);
    let frag = d.path().join("frag.erofs");
    build(&src, &frag, &["-z", "lz4hc", "-T", "0", "-E", "fragments"]);
    // Without fragments or inline data each file takes a block.
    assert!(image_blocks(&plain) > 1000, "{}", image_blocks(&plain));
    // With fragments: 1,000 compact inodes with their map headers (48 bytes each, 12
    // blocks), 6 directory blocks, and the packed inode's compressed data (the 100 KB
    // of words compress about 3:1 in 4 KiB pclusters): 29 blocks. Inline data alone
    // takes 132 bytes an inode.
    assert!(image_blocks(&frag) <= 30, "{} blocks", image_blocks(&frag));
    assert!(
        image_blocks(&frag) < image_blocks(&inline),
        "{} blocks with fragments, {} with inline data",
        image_blocks(&frag),
        image_blocks(&inline)
    );
    let info = inspect(&frag);
    assert!(info.to_string().contains("fragments"), "{info}");
}

#[test]
fn fifty_copies_of_a_file_cost_about_one_with_dedupe() {
    let d = scratch("packed-copies");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let data = Rng(5).random(1 << 20);
    for i in 0..50 {
        std::fs::write(src.join(format!("copy{i}")), &data).expect("write");
    }
    for z in ["lz4hc", "none"] {
        let with = d.path().join("with.erofs");
        build(&src, &with, &["-z", z, "-E", "dedupe"]);
        let without = d.path().join("without.erofs");
        build(&src, &without, &["-z", z]);
        let (w, wo) = (image_blocks(&with), image_blocks(&without));
        assert!(wo >= 50 * 256, "-z {z}: {wo} blocks without dedupe");
        // One copy (256 blocks) and a little metadata.
        assert!((256..=260).contains(&w), "-z {z}: {w} blocks with dedupe");
        let m = if kernel_available("fifty_copies") {
            Some(Mount::erofs(&with))
        } else {
            None
        };
        if let Some(m) = &m {
            assert_same_tree(&src, m.path());
        }
    }
}

#[test]
fn zeros_with_dedupe_build_about_as_fast_as_without() {
    let d = scratch("packed-zeros");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let zeros = vec![0u8; 100 << 20];
    std::fs::write(src.join("zeros"), &zeros).expect("write");
    std::fs::write(src.join("zeros.copy"), &zeros).expect("write");
    let time = |e: &[&str], name: &str| {
        let img = d.path().join(name);
        let t = std::time::Instant::now();
        let mut args = vec!["-z", "lz4hc", "-C", "131072"];
        args.extend(e);
        build(&src, &img, &args);
        (t.elapsed().as_secs_f64(), image_blocks(&img))
    };
    let (t0, b0) = time(&[], "plain.erofs");
    let (t1, b1) = time(&["-E", "dedupe"], "dedupe.erofs");
    assert!(b1 < b0, "dedupe saved nothing: {b1} vs {b0} blocks");
    // Not a benchmark: a guard against dedupe turning quadratic on runs of zeros.
    assert!(t1 <= 2.0 * t0 + 1.0, "dedupe {t1:.2}s vs {t0:.2}s without");
}

/// Byte range `[first, end)` of the blocks holding a file's data (inline parts aside).
fn data_range(img: &Path, path: &str) -> (u64, u64) {
    stat_data_range(&json(&ok(&[&"stat", &"--json", &img, &path])))
}

/// [`data_range`] of a file's `stat --json`.
fn stat_data_range(st: &serde_json::Value) -> (u64, u64) {
    let mut r = (u64::MAX, 0);
    for e in st["extents"].as_array().expect("extents") {
        if let Some(p) = e["physical"].as_u64() {
            let n = e["stored"].as_u64().expect("stored");
            r = (r.0.min(p), r.1.max(p + n.div_ceil(4096) * 4096));
        }
    }
    r
}

#[test]
fn sort_places_listed_files_first_contiguous_and_in_order() {
    let d = scratch("sort");
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    let mut r = Rng(11);
    for i in 0..6 {
        std::fs::write(src.join(format!("r{i}")), r.random(20_000 + 3000 * i)).expect("w");
        std::fs::write(src.join(format!("sub/t{i}")), r.text(30_000 + 5000 * i)).expect("w");
    }
    let order = ["sub/t4", "r5", "/r0", "./sub/t1", "r3"];
    let list = d.path().join("order.txt");
    let text = format!("{}\nnope/missing\nsub\n\n", order.join("\n"));
    std::fs::write(&list, text).expect("write");
    let list = list.to_str().expect("utf-8");
    for args in [
        vec!["-z", "none"],
        vec!["-z", "lz4hc", "-C", "16384"],
        vec!["-z", "zstd", "-C", "65536", "-E", "smallest"],
    ] {
        let img = d.path().join("sorted.erofs");
        let mut a: Vec<&str> = args.clone();
        a.extend(["--sort", list]);
        let mut c = ferofs();
        c.arg("build").args(&a).arg(&src).arg(&img);
        let out = c.output().expect("run");
        assert!(out.status.success(), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("warning: --sort: nope/missing is not in the source"),
            "{err}"
        );
        assert!(
            err.contains("warning: --sort: sub is not a regular file"),
            "{err}"
        );
        let ranges: Vec<(u64, u64)> = order
            .iter()
            .map(|p| {
                data_range(
                    &img,
                    &format!("/{}", p.trim_start_matches("./").trim_start_matches('/')),
                )
            })
            .collect();
        // First in the data region (block 1: block 0 holds the superblock), then each
        // listed file right behind the one before.
        assert_eq!(ranges[0].0, 4096, "{args:?}: {ranges:?}");
        for w in ranges.windows(2) {
            assert_eq!(
                w[0].1, w[1].0,
                "{args:?}: not contiguous/in order: {ranges:?}"
            );
        }
        // Every other file comes later.
        let end = ranges[ranges.len() - 1].1;
        for p in ["r1", "r2", "r4", "sub/t0", "sub/t2", "sub/t3", "sub/t5"] {
            let (s, _) = data_range(&img, &format!("/{p}"));
            assert!(
                s == u64::MAX || s >= end,
                "{args:?}: {p} at {s} before {end}"
            );
        }
        // The inodes a lookup of the listed paths meets (sub first, on the way to
        // sub/t4), in that order, one behind the other from the first metadata block:
        // a program's start-up reads a few blocks of them, not one per file.
        let way = ["/sub", "/sub/t4", "/r5", "/r0", "/sub/t1", "/r3"];
        let nids: Vec<u64> = way
            .iter()
            .map(|p| {
                json(&ok(&[&"stat", &"--json", &img, p]))["nid"]
                    .as_u64()
                    .expect("nid")
            })
            .collect();
        for w in nids.windows(2) {
            assert!(
                w[0] < w[1],
                "{args:?}: not in lookup order: {way:?} {nids:?}"
            );
        }
        // Each record here is under a block: the six take at most six blocks.
        let blk = |nid: u64| nid * 32 / 4096;
        assert!(
            blk(nids[5]) - blk(nids[0]) < 6,
            "{args:?}: spread over blocks {}..{}",
            blk(nids[0]),
            blk(nids[5])
        );
        if fsck_knows(args[1]) {
            fsck_erofs(&img).unwrap_or_else(|e| panic!("{args:?}: fsck.erofs failed:\n{e}"));
        }
        if kernel_available("sort") {
            let m = Mount::erofs(&img);
            assert_same_tree(&src, m.path());
        }
    }
}

/// The algorithms of a file's compressed extents (`lz4`, `zstd`, ...; plain, inline,
/// fragment and hole extents left out).
fn algorithms(img: &Path, path: &str) -> Vec<String> {
    stat_algorithms(&json(&ok(&[&"stat", &"--json", &img, &path])))
}

/// [`algorithms`] of a file's `stat --json`.
fn stat_algorithms(st: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = st["extents"]
        .as_array()
        .expect("extents")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| ["lz4", "lzma", "deflate", "zstd"].contains(k))
        .map(str::to_string)
        .collect();
    v.dedup();
    v
}

#[test]
fn sort_compress_stores_listed_files_with_the_second_algorithm() {
    let d = scratch("sortz");
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    let mut r = Rng(23);
    for i in 0..5 {
        std::fs::write(src.join(format!("f{i}")), r.text(40_000 + 7000 * i)).expect("w");
        std::fs::write(src.join(format!("sub/g{i}")), r.text(90_000 + 3000 * i)).expect("w");
    }
    // An unlisted copy of a listed file: dedupe must not share data across algorithms
    // in a way the kernel reads wrong.
    std::fs::copy(src.join("sub/g1"), src.join("g1.copy")).expect("copy");
    // And one that starts with a listed file's bytes: with dedupe its first pclusters
    // match the listed file's, which are stored with the other algorithm.
    let mut longer = std::fs::read(src.join("sub/g3")).expect("read");
    longer.extend(r.text(30_000));
    std::fs::write(src.join("g3.longer"), longer).expect("w");
    let listed = ["sub/g3", "f1", "sub/g1"];
    let unlisted = [
        "f0",
        "f2",
        "f3",
        "f4",
        "sub/g0",
        "sub/g2",
        "sub/g4",
        "g1.copy",
        "g3.longer",
    ];
    let list = d.path().join("order.txt");
    std::fs::write(&list, listed.join("\n")).expect("write");
    let list = list.to_str().expect("utf-8");
    for (alg, extra) in [
        ("zstd", vec![]),
        ("lzma", vec!["-E", "dedupe"]),
        ("zstd", vec!["-C", "65536", "-E", "smallest"]),
        ("lz4", vec![]),
    ] {
        let img = d.path().join("sorted.erofs");
        let mut a = vec!["-z", alg, "--sort", list];
        a.extend(&extra);
        // Without --sort-compress, the listed files use -z like the rest.
        build(&src, &img, &a);
        assert_eq!(algorithms(&img, "/f1"), [alg], "{alg} {extra:?}");
        a.extend(["--sort-compress", "lz4hc,level=9"]);
        build(&src, &img, &a);
        for p in listed {
            assert_eq!(
                algorithms(&img, &format!("/{p}")),
                ["lz4"],
                "{alg} {extra:?}: {p}"
            );
        }
        // With dedupe, the copy of a listed file shares its (lz4) data, index and all.
        let dedupe = extra.contains(&"dedupe") || extra.contains(&"smallest");
        for p in unlisted {
            let got = algorithms(&img, &format!("/{p}"));
            let want = if dedupe && p == "g1.copy" { "lz4" } else { alg };
            assert!(
                got.iter().all(|g| g == want),
                "{alg} {extra:?}: {p} uses {got:?}"
            );
        }
        if fsck_knows(alg) {
            fsck_erofs(&img).unwrap_or_else(|e| panic!("{alg} {extra:?}: fsck.erofs:\n{e}"));
        }
        // --extract decodes every file (a plain fsck.erofs run leaves compressed data
        // alone).
        if let Some(fsck) = fsck_erofs_metabox() {
            let out = std::process::Command::new(&fsck)
                .arg("--extract")
                .arg(&img)
                .output()
                .expect("run fsck.erofs");
            assert!(
                out.status.success(),
                "{alg} {extra:?}: fsck.erofs --extract: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if kernel_available("sort-compress") {
            let m = Mount::erofs(&img);
            assert_same_tree(&src, m.path());
        }
    }
    // It needs --sort, and compression.
    let img = d.path().join("bad.erofs");
    for a in [
        vec!["--sort-compress", "lz4"],
        vec!["-z", "none", "--sort", list, "--sort-compress", "lz4"],
        vec!["-z", "zstd", "--sort", list, "--sort-compress", "nope"],
    ] {
        let out = ferofs()
            .arg("build")
            .args(&a)
            .arg(&src)
            .arg(&img)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{a:?} succeeded");
    }
    // An empty list builds, and says that --sort-compress had nothing to do.
    let empty = d.path().join("empty.txt");
    std::fs::write(&empty, "").expect("write");
    let out = ferofs()
        .args(["build", "-q", "-z", "zstd", "--sort"])
        .arg(&empty)
        .args(["--sort-compress", "lz4"])
        .arg(&src)
        .arg(&img)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "warning: --sort-compress: the --sort list is empty, so no file uses it\n"
    );
}

#[test]
fn sort_compress_none_stores_listed_files_uncompressed_first_and_in_order() {
    let d = scratch("sortn");
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    let mut r = Rng(29);
    for i in 0..4 {
        std::fs::write(src.join(format!("f{i}")), r.text(30_000 + 9000 * i)).expect("w");
        std::fs::write(src.join(format!("sub/g{i}")), r.text(70_000 + 5000 * i)).expect("w");
    }
    std::fs::write(src.join("sub/tiny"), r.text(100)).expect("w");
    // An unlisted copy of a listed file (dedupe may share the listed file's blocks).
    std::fs::copy(src.join("sub/g2"), src.join("g2.copy")).expect("copy");
    let listed = ["sub/g2", "f1", "sub/g0", "f3"];
    let unlisted = ["f0", "f2", "sub/g1", "sub/g3"];
    let list = d.path().join("order.txt");
    std::fs::write(&list, [&listed[..], &["sub/tiny"]].concat().join("\n")).expect("write");
    let list = list.to_str().expect("utf-8");
    for (alg, extra) in [
        ("lz4hc", vec![]),
        ("zstd", vec!["-C", "65536", "-E", "smallest"]),
        ("lzma", vec!["-E", "dedupe,ztailpacking"]),
    ] {
        let img = d.path().join("sorted.erofs");
        let mut a = vec!["-z", alg, "--sort", list, "--sort-compress", "none"];
        a.extend(&extra);
        build(&src, &img, &a);
        let mut end = None;
        for p in listed {
            let p = format!("/{p}");
            let st = json(&ok(&[&"stat", &"--json", &img, &p]));
            let layout = st["layout"].as_str().expect("layout");
            assert!(
                layout.starts_with("flat"),
                "{alg} {extra:?}: {p} is {layout}"
            );
            for e in st["extents"].as_array().expect("extents") {
                let k = e["kind"].as_str().expect("kind");
                assert!(
                    k == "plain" || k == "inline",
                    "{alg} {extra:?}: {p} has {k}"
                );
            }
            // Each listed file's blocks follow the previous one's, in list order.
            let (start, stop) = stat_data_range(&st);
            if let Some(end) = end {
                assert_eq!(start, end, "{alg} {extra:?}: {p} not right behind");
            }
            end = Some(stop);
        }
        let tiny = json(&ok(&[&"stat", &"--json", &img, &"/sub/tiny"]));
        assert_eq!(tiny["layout"], "flat-inline", "{alg} {extra:?}");
        // On disk lz4hc is LZ4; with fragments small unlisted files sit in the packed
        // inode (compressed there).
        let kind = alg.strip_suffix("hc").unwrap_or(alg);
        for p in unlisted {
            let p = format!("/{p}");
            let st = json(&ok(&[&"stat", &"--json", &img, &p]));
            let got = stat_algorithms(&st);
            let in_packed = st["extents"]
                .as_array()
                .expect("extents")
                .iter()
                .any(|e| e["kind"].as_str().is_some_and(|k| k.contains("fragment")));
            assert!(
                got == [kind] || (got.is_empty() && in_packed),
                "{alg} {extra:?}: {p} uses {got:?}"
            );
        }
        if fsck_knows(alg) {
            fsck_erofs(&img).unwrap_or_else(|e| panic!("{alg} {extra:?}: fsck.erofs:\n{e}"));
        }
        if kernel_available("sort-compress none") {
            let m = Mount::erofs(&img);
            assert_same_tree(&src, m.path());
        }
    }
}

#[test]
fn files_sharing_a_prefix_share_its_pclusters_with_dedupe() {
    let d = scratch("packed-prefix");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let mut r = Rng(21);
    let a = r.text(3 << 20);
    let mut b = a[..2 << 20].to_vec();
    b.extend(r.random(300_000));
    std::fs::write(src.join("a"), &a).expect("write");
    std::fs::write(src.join("b"), &b).expect("write");
    let phys = |img: &Path, p: &str| -> (String, Vec<u64>) {
        let st = json(&ok(&[&"stat", &"--json", &img, &p]));
        let v = st["extents"]
            .as_array()
            .expect("extents")
            .iter()
            .filter_map(|e| e["physical"].as_u64())
            .collect();
        (st["layout"].as_str().unwrap_or("").to_string(), v)
    };
    for z in ["lz4hc", "zstd", "lzma"] {
        let with = d.path().join("with.erofs");
        build(&src, &with, &["-z", z, "-C", "16384", "-E", "dedupe"]);
        let without = d.path().join("without.erofs");
        build(&src, &without, &["-z", z, "-C", "16384"]);
        let (la, pa) = phys(&with, "/a");
        let (lb, pb) = phys(&with, "/b");
        assert_eq!(la, "compressed-compact", "{z}");
        // b points at a's pclusters for the shared 2 MiB: full indexes.
        assert_eq!(lb, "compressed-full", "{z}");
        let shared = pb.iter().filter(|p| pa.contains(p)).count();
        let (_, pa0) = phys(&without, "/a");
        // All of the prefix's pclusters but the last (where the files part) at least.
        let prefix_pcl = pa0.len() * 2 / 3;
        assert!(
            shared + 2 >= prefix_pcl,
            "{z}: {shared} shared of ~{prefix_pcl}"
        );
        let saved = image_blocks(&without) - image_blocks(&with);
        assert!(
            saved as usize + 8 >= shared * 4,
            "{z}: saved {saved} blocks"
        );
        if kernel_available("prefix") {
            let m = Mount::erofs(&with);
            assert_same_tree(&src, m.path());
        }
        ok(&[&"check", &with]);
    }
}

/// Data repeated at another offset (one file inside another, a shifted copy) is
/// referenced, not stored again: the matched stretches point at the earlier file's
/// pclusters (a partial reference where a match ends inside one), and the image costs
/// about one copy.
#[test]
fn shifted_copies_share_pclusters_with_dedupe() {
    let d = scratch("packed-shifted");
    let src = d.path().join("src");
    let alone = d.path().join("alone");
    std::fs::create_dir(&src).expect("mkdir");
    std::fs::create_dir(&alone).expect("mkdir");
    let mut r = Rng(77);
    let a = r.text(3 << 20);
    // b: 777 random bytes, then most of a from an odd offset, then 300 KB random.
    let mut b = r.random(777);
    b.extend_from_slice(&a[100_001..2_500_000]);
    let tail = r.random(300_000);
    b.extend_from_slice(&tail);
    // c: all of a behind 5,000 bytes of other text.
    let mut c = r.text(5000);
    c.extend_from_slice(&a);
    std::fs::write(src.join("a"), &a).expect("write");
    std::fs::write(src.join("b"), &b).expect("write");
    std::fs::write(src.join("c"), &c).expect("write");
    std::fs::write(alone.join("a"), &a).expect("write");
    let phys = |img: &Path, p: &str| -> Vec<u64> {
        let st = json(&ok(&[&"stat", &"--json", &img, &p]));
        st["extents"]
            .as_array()
            .expect("extents")
            .iter()
            .filter_map(|e| e["physical"].as_u64())
            .collect()
    };
    for (z, pcl) in [
        ("lz4", "16384"),
        ("lz4hc", "4096"),
        ("zstd", "65536"),
        ("lzma", "16384"),
        ("deflate", "16384"),
    ] {
        let with = d.path().join("with.erofs");
        build(&src, &with, &["-z", z, "-C", pcl, "-E", "dedupe"]);
        let only_a = d.path().join("a.erofs");
        build(&alone, &only_a, &["-z", z, "-C", pcl]);
        let pa = phys(&with, "/a");
        for f in ["/b", "/c"] {
            let shared = phys(&with, f).iter().filter(|p| pa.contains(p)).count();
            assert!(
                shared * 2 >= pa.len(),
                "{z} -C {pcl}: {f} shares {shared} of a's {} pclusters",
                pa.len()
            );
        }
        // One copy of a, b's 300 KB of random bytes (74 blocks) and a few pclusters
        // compressed again around each match.
        let extra = 74 + 24 * pcl.parse::<u64>().expect("pcl") / 4096 + 8;
        let (w, one) = (image_blocks(&with), image_blocks(&only_a));
        assert!(
            w <= one + extra,
            "{z} -C {pcl}: {w} blocks with dedupe, {one} for a alone (+{extra} allowed)"
        );
        // The dedupe bit is the fragments bit (0x20).
        assert!(incompat(&with).iter().any(|f| f.contains("dedupe")), "{z}");
        if kernel_available("shifted") {
            let m = Mount::erofs(&with);
            assert_same_tree(&src, m.path());
        }
        ok(&[&"check", &with]);
        if fsck_knows(z) {
            fsck_erofs(&with).unwrap_or_else(|e| panic!("{z}: fsck.erofs failed:\n{e}"));
        }
    }
}

#[test]
fn huge_sparse_copies_dedupe_by_their_data_only() {
    let d = scratch("packed-sparse");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    use std::os::unix::fs::FileExt;
    let sparse = |name: &str, at: u64| {
        let f = std::fs::File::create(src.join(name)).expect("create");
        f.set_len(64 << 30).expect("truncate");
        f.write_all_at(&[7u8; 10_000], at).expect("write");
    };
    sparse("a", 1 << 30);
    sparse("b", 1 << 30);
    // Same size and bytes written, another place: not a copy.
    sparse("c", 2 << 30);
    let img = d.path().join("sparse.erofs");
    let t = std::time::Instant::now();
    build(&src, &img, &["-z", "lz4hc", "-E", "dedupe"]);
    // Reading 192 GiB of holes would take minutes; the data segments take nothing.
    assert!(t.elapsed().as_secs() < 30, "{:?}", t.elapsed());
    let map = |p: &str| json(&ok(&[&"stat", &"--json", &img, &p]))["extents"].clone();
    assert_eq!(map("/a"), map("/b"));
    assert_ne!(map("/a"), map("/c"));
    if kernel_available("sparse") {
        let m = Mount::erofs(&img);
        let f = std::fs::File::open(m.path().join("c")).expect("open");
        let mut buf = [0u8; 4];
        f.read_exact_at(&mut buf, 2 << 30).expect("read");
        assert_eq!(buf, [7; 4]);
        f.read_exact_at(&mut buf, 1 << 30).expect("read");
        assert_eq!(buf, [0; 4]);
        let f = std::fs::File::open(m.path().join("b")).expect("open");
        f.read_exact_at(&mut buf, (1 << 30) + 9996).expect("read");
        assert_eq!(buf, [7; 4]);
    }
}

/// A highly compressible file longer than a few pclusters' input keeps its first
/// pcluster (12 MiB of input, the largest extent the kernel decodes) and sends all
/// the rest to the packed inode: a fragment tail longer than
/// the 12 MiB that bounds any decoded extent. The kernel and fsck.erofs read such a
/// tail (it is never decoded as one extent); ferofs's reader once refused it
/// ("lookback longer than the largest extent"). With dedupe, a second copy shares the
/// first's pclusters and tail.
#[test]
fn a_fragment_tail_longer_than_12_mib_reads_back() {
    let d = scratch("packed-long-tail");
    let src = d.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let mut data = Vec::with_capacity(30 << 20);
    let mut i = 0u64;
    while data.len() < 30 << 20 {
        data.extend_from_slice(
            format!("#define REG_{:08}_MASK 0x{:08x}\n", i % 64, i % 64).as_bytes(),
        );
        i += 1;
    }
    data.truncate((30 << 20) - 4321);
    std::fs::write(src.join("regs.h"), &data).expect("write");
    std::fs::write(src.join("small"), b"a small file\n").expect("write");
    for (name, e) in [("fragments", "fragments"), ("dedupe", "fragments,dedupe")] {
        if name == "dedupe" {
            let mut copy = data.clone();
            copy.extend_from_slice(b"one more line\n");
            std::fs::write(src.join("regs-copy.h"), &copy).expect("write");
        }
        let img = d.path().join(format!("{name}.erofs"));
        build(&src, &img, &["-z", "lz4", "-C", "1048576", "-E", e]);
        let st = json(&ok(&[&"stat", &"--json", &img, &"/regs.h"]));
        let tail = st["extents"]
            .as_array()
            .expect("extents")
            .iter()
            .find(|e| e["kind"].as_str().is_some_and(|k| k.contains("fragment")))
            .unwrap_or_else(|| panic!("{name}: no fragment tail: {st}"))
            .clone();
        assert!(
            tail["length"].as_u64().expect("length") > 12 << 20,
            "{name}: the tail is not longer than 12 MiB: {tail}"
        );
        // The head takes as much input as the kernel lets one extent decode.
        assert_eq!(st["extents"][0]["length"], 12 << 20, "{name}: {st}");
        ok(&[&"check", &img]);
        let out = common::run(&[&"cat", &img, &"/regs.h"]);
        assert!(
            out.status.success(),
            "{name}: cat: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == data, "{name}: cat differs");
        let x = d.path().join("x");
        ok(&[&"extract", &img, &x]);
        assert_same_tree(&src, &x);
        std::fs::remove_dir_all(&x).expect("rm");
        if fsck_knows("lz4") {
            fsck_erofs(&img).unwrap_or_else(|e| panic!("{name}: fsck.erofs: {e}"));
        }
        if kernel_available("long_fragment_tail") {
            let m = Mount::erofs(&img);
            assert_same_tree(&src, m.path());
        }
    }
}

/// A scratch directory with the tree `src` holding `a/NAME` and `b/NAME` (a's fragment
/// comes first in inode order).
fn tree_of_two(
    name: &str,
    a: (&str, &[u8]),
    b: (&str, &[u8]),
) -> (tempfile::TempDir, std::path::PathBuf) {
    let d = scratch(name);
    let src = d.path().join("src");
    for (sub, (file, data)) in [("a", a), ("b", b)] {
        std::fs::create_dir_all(src.join(sub)).expect("mkdir");
        std::fs::write(src.join(sub).join(file), data).expect("write");
    }
    (d, src)
}

/// How a file that ends in a fragment is stored (`ferofs stat`): the kinds of its
/// extents before the fragment, the fragment's offset in the packed inode, its length.
fn fragment_layout(img: &Path, p: &str) -> (Vec<String>, u64, u64) {
    let st = json(&ok(&[&"stat", &"--json", &img, &p]));
    let size = st["size"].as_u64().expect("size");
    let ext = st["extents"].as_array().expect("extents");
    let (last, before) = ext.split_last().expect("an extent");
    assert_eq!(last["kind"], "plain fragment", "{p}: {st}");
    let logical = last["logical"].as_u64().expect("logical");
    let off = last["fragment_offset"].as_u64().expect("fragment offset");
    let kinds = before
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("?").to_string())
        .collect();
    (kinds, off, size - logical)
}

/// A file whose tail fragment is the end of an earlier, longer fragment points into it
/// (as mkfs.erofs does), where the packed inode's codec could not reach the copy: LZ4's
/// 64 KiB window. With zstd, which sees a whole pcluster's input, it is stored again.
#[test]
fn a_fragment_equal_to_the_end_of_an_earlier_one_is_not_stored_again() {
    let big = Rng(41).text(200_000);
    let (d, src) = tree_of_two("packed-suffix", ("big", &big), ("end", &big[100_000..]));
    // Each file is one fragment.
    let frag_off = |img: &Path, p: &str| -> u64 {
        let (before, off, _) = fragment_layout(img, p);
        assert!(before.is_empty(), "{p}: {before:?}");
        off
    };
    for (z, shared) in [
        ("lz4", true),
        ("lz4hc", true),
        ("deflate", true),
        ("zstd", false),
    ] {
        let img = d.path().join(format!("{z}.erofs"));
        roundtrip(
            &src,
            &img,
            d.path(),
            z,
            &["-z", z, "-C", "131072", "-E", "smallest"],
        );
        let (a, b) = (frag_off(&img, "/a/big"), frag_off(&img, "/b/end"));
        if shared {
            assert_eq!(b, a + 100_000, "{z}");
            let without = d.path().join("without.erofs");
            build(
                &src,
                &without,
                &["-z", z, "-C", "131072", "-E", "fragments"],
            );
            // Without dedupe the packed inode holds 300 KB of words instead of 200 KB:
            // the image is about a third larger (a few blocks of it are metadata).
            assert!(
                image_blocks(&without) * 4 >= image_blocks(&img) * 5,
                "{z}: {} blocks, {} without dedupe",
                image_blocks(&img),
                image_blocks(&without)
            );
        } else {
            assert_eq!(b, a + 200_000, "{z}");
        }
    }
}

/// A fragment that ends like an earlier one but is longer than the end they share
/// shares it all the same: its head goes to pclusters of the file's own, its rest
/// points into the earlier fragment.
#[test]
fn a_fragment_sharing_an_earlier_ones_end_keeps_its_head_in_pclusters() {
    let a = Rng(51).text(600_000);
    let mut b = Rng(52).text(60_000);
    b.extend_from_slice(&a[380_000..]);
    let (d, src) = tree_of_two("packed-common-end", ("one", &a), ("two", &b));
    // (LZ4 pclusters before the fragment, the fragment's offset and length)
    let layout = |img: &Path, p: &str| -> (usize, u64, u64) {
        let (before, off, len) = fragment_layout(img, p);
        assert!(before.iter().all(|k| k == "lz4"), "{p}: {before:?}");
        (before.len(), off, len)
    };
    let img = d.path().join("lz4.erofs");
    let args = ["-z", "lz4", "-C", "131072", "-E", "smallest"];
    roundtrip(&src, &img, d.path(), "lz4", &args);
    let (_, a_off, a_len) = layout(&img, "/a/one");
    let (b_head, b_off, b_len) = layout(&img, "/b/two");
    assert!(b_head >= 1, "two's head is in a pcluster of its own");
    assert!((100_000..220_000).contains(&b_len), "{b_len}");
    assert_eq!(
        b_off + b_len,
        a_off + a_len,
        "two's fragment ends where one's does"
    );
    let without = d.path().join("without.erofs");
    build(
        &src,
        &without,
        &["-z", "lz4", "-C", "131072", "-E", "fragments"],
    );
    let (b_head, ..) = layout(&without, "/b/two");
    assert_eq!(b_head, 0, "without dedupe two is one fragment");
    assert!(
        image_blocks(&without) >= image_blocks(&img) + 15,
        "{} blocks, {} without dedupe",
        image_blocks(&img),
        image_blocks(&without)
    );
}

/// Files alike in content (here twelve versions of one text, a few lines changed in
/// each), under names of their own in directories far apart, meet in the packed
/// inode: they follow the first of them, back to back, and every other file keeps
/// inode order.
#[test]
fn files_alike_in_content_sit_together_in_the_packed_inode() {
    let d = scratch("packed-alike");
    let src = d.path().join("tree");
    let base = text_lines(600, 71);
    for i in 0..12u64 {
        let dir = src.join(format!("d{i:02}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        // Each directory's own text first in inode order ("data" < "notes").
        std::fs::write(
            dir.join(format!("data-{i:02}.txt")),
            text_lines(1_500, 1_000 + 2 * i),
        )
        .expect("write");
        let mut notes = base.clone();
        for k in 0..5 {
            let at = (i as usize * 5 + k) * 350;
            notes[at] = b'#';
        }
        std::fs::write(dir.join(format!("notes-{i:02}.txt")), &notes).expect("write");
    }
    let img = d.path().join("alike.erofs");
    let args = ["-z", "lz4", "-C", "131072", "-E", "smallest"];
    roundtrip(&src, &img, d.path(), "lz4", &args);
    let frag = |p: String| -> (u64, u64) {
        let (before, off, len) = fragment_layout(&img, &p);
        assert!(before.is_empty(), "{p}: {before:?}");
        (off, len)
    };
    let notes: Vec<(u64, u64)> = (0..12)
        .map(|i| frag(format!("/d{i:02}/notes-{i:02}.txt")))
        .collect();
    let data: Vec<(u64, u64)> = (0..12)
        .map(|i| frag(format!("/d{i:02}/data-{i:02}.txt")))
        .collect();
    // d00's text, then the twelve notes back to back, then the other texts in order.
    assert_eq!(data[0].0, 0);
    assert_eq!(notes[0].0, data[0].1);
    for w in notes.windows(2) {
        assert_eq!(w[1].0, w[0].0 + w[0].1, "{notes:?}");
    }
    let mut at = notes[11].0 + notes[11].1;
    for (i, &(off, len)) in data.iter().enumerate().skip(1) {
        assert_eq!(off, at, "data-{i:02}: {data:?}");
        at += len;
    }
}

/// Files that go whole to the packed inode under a name many of them share (here 16
/// `LICENSE`s, alike but not equal, each beside 70 KB of noise of its own name) sit side by side at the
/// end of the packed inode, in inode order, where LZ4's 64 KiB window finds each in
/// the one before. Under names of their own, the same files keep inode order and each
/// is stored alone (they hold no newline, so no content sketch brings them together
/// either: see the next test).
#[test]
fn files_sharing_a_common_name_sit_together_in_the_packed_inode() {
    let d = scratch("packed-common-names");
    let base: Vec<u8> = noise(6_000, 61)
        .into_iter()
        .map(|b| if b == b'\n' { b'.' } else { b })
        .collect();
    let make = |root: &Path, unique: bool| {
        for i in 0..16u8 {
            let dir = root.join(format!("d{i:02}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            let mut lic = base.clone();
            lic[100 + usize::from(i) * 7] ^= 0x5a;
            let name = if unique {
                format!("LICENSE-{i:02}")
            } else {
                "LICENSE".to_string()
            };
            std::fs::write(dir.join(name), &lic).expect("write");
            let blob = noise(70_000, (u64::from(i) + 1) << 20);
            std::fs::write(dir.join(format!("blob-{i:02}")), blob).expect("write");
        }
    };
    let (shared, unique) = (d.path().join("shared"), d.path().join("unique"));
    make(&shared, false);
    make(&unique, true);
    let args = ["-z", "lz4", "-C", "131072", "-E", "smallest"];
    let img = d.path().join("shared.erofs");
    roundtrip(&shared, &img, d.path(), "lz4", &args);
    let alone = d.path().join("unique.erofs");
    roundtrip(&unique, &alone, d.path(), "lz4", &args);
    // (offset, length) of each file's fragment; the files are fragments whole.
    let frag = |img: &Path, p: String| -> (u64, u64) {
        let (before, off, len) = fragment_layout(img, &p);
        assert!(before.is_empty(), "{p}: {before:?}");
        (off, len)
    };
    let lics: Vec<(u64, u64)> = (0..16)
        .map(|i| frag(&img, format!("/d{i:02}/LICENSE")))
        .collect();
    let blobs_end = (0..16)
        .map(|i| {
            let (o, l) = frag(&img, format!("/d{i:02}/blob-{i:02}"));
            o + l
        })
        .max()
        .expect("16 blobs");
    assert_eq!(
        lics[0].0, blobs_end,
        "the group follows every other fragment"
    );
    for w in lics.windows(2) {
        assert_eq!(w[1].0, w[0].0 + w[0].1, "{lics:?}");
    }
    // Under names of their own: inode order, each licence before its blob.
    let (first, _) = frag(&alone, "/d00/LICENSE-00".into());
    let (blob0, _) = frag(&alone, "/d00/blob-00".into());
    assert_eq!((first, blob0), (0, 6_000));
    // Alone, each noisy licence costs its 6,000 bytes (23 blocks for 16); together
    // little more than one does (pcluster ends and the longer names take some back).
    assert!(
        image_blocks(&img) + 12 <= image_blocks(&alone),
        "{} blocks grouped, {} under names of their own",
        image_blocks(&img),
        image_blocks(&alone)
    );
}

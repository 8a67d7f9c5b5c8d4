//! Compressed images through the kernel: every algorithm x pcluster size x
//! {plain, ztailpacking} builds the make-tree tree, the kernel mount has the source's
//! digest, fsck.erofs passes (where its version knows the algorithm), and `ferofs
//! extract` gives the same tree.

mod common;
use common::*;
use ferofs_testkit::*;

/// fsck.erofs learned DEFLATE in 1.7 and Zstandard in 1.8; Debian 12 ships 1.5.
fn fsck_knows(alg: &str) -> bool {
    let v = fsck_erofs_version().unwrap_or((0, 0));
    match alg {
        "deflate" => v >= (1, 7),
        "zstd" => v >= (1, 8),
        _ => true,
    }
}

fn matrix(alg: &str) {
    if !kernel_available(alg) {
        return;
    }
    let (fs, tree) = make_tree();
    for c in ["4096", "65536", "1048576"] {
        for tail in [false, true] {
            let img = fs.path().join(format!("{alg}-{c}-{tail}.erofs"));
            let mut args = vec!["-z", alg, "-C", c];
            if tail {
                args.extend(["-E", "ztailpacking"]);
            }
            build(&tree, &img, &args);
            let info = json(&ok(&[&"inspect", &"--json", &img]));
            assert!(
                info["counts"]["compressed_files"].as_u64().unwrap_or(0) >= 10,
                "{alg} {c}: {info}"
            );
            {
                let m = Mount::erofs(&img);
                assert_same_tree(&tree, m.path());
            }
            if fsck_knows(alg) {
                fsck_erofs(&img).unwrap_or_else(|e| {
                    panic!("{alg} -C {c} tail={tail}: fsck.erofs failed:\n{e}")
                });
            } else {
                eprintln!(
                    "note: fsck.erofs {:?} does not know {alg}; the kernel mount is the check",
                    fsck_erofs_version()
                );
            }
            if c == "65536" {
                let x = fs.path().join("x");
                ok(&[&"extract", &img, &x]);
                assert_same_tree(&tree, &x);
                std::fs::remove_dir_all(&x).expect("rm");
            }
            std::fs::remove_file(&img).expect("rm");
        }
    }
}

#[test]
fn lz4_matrix() {
    matrix("lz4");
}
#[test]
fn lz4hc_matrix() {
    matrix("lz4hc");
}
#[test]
fn lzma_matrix() {
    matrix("lzma");
}
#[test]
fn deflate_matrix() {
    matrix("deflate");
}
#[test]
fn zstd_matrix() {
    matrix("zstd");
}

/// DEFLATE levels 1-9 run our own fixed-output encoder (greedy, lazy and lazy2 parses,
/// block splitting in big pclusters), levels 10-12 libdeflate with the prefix search:
/// the kernel reads each, and the images are the same at any thread count.
#[test]
fn deflate_levels_and_threads() {
    if !kernel_available("deflate_levels_and_threads") {
        return;
    }
    let (fs, tree) = make_tree();
    for (level, c) in [("1", "4096"), ("9", "1048576"), ("12", "16384")] {
        let img = fs.path().join(format!("deflate-{level}.erofs"));
        let z = format!("deflate,level={level}");
        build(&tree, &img, &["-z", &z, "-C", c]);
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
        if fsck_knows("deflate") {
            fsck_erofs(&img).unwrap_or_else(|e| panic!("level {level}: fsck.erofs:\n{e}"));
        }
        let bytes = std::fs::read(&img).expect("read image");
        // Threads: once, where block splitting runs too.
        let threads: &[&str] = if level == "9" { &["1", "3"] } else { &[] };
        for j in threads {
            let o = fs.path().join(format!("deflate-{level}-j{j}.erofs"));
            build(&tree, &o, &["-j", *j, "-z", &z, "-C", c]);
            assert!(
                std::fs::read(&o).expect("read image") == bytes,
                "level {level}: -j {j} differs"
            );
            std::fs::remove_file(&o).expect("rm");
        }
        std::fs::remove_file(&img).expect("rm");
    }
}

#[test]
fn hints_defaults_fallback_and_determinism() {
    if !kernel_available("hints_defaults_fallback_and_determinism") {
        return;
    }
    let (fs, tree) = make_tree();
    // Default build: lz4hc level 9, 4 KiB pclusters.
    let d = fs.path().join("default.erofs");
    build(&tree, &d, &[]);
    let info = json(&ok(&[&"inspect", &"--json", &d]));
    assert_eq!(info["compression_algorithms"], serde_json::json!(["lz4"]));
    // Incompressible data is stored uncompressed; text is compressed.
    let st = json(&ok(&[&"stat", &"--json", &d, &"/data/random-2MiB.bin"]));
    assert_eq!(st["layout"], "flat-plain", "{st}");
    let st = json(&ok(&[
        &"stat",
        &"--json",
        &d,
        &"/data/compressible-3MiB.txt",
    ]));
    assert_eq!(st["layout"], "compressed-compact");
    // Same bytes for any thread count (8 threads on a small machine also shuffles which
    // worker compresses which segment).
    for j in ["1", "2", "3", "8"] {
        let o = fs.path().join(format!("j{j}.erofs"));
        build(
            &tree,
            &o,
            &[
                "-j",
                j,
                "-z",
                "zstd,level=6",
                "-C",
                "65536",
                "-E",
                "ztailpacking",
            ],
        );
        assert!(
            std::fs::read(&o).expect("r") == std::fs::read(fs.path().join("j1.erofs")).expect("r"),
            "-j1 and -j{j} differ"
        );
    }
    // Hints (mkfs.erofs 1.9.3 crashes on this file): .txt files with lzma at 4 KiB,
    // everything else lz4hc at 64 KiB.
    let hints = shared_dir().join("testdata/compress-hints.txt");
    let h = fs.path().join("hints.erofs");
    build(
        &tree,
        &h,
        &[
            "-z",
            "lz4hc:lzma",
            "-C",
            "65536",
            "--compress-hints",
            hints.to_str().expect("utf8"),
        ],
    );
    let info = json(&ok(&[&"inspect", &"--json", &h]));
    assert_eq!(
        info["compression_algorithms"],
        serde_json::json!(["lz4", "lzma"])
    );
    let st = json(&ok(&[
        &"stat",
        &"--json",
        &h,
        &"/data/compressible-3MiB.txt",
    ]));
    let kinds: Vec<&str> = st["extents"]
        .as_array()
        .expect("extents")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds
            .iter()
            .all(|k| k.starts_with("lzma") || k.starts_with("plain")),
        "{kinds:?}"
    );
    assert!(st["extents"]
        .as_array()
        .expect("e")
        .iter()
        .all(|e| e["stored"].as_u64().unwrap_or(0) <= 4096));
    let st = json(&ok(&[&"stat", &"--json", &h, &"/data/mixed-5MiB.bin"]));
    let ext = st["extents"].as_array().expect("extents");
    assert!(
        ext.iter()
            .any(|e| e["kind"] == "lz4" && e["stored"].as_u64().unwrap_or(0) > 4096),
        "big lz4hc pclusters expected"
    );
    {
        let m = Mount::erofs(&h);
        assert_same_tree(&tree, m.path());
    }
    fsck_erofs(&h).unwrap_or_else(|e| panic!("hints image: fsck.erofs failed:\n{e}"));
    // A hint naming an algorithm that was not given is a clear error.
    let out = ferofs()
        .args(["build", "-z", "lz4hc", "--compress-hints"])
        .arg(&hints)
        .arg(&tree)
        .arg(fs.path().join("bad.erofs"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("algorithm index 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!fs.path().join("bad.erofs").exists());
}

/// Text of `n` bytes from a small deterministic word generator (compresses ~3x).
fn words(seed: u64, n: usize) -> Vec<u8> {
    const W: [&str; 16] = [
        "erofs ", "block ", "cluster ", "read ", "only ", "kernel ", "image ", "the ", "of ",
        "data\n", "inode ", "xattr ", "zero ", "tail ", "pack ", "map ",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(W[(x % 16) as usize].as_bytes());
        if x.is_multiple_of(5) {
            v.extend_from_slice(format!("{} ", x % 100_000).as_bytes());
        }
    }
    v.truncate(n);
    v
}

/// Without ztailpacking, a file of at most one block and the last at most one block
/// of a file take a block whether compressed or not: they are stored as they are (as
/// mkfs.erofs does), without handing them to the compressor. With ztailpacking they are
/// compressed (their compressed form may go inline). Contents read back exactly.
#[test]
fn sub_block_data_is_not_compressed_without_ztailpacking() {
    use ferofs_builder::{build_from_dir, BuildOptions, Compression};
    use ferofs_compress::CompressorSpec;
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    let mut sizes = vec![1usize, 700, 2000, 4095, 4096, 4097, 6000, 9000];
    sizes.extend((0..40).map(|i| 10_000 + i * 3_917));
    for (i, &n) in sizes.iter().enumerate() {
        std::fs::write(tree.join(format!("f{i:02}")), words(i as u64, n)).expect("write");
    }
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    let small: u64 = sizes
        .iter()
        .filter(|&&n| n <= 4096)
        .map(|&n| n as u64)
        .sum();
    for (alg, tailpack) in [("lz4hc", false), ("lzma", false), ("lz4hc", true)] {
        let img = dir.path().join(format!("{alg}-{tailpack}.erofs"));
        let opts = BuildOptions {
            compression: Some(Compression {
                algorithms: vec![CompressorSpec::parse(alg).expect("spec")],
                pcluster_size: 4096,
                ztailpacking: tailpack,
                ..Compression::default()
            }),
            ..BuildOptions::default()
        };
        let report = build_from_dir(&tree, &img, &opts).expect("build");
        let (mut plain_tails, mut small_compressed_tails, mut inline_compressed) = (0, 0, 0);
        let mut plain_tail_bytes = 0;
        for (i, &n) in sizes.iter().enumerate() {
            let path = format!("/f{i:02}");
            let st = json(&ok(&[&"stat", &"--json", &img, &path]));
            let layout = st["layout"].as_str().expect("layout");
            if !tailpack && n <= 4096 {
                assert!(!layout.starts_with("compressed"), "{alg} {path}: {st}");
            }
            if layout.starts_with("compressed") {
                let ext = st["extents"].as_array().expect("extents");
                let last = ext.last().expect("an extent");
                let kind = last["kind"].as_str().expect("kind");
                let len = last["length"].as_u64().expect("length");
                if kind.ends_with("inline") && !kind.starts_with("plain") {
                    inline_compressed += 1;
                }
                if len <= 4096 {
                    if kind.starts_with("plain") {
                        plain_tails += 1;
                        plain_tail_bytes += len;
                    } else {
                        small_compressed_tails += 1;
                    }
                }
            }
            let back = ok(&[&"cat", &img, &path]);
            assert!(
                back.as_bytes() == words(i as u64, n),
                "{alg} {path} differs"
            );
        }
        if tailpack {
            assert!(
                inline_compressed > 0,
                "no compressed tail inline with ztailpacking"
            );
            assert_eq!(report.compressor_input, total);
        } else {
            assert_eq!(
                small_compressed_tails, 0,
                "{alg}: compressed sub-block tails"
            );
            assert_eq!(inline_compressed, 0);
            assert!(plain_tails > 0, "{alg}: the case did not occur");
            // Neither the small files nor the plain tails went through the compressor.
            assert_eq!(
                report.compressor_input,
                total - small - plain_tail_bytes,
                "{alg}"
            );
        }
    }
}

/// Random bytes from a seeded xorshift64* (deterministic, incompressible).
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Data that does not compress is stored as it is without going through the codec
/// (issue: random data cost 3-40x mkfs.erofs's time): a random file is stored
/// uncompressed and never handed to the compressor; in a file of text, random bytes and
/// text, all of the random stretch but at most about two pclusters is skipped, and is
/// stored in PLAIN extents. Contents read back exactly, through the kernel too.
#[test]
fn incompressible_data_is_stored_without_the_codec() {
    use ferofs_builder::{build_from_dir, BuildOptions, Compression};
    use ferofs_compress::CompressorSpec;
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    let rand = random_bytes(1, 1 << 20);
    let text = words(7, 300 << 10);
    let (head, body, tail) = (200 << 10, 600 << 10, 200 << 10);
    let mut mixed = words(8, head);
    mixed.extend(random_bytes(2, body));
    mixed.extend(words(9, tail));
    std::fs::write(tree.join("rand.bin"), &rand).expect("write");
    std::fs::write(tree.join("text.txt"), &text).expect("write");
    std::fs::write(tree.join("mixed.bin"), &mixed).expect("write");
    let total = (rand.len() + text.len() + mixed.len()) as u64;
    for (alg, cap) in [
        ("lz4", 131072u32),
        ("lz4hc", 4096),
        ("lz4hc", 131072),
        ("lzma", 131072),
        ("deflate", 65536),
        ("zstd", 1 << 20),
    ] {
        let img = dir.path().join(format!("{alg}-{cap}.erofs"));
        let opts = BuildOptions {
            compression: Some(Compression {
                algorithms: vec![CompressorSpec::parse(alg).expect("spec")],
                pcluster_size: cap,
                ztailpacking: false,
                ..Compression::default()
            }),
            ..BuildOptions::default()
        };
        let report = build_from_dir(&tree, &img, &opts).expect("build");
        let skipped_at_least =
            rand.len() as u64 + (body as u64).saturating_sub(2 * u64::from(cap) + 4096);
        assert!(
            report.compressor_input <= total - skipped_at_least,
            "{alg} -C {cap}: {} bytes went through the codec, at most {} expected",
            report.compressor_input,
            total - skipped_at_least
        );
        let st = json(&ok(&[&"stat", &"--json", &img, &"/rand.bin"]));
        let layout = st["layout"].as_str().expect("layout");
        assert!(!layout.starts_with("compressed"), "{alg}: {st}");
        let st = json(&ok(&[&"stat", &"--json", &img, &"/mixed.bin"]));
        assert!(
            st["layout"]
                .as_str()
                .expect("layout")
                .starts_with("compressed"),
            "{alg}: {st}"
        );
        let ext = st["extents"].as_array().expect("extents");
        let plain: u64 = ext
            .iter()
            .filter(|e| e["kind"].as_str() == Some("plain"))
            .map(|e| e["length"].as_u64().expect("length"))
            .sum();
        assert!(
            plain >= (body as u64).saturating_sub(2 * u64::from(cap))
                && plain <= body as u64 + 8192,
            "{alg} -C {cap}: {plain} bytes in PLAIN extents: {st}"
        );
        for (name, want) in [
            ("/rand.bin", &rand),
            ("/text.txt", &text),
            ("/mixed.bin", &mixed),
        ] {
            let back = ferofs()
                .args(["cat".as_ref(), img.as_os_str(), name.as_ref()])
                .output()
                .expect("cat");
            assert!(
                back.status.success() && &back.stdout == want,
                "{alg} {name}"
            );
        }
        if kernel_available("incompressible") {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
    }
}

/// A source that counts the bytes read from it.
struct CountingSource {
    data: Vec<u8>,
    bytes: std::sync::atomic::AtomicU64,
}

impl ferofs_reader::Source for CountingSource {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.bytes
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        ferofs_reader::Source::read_exact_at(&self.data, buf, offset)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.data.len() as u64)
    }
}

/// Random 4 KiB reads of a file whose index is larger than the reader's metadata window
/// (lz4, 4 KiB pclusters, 48 MiB: 12,288 lclusters of index) fetch about what the kernel
/// does, the pclusters they need and the index block a read maps through, not a whole
/// 16 KiB metadata window per read (before: 21 KiB a read; scripts/bench-kread io).
#[test]
fn random_reads_fetch_only_the_index_blocks_they_need() {
    use ferofs_reader::Image;
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    let data = words(11, 48 << 20);
    std::fs::write(tree.join("big.txt"), &data).expect("write");
    let img_path = dir.path().join("big.erofs");
    build(&tree, &img_path, &["-z", "lz4", "-C", "4096"]);
    let src = std::sync::Arc::new(CountingSource {
        data: std::fs::read(&img_path).expect("read image"),
        bytes: Default::default(),
    });
    let img = Image::new(src.clone()).expect("open");
    let ino = img.lookup(b"/big.txt").expect("lookup");
    let blocks = (data.len() / 4096) as u64;
    let mut x = 0x5EED_u64;
    let reads = 1000u64;
    src.bytes.store(0, Ordering::Relaxed);
    let mut buf = vec![0u8; 4096];
    for i in 0..reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Alternately in the first and the last quarter of the file: their index
        // entries lie more than a window apart, so every read misses the window.
        let quarter = blocks / 4;
        let off = (x % quarter + if i % 2 == 0 { 0 } else { blocks - quarter }) * 4096;
        let n = img.read_at(&ino, off, &mut buf).expect("read");
        assert_eq!(n, 4096);
        assert!(
            buf[..] == data[off as usize..off as usize + 4096],
            "bytes at {off}"
        );
    }
    let per_read = src.bytes.load(Ordering::Relaxed) / reads;
    assert!(
        per_read <= 14 << 10,
        "{per_read} bytes fetched per random 4 KiB read"
    );
}

/// `--max-extent-bytes`: no compressed extent decodes to more than the bound (here a
/// quarter of the pcluster: fixed-size input), files of zeros and of repetitive text
/// included, with fragments and ztailpacking too; the kernel reads the image as the tree.
#[test]
fn max_extent_bytes_bounds_every_extent() {
    if !kernel_available("max_extent_bytes_bounds_every_extent") {
        return;
    }
    let fs = Tmpfs::new("256M");
    let tree = fs.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    std::fs::write(tree.join("zeros"), vec![0u8; 3 << 20]).expect("write");
    let text: Vec<u8> = (0..100_000u32)
        .flat_map(|i| format!("line {} of a repetitive file\n", i % 1000).into_bytes())
        .collect();
    std::fs::write(tree.join("text"), &text).expect("write");
    std::fs::write(tree.join("noise"), noise(200_000, 7)).expect("write");
    std::fs::write(tree.join("small"), &text[..5000]).expect("write");
    let img = fs.path().join("x.erofs");
    let longest = |img: &std::path::Path| -> u64 {
        ["/zeros", "/text", "/noise", "/small"]
            .iter()
            .flat_map(|p| {
                json(&ok(&[&"stat", &"--json", &img, p]))["extents"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            // Fragments decode through the packed inode, whose extents the bound
            // holds too (dump.erofs 1.9.3 shows them at most 16 KiB).
            .filter(|e| {
                let k = e["kind"].as_str().unwrap_or("");
                k != "hole" && k != "plain" && !k.contains("fragment")
            })
            .map(|e| e["length"].as_u64().unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0)
    };
    build(&tree, &img, &["-z", "lz4hc", "-C", "65536"]);
    assert!(longest(&img) > 16384, "unbounded: {}", longest(&img));
    for extra in [
        &["-z", "lz4hc", "-C", "65536"][..],
        &["-z", "zstd", "-C", "65536", "-E", "ztailpacking,fragments"][..],
        &["-z", "lzma", "-C", "131072", "-E", "dedupe"][..],
    ] {
        let args = [extra, &["--max-extent-bytes", "16k"][..]].concat();
        build(&tree, &img, &args);
        let l = longest(&img);
        assert!(l > 0 && l <= 16384, "{args:?}: an extent of {l} bytes");
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
        fsck_metabox(&img, &format!("{args:?}"));
    }
    // Below the block size, or without compression: refused.
    for bad in [
        &["-z", "lz4", "--max-extent-bytes", "2048"][..],
        &["-z", "none", "--max-extent-bytes", "65536"][..],
    ] {
        let out = ferofs()
            .arg("build")
            .args(bad)
            .arg(&tree)
            .arg(fs.path().join("bad.erofs"))
            .output()
            .expect("run ferofs");
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}

/// `-E legacy-compress` (mkfs.erofs's name): every compressed file, the packed inode
/// included, gets full 8-byte lcluster indexes, never compact ones, with ztailpacking,
/// fragments, dedupe and the 48-bit layout too; no shared pcluster, so no dedupe
/// feature bit of its own; the kernel and fsck.erofs read the image as the tree. Without
/// it the same tree has compact indexes; without compression it is refused (the drop-in
/// ignores it with a warning, as `-C`).
#[test]
fn legacy_compress_writes_full_indexes() {
    if !kernel_available("legacy_compress_writes_full_indexes") {
        return;
    }
    let fs = Tmpfs::new("128M");
    let tree = fs.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    let text: Vec<u8> = (0..60_000u32)
        .flat_map(|i| format!("line {} of a repetitive file\n", i % 700).into_bytes())
        .collect();
    std::fs::write(tree.join("text"), &text).expect("write");
    std::fs::write(tree.join("zeros"), vec![0u8; 1 << 20]).expect("write");
    std::fs::write(tree.join("noise"), noise(100_000, 3)).expect("write");
    std::fs::write(tree.join("small"), &text[..5000]).expect("write");
    std::fs::write(
        tree.join("mixed"),
        [&text[..300_000], &noise(9000, 4)[..]].concat(),
    )
    .expect("write");
    let img = fs.path().join("x.erofs");
    let layouts = |img: &std::path::Path| -> Vec<String> {
        ["/text", "/zeros", "/noise", "/small", "/mixed"]
            .iter()
            .map(|p| {
                json(&ok(&[&"stat", &"--json", &img, p]))["layout"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string()
            })
            .collect()
    };
    build(&tree, &img, &["-z", "lz4hc", "-C", "16384"]);
    assert!(
        layouts(&img).iter().any(|l| l == "compressed-compact"),
        "{:?}",
        layouts(&img)
    );
    for extra in [
        &["-z", "lz4hc", "-C", "16384"][..],
        &[
            "-z",
            "lzma",
            "-C",
            "65536",
            "-E",
            "ztailpacking,fragments,dedupe",
        ][..],
        &["-z", "zstd", "-E", "all-fragments,ztailpacking"][..],
        &["-z", "deflate", "-C", "8192", "-E", "48bit"][..],
    ] {
        let args = [extra, &["-E", "legacy-compress"][..]].concat();
        build(&tree, &img, &args);
        let l = layouts(&img);
        assert!(
            !l.iter().any(|l| l == "compressed-compact")
                && l.iter().any(|l| l == "compressed-full"),
            "{args:?}: {l:?}"
        );
        // The packed inode (fragments) is compressed with full indexes too.
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        let packed = info["packed_nid"].as_u64().unwrap_or(0);
        if args.iter().any(|a| a.contains("fragments")) {
            assert!(packed > 0, "{args:?}: no packed inode");
            let st = json(&ok(&[
                &"stat",
                &"--json",
                &img,
                &"--nid",
                &packed.to_string(),
            ]));
            assert_eq!(
                st["layout"], "compressed-full",
                "{args:?}: packed inode {st}"
            );
        }
        let feats = info["feature_incompat"].to_string();
        if !args.iter().any(|a| a.contains("fragments")) {
            assert!(!feats.contains("dedupe"), "{args:?}: {feats}");
        }
        {
            let m = Mount::erofs(&img);
            assert_same_tree(&tree, m.path());
        }
        fsck_metabox(&img, &format!("{args:?}"));
    }
    let out = ferofs()
        .args(["build", "-z", "none", "-E", "legacy-compress"])
        .arg(&tree)
        .arg(fs.path().join("bad.erofs"))
        .output()
        .expect("run ferofs");
    assert!(!out.status.success(), "-z none -E legacy-compress accepted");
    assert!(!fs.path().join("bad.erofs").exists());
}

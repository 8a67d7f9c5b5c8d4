//! Inputs the `build_roundtrip` fuzz target (fuzz/fuzz_targets/build_roundtrip.rs) found,
//! minimised and written out as plain trees: each must build, read back as described,
//! and pass fsck.erofs.

use ferofs_builder::{build_from_tars, BuildOptions, Compression, TarInput};
use ferofs_reader::Image;
use std::path::Path;

type Res = Result<(), Box<dyn std::error::Error>>;

/// A PAX record, "LEN KEY=VALUE\n" (LEN counts itself).
fn record(out: &mut Vec<u8>, key: &str, val: &[u8]) {
    let body = key.len() + val.len() + 3;
    let mut len = body + 1;
    while body + len.to_string().len() != len {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(format!("{len} {key}=").as_bytes());
    out.extend_from_slice(val);
    out.push(b'\n');
}

/// A ustar header: name, mode, size, type; owner 0:0, mtime 1700000000.
fn header(name: &str, mode: u32, size: usize, typ: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(format!("{mode:07o}").as_bytes());
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(format!("{:011o}", 1_700_000_000).as_bytes());
    h[156] = typ;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn pad(v: &mut Vec<u8>) {
    v.resize(v.len().div_ceil(512) * 512, 0);
}

/// A tar of the root directory alone, with these xattrs.
fn root_only_tar(xattrs: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut pax = Vec::new();
    for (k, v) in xattrs {
        record(&mut pax, &format!("SCHILY.xattr.{k}"), v);
    }
    let mut t = header("PaxHeader", 0o644, pax.len(), b'x').to_vec();
    t.extend_from_slice(&pax);
    pad(&mut t);
    t.extend_from_slice(&header("./", 0o755, 0, b'5'));
    t.extend_from_slice(&[0u8; 1024]);
    t
}

fn build(
    tar: &[u8],
    dir: &Path,
    opts: &BuildOptions,
) -> Result<Image<std::fs::File>, Box<dyn std::error::Error>> {
    let src = dir.join("in.tar");
    let out = dir.join("out.erofs");
    std::fs::write(&src, tar)?;
    build_from_tars(&[TarInput::File(src)], &out, opts)?;
    if opts.metabox {
        ferofs_testkit::fsck_metabox(&out, "metabox image");
    } else {
        ferofs_testkit::fsck_erofs_if_supported(&out, opts.block_size)?;
    }
    Ok(Image::open(&out)?)
}

/// Build `tar` (which holds a file `f`) with `opts` into `dir/out.erofs`; returns the
/// image's path and `f` read back through the reader (errors name `what`).
fn build_read_f(
    tar: &[u8],
    dir: &Path,
    opts: &BuildOptions,
    what: &str,
) -> Result<(std::path::PathBuf, Vec<u8>), Box<dyn std::error::Error>> {
    let (src, out) = (dir.join("in.tar"), dir.join("out.erofs"));
    std::fs::write(&src, tar)?;
    build_from_tars(&[TarInput::File(src)], &out, opts)?;
    let img = Image::open(&out)?;
    let f = img.lookup(b"/f")?;
    let back = img.read_to_vec(&f).map_err(|e| format!("{what}: {e}"))?;
    Ok((out, back))
}

/// The root's record (core and xattrs, no inline data) was always kept in one block, so
/// a root with more xattr bytes than a block refused to build ("inline record larger
/// than a block"); now it begins the stream of records that may cross blocks. Found
/// with 1024-byte blocks and `-m`; both layouts and every block size checked.
#[test]
fn root_xattrs_longer_than_a_block() -> Res {
    let big = vec![b'v'; 1280];
    let tar = root_only_tar(&[("trusted.selinux", big.clone()), ("user.a", Vec::new())]);
    let dir = tempfile::tempdir()?;
    for bs in [512u32, 1024, 2048, 4096] {
        for metabox in [false, true] {
            let opts = BuildOptions {
                block_size: bs,
                metabox,
                inline_data: false,
                compression: Some(Compression::default()),
                threads: 1,
                ..Default::default()
            };
            let img = build(&tar, dir.path(), &opts)
                .map_err(|e| format!("block size {bs}, metabox {metabox}: {e}"))?;
            let root = img.inode(img.root_nid())?;
            assert_eq!(img.get_xattr(&root, b"trusted.selinux")?, Some(big.clone()));
            assert_eq!(img.get_xattr(&root, b"user.a")?, Some(Vec::new()));
            assert_eq!(img.read_dir(&root)?.len(), 2, "only . and ..");
        }
    }
    Ok(())
}

/// A file whose end fills its last pcluster's blocks only in part is compressed again
/// into whole blocks (ztailpacking). When that refit failed, the pcluster stored was
/// what the failed attempt had left in the buffer, not the first compression: zstd's
/// refit of 32 KiB and more goes piece by piece into the same buffer, so the image's
/// last pcluster decoded to fewer bytes than its extent (fsck.erofs: "ZSTD decompress
/// length mismatch", the kernel: EUCLEAN). Found as 44 KiB of noise written twice
/// (the second copy compresses, the refit finds nothing shorter that fits).
#[test]
fn failed_refit_keeps_the_pcluster_it_would_replace() -> Res {
    // The fuzz target's noise, with its seed for this input.
    let half = ferofs_testkit::noise_bits24(45_312, 177u64 << 32 | 177 | 1);
    let mut data = half.clone();
    data.extend_from_slice(&half);
    let mut tar = header("f", 0o644, data.len(), b'0').to_vec();
    tar.extend_from_slice(&data);
    pad(&mut tar);
    tar.extend_from_slice(&[0u8; 1024]);
    let dir = tempfile::tempdir()?;
    for level in [3, 13] {
        for pcluster in [65_536u32, 131_072] {
            for bs in [1024u32, 4096] {
                let spec = ferofs_compress::CompressorSpec::parse(&format!("zstd,level={level}"))?;
                let opts = BuildOptions {
                    block_size: bs,
                    compression: Some(Compression {
                        algorithms: vec![spec],
                        pcluster_size: pcluster,
                        ztailpacking: true,
                        hints: Vec::new(),
                        max_extent: 0,
                        full_index: false,
                    }),
                    threads: 1,
                    ..Default::default()
                };
                let what = format!("zstd {level}, pcluster {pcluster}, block {bs}");
                let (out, back) = build_read_f(&tar, dir.path(), &opts, &what)?;
                // zstd needs an fsck.erofs newer than Debian 12's 1.5.
                ferofs_testkit::fsck_metabox(&out, &what);
                assert!(back == data, "{what}: contents differ");
            }
        }
    }
    Ok(())
}

/// `-E fragments=SIZE` above `-C`: the packed inode compresses into pclusters of SIZE,
/// so the image needs the big-pcluster index and config records, as a file whose
/// pclusters span blocks does. The superblock looked at `-C`, the hints and the metabox
/// only: the packed inode's index then said one block a pcluster, and its pclusters of
/// more than one block did not decompress (the kernel: "failed to decompress", EUCLEAN).
/// Found with lz4, `-C 4096`, `fragments=65536`, dedupe, no inline data
/// (fuzz/known-failures had the input).
#[test]
fn packed_pclusters_above_the_cluster_size_get_big_pcluster_records() -> Res {
    // Words from a small vocabulary: about 3:1 with LZ4, so a 64 KiB packed pcluster
    // holds many blocks.
    const WORDS: [&str; 8] = [
        "erofs", "packed", "inode", "fragment", "tail", "of", "a", "the",
    ];
    let mut data = Vec::new();
    let mut x = 7u64;
    while data.len() < 200_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        data.extend_from_slice(WORDS[(x >> 61) as usize].as_bytes());
        data.push(b' ');
    }
    let mut tar = header("f", 0o644, data.len(), b'0').to_vec();
    tar.extend_from_slice(&data);
    pad(&mut tar);
    tar.extend_from_slice(&[0u8; 1024]);
    let dir = tempfile::tempdir()?;
    let kernel = ferofs_testkit::kernel_available(
        "packed_pclusters_above_the_cluster_size_get_big_pcluster_records",
    );
    for alg in ["lz4", "lz4hc", "lzma", "zstd", "deflate"] {
        for fragments in [
            ferofs_builder::Fragments::All {
                pcluster_size: 65_536,
            },
            ferofs_builder::Fragments::Tails {
                pcluster_size: 65_536,
            },
        ] {
            let opts = BuildOptions {
                compression: Some(Compression {
                    algorithms: vec![ferofs_compress::CompressorSpec::parse(alg)?],
                    pcluster_size: 4096,
                    ztailpacking: false,
                    hints: Vec::new(),
                    max_extent: 0,
                    full_index: false,
                }),
                fragments,
                dedupe: true,
                inline_data: false,
                threads: 1,
                ..Default::default()
            };
            let what = format!("{alg}, {fragments:?}");
            let (out, back) = build_read_f(&tar, dir.path(), &opts, &what)?;
            assert!(back == data, "{what}: contents differ");
            if kernel {
                let m = ferofs_testkit::Mount::erofs(&out);
                let got = std::fs::read(m.path().join("f"))
                    .map_err(|e| format!("{what}: kernel read: {e}"))?;
                assert!(got == data, "{what}: kernel read differs");
            }
        }
    }
    Ok(())
}

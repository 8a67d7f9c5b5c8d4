//! Seed corpora for the cargo-fuzz targets in `fuzz/`, from images our builder makes
//! (`cargo run --release -p ferofs --example fuzz_seeds -- OUT_DIR`): whole small images
//! of every layout (image_walk), their directory blocks (dir_block), their compressed
//! inodes' maps and pclusters in the zmap target's input format (zmap), their
//! pclusters with the extent length (decompress_*), and file contents (deflate_roundtrip).
//! scripts/fuzz-smoke runs it; the golden images are added there.

use ferofs_builder::{build_from_dir, BuildOptions, Compression, Fragments};
use ferofs_compress::CompressorSpec;
use ferofs_reader::{DataLayout, Image, Inode};
use std::path::{Path, PathBuf};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn tree(dir: &Path) -> Res<()> {
    std::fs::create_dir_all(dir.join("d/e"))?;
    let text: Vec<u8> = (0..30_000u32)
        .flat_map(|i| format!("line {} of the seed {}\n", i % 97, i % 13).into_bytes())
        .take(60_000)
        .collect();
    std::fs::write(dir.join("text"), &text)?;
    std::fs::write(dir.join("small"), &text[..700])?;
    std::fs::write(dir.join("d/tiny"), b"x")?;
    std::fs::write(dir.join("d/e/mid"), &text[..9000])?;
    std::fs::write(dir.join("d/dup"), &text[..9000])?;
    let noise: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("noise"), noise)?;
    for i in 0..40 {
        std::fs::write(
            dir.join("d").join(format!("f{i:02}-{}", "n".repeat(i))),
            [i as u8],
        )?;
    }
    std::os::unix::fs::symlink("d/e/mid", dir.join("link"))?;
    let _ = xattr::set(dir.join("small"), "user.seed", b"value");
    Ok(())
}

fn opts(
    bs: u32,
    alg: Option<&str>,
    pcluster: u32,
    tail: bool,
    frag: bool,
    mb: bool,
) -> Res<BuildOptions> {
    let compression = match alg {
        None => None,
        Some(a) => Some(Compression {
            algorithms: vec![CompressorSpec::parse(a)?],
            pcluster_size: pcluster,
            ztailpacking: tail,
            ..Compression::default()
        }),
    };
    Ok(BuildOptions {
        block_size: bs,
        timestamp: Some(1_700_000_000),
        threads: 1,
        compression,
        fragments: if frag {
            Fragments::Tails { pcluster_size: 0 }
        } else {
            Fragments::Off
        },
        dedupe: frag,
        metabox: mb,
        ..Default::default()
    })
}

fn put(dir: &Path, name: &str, data: &[u8]) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(name), data)?;
    Ok(())
}

fn main() -> Res<()> {
    let out = PathBuf::from(std::env::args().nth(1).ok_or("usage: fuzz_seeds OUT_DIR")?);
    let work = tempfile::tempdir()?;
    let src = work.path().join("src");
    tree(&src)?;
    let layouts: Vec<(&str, BuildOptions)> = vec![
        ("none-b512", opts(512, None, 0, false, false, false)?),
        ("none-b4096", opts(4096, None, 0, false, false, false)?),
        (
            "lz4-b512",
            opts(512, Some("lz4"), 512, false, false, false)?,
        ),
        (
            "lz4hc-b1024-C4k-tail",
            opts(1024, Some("lz4hc"), 4096, true, false, false)?,
        ),
        (
            "lzma-b512-C8k",
            opts(512, Some("lzma"), 8192, false, false, false)?,
        ),
        (
            "deflate-b512",
            opts(512, Some("deflate"), 1024, true, false, false)?,
        ),
        (
            "zstd-b1024-C16k",
            opts(1024, Some("zstd"), 16384, false, false, false)?,
        ),
        (
            "lz4hc-b512-frag",
            opts(512, Some("lz4hc"), 2048, true, true, false)?,
        ),
        (
            "lz4hc-b512-metabox",
            opts(512, Some("lz4hc"), 512, false, false, true)?,
        ),
        (
            "lz4-b4096",
            opts(4096, Some("lz4"), 4096, false, false, false)?,
        ),
        // The 48-bit layout: compact inodes with mtimes, no "." dirents, encoded
        // extents (16 lclusters a pcluster: records are shorter than the index).
        ("lz4hc-b512-C8k-48bit", {
            let mut o = opts(512, Some("lz4hc"), 8192, false, true, false)?;
            o.layout48 = true;
            o.dot_omitted = true;
            o
        }),
    ];
    let mut n = [0usize; 5];
    for (name, o) in layouts {
        let p = work.path().join(format!("{name}.erofs"));
        build_from_dir(&src, &p, &o)?;
        let bytes = std::fs::read(&p)?;
        put(&out.join("image_walk"), name, &bytes)?;
        n[0] += 1;
        let img = Image::new(bytes.clone())?;
        let bs = u64::from(img.block_size());
        let mut inodes: Vec<Inode> = Vec::new();
        img.walk(|_, ino| {
            inodes.push(ino.clone());
            Ok(())
        })?;
        for (k, ino) in inodes.iter().enumerate() {
            if ino.is_dir() {
                let mut blk = vec![0u8; bs as usize];
                let mut off = 0;
                while off < ino.size {
                    let got = img.read_at(ino, off, &mut blk)?;
                    put(
                        &out.join("dir_block"),
                        &format!("{name}-{k}-{off}"),
                        &blk[..got],
                    )?;
                    n[1] += 1;
                    off += got as u64;
                }
            }
            if !ino.is_regular() || !ino.layout.is_compressed() || ino.nid >> 63 != 0 {
                continue;
            }
            // zmap: flags, size, index length, index bytes, pclusters from byte 8192.
            let bits = bs.trailing_zeros() as u8 - 9;
            let mut z = vec![
                (bits << 6)
                    | u8::from(ino.extended)
                    | if ino.layout == DataLayout::CompressedCompact {
                        2
                    } else {
                        0
                    },
            ];
            z.extend_from_slice(&(ino.size as u32).to_le_bytes());
            let sb = img.superblock();
            let ipos = u64::from(sb.meta_blkaddr) * bs + ino.nid * 32;
            let core = if ino.extended { 64 } else { 32 };
            let from = (ipos + core) as usize;
            let idx = bytes
                .get(from..(from + 1024).min(bytes.len()))
                .unwrap_or(&[]);
            z.extend_from_slice(&(idx.len() as u16).to_le_bytes());
            z.extend_from_slice(idx);
            z.extend_from_slice(
                bytes
                    .get(8192..(8192 + (256 << 10)).min(bytes.len()))
                    .unwrap_or(&[]),
            );
            put(&out.join("zmap"), &format!("{name}-{k}"), &z)?;
            n[2] += 1;
            // decompress_*: each stored pcluster with its extent length.
            for e in img.extents(ino)? {
                let (Some(at), alg) = (e.physical, e.kind.as_str()) else {
                    continue;
                };
                let target = match alg {
                    "lz4" => "decompress_lz4",
                    "lzma" => "decompress_lzma",
                    "deflate" => "decompress_deflate",
                    "zstd" => "decompress_zstd",
                    _ => continue,
                };
                let raw = &bytes[at as usize..(at + e.stored) as usize];
                let z0 = raw.iter().position(|&b| b != 0).unwrap_or(raw.len());
                let mut d = (e.length as u32).to_le_bytes()[..3].to_vec();
                d.push(0);
                d.extend_from_slice(&img.compr_configs().lzma_dict_size().to_le_bytes());
                d.extend_from_slice(&raw[z0..]);
                put(&out.join(target), &format!("{name}-{k}-{}", e.logical), &d)?;
                n[3] += 1;
            }
        }
    }
    for f in ["text", "small", "noise", "d/e/mid"] {
        let data = std::fs::read(src.join(f))?;
        for (lvl, cap) in [(1u8, 4096u16), (6, 1000), (9, 20000)] {
            let mut d = vec![lvl - 1];
            d.extend_from_slice(&cap.to_le_bytes());
            d.extend_from_slice(&data);
            put(
                &out.join("deflate_roundtrip"),
                &format!("{}-{lvl}", f.replace('/', "_")),
                &d,
            )?;
            n[4] += 1;
        }
    }
    eprintln!(
        "fuzz_seeds: {} images, {} directory blocks, {} zmap inputs, {} pclusters, {} deflate inputs in {}",
        n[0], n[1], n[2], n[3], n[4], out.display()
    );
    Ok(())
}

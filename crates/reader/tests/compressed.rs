//! Random access into compressed files equals the kernel's bytes; corrupt compressed
//! metadata gives errors, never panics; the cache stays within its budget.

use ferofs_reader::Image;
use ferofs_testkit::{golden, kernel_available, Mount};
use std::os::unix::fs::FileExt;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_access_matches_kernel() {
    if !kernel_available("random_access_matches_kernel") {
        return;
    }
    for name in [
        "lz4hc-C64k",
        "zstd-C64k-tpfd",
        "lzma",
        "deflate-C64k",
        "lz4hc-48bit-C64k",
        "lz4hc-all-fragments",
    ] {
        let path = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
        let img = Image::open(&path).expect("open");
        img.set_cache_budget(1 << 20);
        let m = Mount::erofs(&path);
        let mut r = Rng(0xC0FFEE);
        for file in [
            "data/compressible-3MiB.txt",
            "data/mixed-5MiB.bin",
            "data/random-2MiB.bin",
            "dedupe/doubled.bin",
            "dedupe/copy-b.bin",
        ] {
            let ino = img.lookup(format!("/{file}").as_bytes()).expect("lookup");
            let f = std::fs::File::open(m.path().join(file)).expect("open");
            for _ in 0..200 {
                let off = r.next() % ino.size;
                let len = (r.next() % 200_000) as usize;
                let mut a = vec![0u8; len];
                let mut b = vec![0u8; len];
                let n = img.read_at(&ino, off, &mut a).expect("read");
                let want = len.min((ino.size - off) as usize);
                assert_eq!(n, want);
                f.read_exact_at(&mut b[..want], off).expect("kernel read");
                assert!(a[..n] == b[..n], "{name} {file} @{off}+{len} differs");
            }
            assert!(
                img.cache_used() <= 1 << 20,
                "cache over budget: {}",
                img.cache_used()
            );
        }
    }
}

#[test]
fn corrupt_compressed_metadata_never_panics() {
    for name in ["lz4hc-C64k-tpfd", "lzma-C64k", "lz4hc-48bit-C64k"] {
        let base =
            std::fs::read(golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"))).expect("read");
        let good = Image::new(base.clone()).expect("open");
        // Locations of compressed inodes' index areas.
        let mut spots = Vec::new();
        good.walk(|_, ino| {
            if ino.layout.is_compressed() && !ino.is_dir() && spots.len() < 200 {
                spots.push((
                    ino.nid * 32 + u64::from(good.superblock().meta_blkaddr) * 4096 + ino.meta_size,
                    ino.nid,
                ));
            }
            Ok(())
        })
        .expect("walk");
        let mut r = Rng(99);
        for i in 0..120 {
            let mut img = base.clone();
            let (pos, _) = spots[i % spots.len()];
            for _ in 0..4 {
                let at = (pos + r.next() % 64) as usize;
                if at < img.len() {
                    img[at] ^= (r.next() as u8) | 1;
                }
            }
            let Ok(im) = Image::new(img) else { continue };
            let mut buf = vec![0u8; 70_000];
            let _ = im.walk(|_, ino| {
                if ino.is_regular() && ino.layout.is_compressed() {
                    let _ = im.read_at(ino, 0, &mut buf);
                    let _ = im.read_at(ino, ino.size / 2, &mut buf);
                    let _ = im.extents(ino);
                }
                Ok(())
            });
        }
        // Corrupt pcluster bytes themselves: Decompress or BadPcluster errors.
        let mut img = base.clone();
        let ino = good.lookup(b"/data/compressible-3MiB.txt").expect("lookup");
        let ext = good.extents(&ino).expect("extents");
        for e in ext.iter().take(50) {
            if let Some(p) = e.physical {
                for k in 0..e.stored.min(64) {
                    img[(p + e.stored - 1 - k) as usize] ^= 0x5A;
                }
            }
        }
        let im = Image::new(img).expect("open");
        let ino = im.lookup(b"/data/compressible-3MiB.txt").expect("lookup");
        let mut buf = vec![0u8; ino.size as usize];
        match im.read_at(&ino, 0, &mut buf) {
            Err(e) => assert!(e.corrupt_kind().is_some(), "{name}: {e}"),
            Ok(_) => {
                let mut good_buf = vec![0u8; ino.size as usize];
                good.read_at(
                    &good.lookup(b"/data/compressible-3MiB.txt").expect("lookup"),
                    0,
                    &mut good_buf,
                )
                .expect("read");
                assert!(
                    buf != good_buf,
                    "{name}: corrupted pclusters read back unchanged"
                );
            }
        }
    }
}

/// A small read decodes only a prefix of a big pcluster (partial decode), and reads
/// further in extend it; the bytes always equal the kernel's.
#[test]
fn small_reads_decode_only_a_prefix() {
    if !kernel_available("small_reads_decode_only_a_prefix") {
        return;
    }
    for name in ["lz4hc-C64k", "lzma-C64k", "deflate-C64k", "zstd-C64k"] {
        let path = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
        let img = Image::open(&path).expect("open");
        let m = Mount::erofs(&path);
        let file = "data/compressible-3MiB.txt";
        let ino = img.lookup(format!("/{file}").as_bytes()).expect("lookup");
        let want = std::fs::read(m.path().join(file)).expect("kernel read");
        let mut a = vec![0u8; 100];
        assert_eq!(img.read_at(&ino, 0, &mut a).expect("read"), 100);
        assert_eq!(a[..], want[..100], "{name}");
        // The first extent decodes to far more than 64 KiB; only 64 KiB was decoded.
        assert_eq!(
            img.cache_used(),
            64 << 10,
            "{name}: decoded more than needed"
        );
        assert_eq!(img.read_at(&ino, 70_000, &mut a).expect("read"), 100);
        assert_eq!(a[..], want[70_000..70_100], "{name}");
        assert!(img.cache_used() > 64 << 10, "{name}: prefix not extended");
        let mut all = vec![0u8; want.len()];
        assert_eq!(img.read_at(&ino, 0, &mut all).expect("read"), want.len());
        assert!(all == want, "{name}: whole file differs");
    }
}

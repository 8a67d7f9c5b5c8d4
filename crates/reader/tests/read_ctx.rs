//! Whole-file reads through a caller-owned `ReadCtx` (the extract path) give exactly the
//! kernel's bytes for every layout of the golden images, never touch the shared cache,
//! and stay correct when one context is reused across files, images and read sizes.

use ferofs_reader::{Image, ReadCtx};
use ferofs_testkit::{golden, kernel_available, Mount};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Every regular file of `img`, read whole with `ctx` in chunks of `chunk` bytes,
/// compared with the same file under `root` (the kernel's mount of the image).
fn compare_all(img: &Image, ctx: &mut ReadCtx, root: &Path, chunk: usize, name: &str) -> usize {
    let mut files = Vec::new();
    img.walk(|p, ino| {
        if ino.is_regular() {
            files.push((p.to_vec(), ino.clone()));
        }
        Ok(())
    })
    .expect("walk");
    let mut buf = vec![0u8; chunk];
    for (p, ino) in &files {
        let rel = String::from_utf8_lossy(&p[1..]);
        let want = std::fs::read(root.join(OsStr::from_bytes(&p[1..]))).expect("kernel read");
        let mut got = Vec::with_capacity(want.len());
        let mut off = 0u64;
        while off < ino.size {
            let n = img
                .read_at_with(ctx, ino, off, &mut buf)
                .unwrap_or_else(|e| panic!("{name} {rel} @{off}: {e}"));
            assert!(n > 0, "{name} {rel}: short read at {off}");
            got.extend_from_slice(&buf[..n]);
            off += n as u64;
        }
        assert!(got == want, "{name} {rel}: bytes differ (chunk {chunk})");
    }
    files.len()
}

#[test]
fn ctx_reads_equal_kernel_and_skip_the_cache() {
    if !kernel_available("ctx_reads_equal_kernel_and_skip_the_cache") {
        return;
    }
    // One context for all images and chunk sizes: whatever it holds is keyed by image.
    let mut ctx = ReadCtx::new();
    for (name, chunk) in [
        ("lz4hc", 1 << 20),
        ("lz4hc-C64k", 100_003),
        ("lz4hc-C64k-tpfd", 1 << 20),
        ("lz4hc-48bit-C64k", 4096),
        ("lz4hc-all-fragments", 1 << 20),
        ("lz4hc-metabox", 1 << 20),
        ("lz4hc-lzma", 65_537),
        ("lzma-C64k", 1 << 20),
        ("zstd-C64k-tpfd", 1 << 20),
        ("deflate", 12_345),
        ("lz4-C64k", 1 << 20),
        ("plain-chunk64k-indexes", 1 << 20),
        ("plain", 3000),
    ] {
        let path = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
        let img = Image::open(&path).expect("open");
        let m = Mount::erofs(&path);
        let n = compare_all(&img, &mut ctx, m.path(), chunk, name);
        assert!(n > 2000, "{name}: only {n} files");
        // Whole extents go straight into the caller's buffer, the rest stays in the
        // context: the shared cache is untouched (the packed and metabox inodes, read
        // in part, are the exception: they go through it).
        if !name.contains("fragments") && !name.contains("metabox") && !name.contains("tpfd") {
            assert_eq!(img.cache_used(), 0, "{name}: shared cache used");
        }
    }
}

/// Two images open at once, read alternately with one context: nothing leaks from one
/// to the other (same nids, different bytes).
#[test]
fn one_ctx_two_images() {
    let a = Image::open(golden("erofs-utils-1.9.3/lz4hc-C64k.erofs.zst")).expect("open");
    let b = Image::open(golden("erofs-utils-1.9.3/zstd-C64k.erofs.zst")).expect("open");
    let file = b"/data/compressible-3MiB.txt";
    let (ia, ib) = (a.lookup(file).expect("a"), b.lookup(file).expect("b"));
    let wa = a.read_to_vec(&ia).expect("read a");
    let wb = b.read_to_vec(&ib).expect("read b");
    assert_eq!(wa, wb, "same file in both images");
    let mut ctx = ReadCtx::new();
    let mut buf = vec![0u8; 70_001];
    let mut off = 0u64;
    while off < ia.size {
        for (img, ino, want) in [(&a, &ia, &wa), (&b, &ib, &wb)] {
            let n = img
                .read_at_with(&mut ctx, ino, off, &mut buf)
                .expect("read");
            let o = off as usize;
            assert_eq!(buf[..n], want[o..o + n], "at {off}");
        }
        off += buf.len() as u64;
    }
    // And the extract pattern on a file whose extents straddle every chunk boundary.
    let other = a.lookup(b"/data/mixed-5MiB.bin").expect("lookup");
    let whole = a.read_to_vec(&other).expect("read");
    let mut got = Vec::new();
    let mut off = 0u64;
    while off < other.size {
        let n = a
            .read_at_with(&mut ctx, &other, off, &mut buf[..4097])
            .expect("read");
        got.extend_from_slice(&buf[..n]);
        off += n as u64;
    }
    assert!(got == whole);
}

/// `hole_end` reports the holes of the mapping (chunk-based sparse files), not data.
#[test]
fn hole_end_follows_the_mapping() {
    let img = Image::open(golden("erofs-utils-1.9.3/plain-chunk64k.erofs.zst")).expect("open");
    let ino = img.lookup(b"/data/sparse-100MiB.img").expect("lookup");
    let mut ctx = ReadCtx::new();
    // make-tree: data at 0 (4 KiB), 1 MiB + 100 (10000 bytes), 33 MiB (128 KiB),
    // 77 MiB - 2048 (4 KiB) and the last 1000 bytes; 64 KiB chunks.
    assert_eq!(img.hole_end(&mut ctx, &ino, 0).expect("map"), None);
    assert_eq!(
        img.hole_end(&mut ctx, &ino, 64 << 10).expect("map"),
        Some(1 << 20)
    );
    assert_eq!(
        img.hole_end(&mut ctx, &ino, (1 << 20) + 5).expect("map"),
        None
    );
    assert_eq!(
        img.hole_end(&mut ctx, &ino, 2 << 20).expect("map"),
        Some(33 << 20)
    );
    assert_eq!(
        img.hole_end(&mut ctx, &ino, ino.size).expect("map"),
        None,
        "past the end"
    );
    let only = img.lookup(b"/data/sparse-hole-only.img").expect("lookup");
    assert_eq!(
        img.hole_end(&mut ctx, &only, 0).expect("map"),
        Some(only.size)
    );
    // A compressed image stores the zeros as data: no holes.
    let z = Image::open(golden("erofs-utils-1.9.3/lz4hc.erofs.zst")).expect("open");
    let zi = z.lookup(b"/data/sparse-100MiB.img").expect("lookup");
    assert_eq!(z.hole_end(&mut ctx, &zi, 2 << 20).expect("map"), None);
}

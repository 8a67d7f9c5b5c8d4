//! Limits that protect callers from hostile images, each on a crafted minimal image.

mod common;

use common::*;
use ferofs_reader::dir::MAX_DEPTH;
use ferofs_reader::{CorruptKind, Image};

fn walk_count(img: &Image<Vec<u8>>) -> Result<usize, ferofs_reader::Error> {
    let mut n = 0;
    img.walk(|_, _| {
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

/// A tree as deep as the limit allows walks on a thread with a small stack: the walk
/// keeps its own stack on the heap.
#[test]
fn deepest_allowed_tree_walks_on_a_small_stack() {
    let img = Image::new(deep_chain(MAX_DEPTH - 1)).expect("open");
    let n = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || walk_count(&img))
        .expect("spawn")
        .join()
        .expect("walk thread")
        .expect("walk");
    // root, MAX_DEPTH - 1 directories below it, the leaf
    assert_eq!(n, MAX_DEPTH + 1);
}

#[test]
fn deeper_than_the_limit_is_too_deep() {
    let img = Image::new(deep_chain(MAX_DEPTH + 5)).expect("open");
    let e = walk_count(&img).expect_err("walk of a too deep tree");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::TooDeep), "{e}");
    let mut path = b"/a".repeat(MAX_DEPTH + 5);
    path.extend_from_slice(b"/leaf");
    let e = img.lookup(&path).expect_err("lookup too deep");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::TooDeep), "{e}");
}

/// Names longer than any dirent can hold are not found, without reading a block.
#[test]
fn overlong_names_are_not_found() {
    let img = Image::new(deep_chain(1)).expect("open");
    let long = vec![b'a'; 256];
    let mut path = b"/".to_vec();
    path.extend_from_slice(&long);
    match img.lookup(&path) {
        Err(ferofs_reader::Error::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    let root = img.inode(img.root_nid()).expect("root");
    assert_eq!(img.lookup_child(&root, &long).expect("lookup_child"), None);
    assert_eq!(img.lookup_child(&root, b"").expect("lookup_child"), None);
    assert!(img
        .lookup_child(&root, b"a")
        .expect("lookup_child")
        .is_some());
}

/// A symlink claiming a target longer than PATH_MAX is refused before it is read.
#[test]
fn symlink_target_longer_than_path_max() {
    let nodes = vec![
        Node::Dir(vec![
            (b".".to_vec(), 0),
            (b"..".to_vec(), 0),
            (b"l".to_vec(), 1),
        ]),
        Node::Symlink(b"target".to_vec()),
    ];
    let mut img = image(&nodes, 0);
    let nid = nid_of(&img, b"/l");
    let at = BS + nid as usize * 32 + 8; // compact i_size
    img[at..at + 4].copy_from_slice(&4097u32.to_le_bytes());
    let im = Image::new(img).expect("open");
    let l = im.lookup(b"/l").expect("lookup");
    let e = im.read_link(&l).expect_err("overlong target");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::BadInodeSize), "{e}");
}

/// Counts the bytes read through it.
struct Counting(Vec<u8>, std::sync::atomic::AtomicU64);

impl ferofs_reader::Source for Counting {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.1
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.0.as_slice().read_exact_at(buf, offset)
    }
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.0.len() as u64)
    }
}

impl Counting {
    fn reads(&self) -> u64 {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// An image whose file `/z` (`size` bytes, lz4, 4 KiB lclusters, map header advise
/// `advise`) has `n` full indexes: lcluster 0 a HEAD1 at block 0x100, every later one
/// a NONHEAD with delta[0] = 1, as read through a [`Counting`] source.
fn one_lcluster_hops(n: usize, advise: u16, size: u64) -> std::sync::Arc<Counting> {
    let mut meta = vec![0u8; full_index_at(n)];
    meta[4..6].copy_from_slice(&advise.to_le_bytes());
    let i0 = full_index_at(0);
    meta[i0..i0 + 8].copy_from_slice(&[1, 0, 0, 0, 0, 1, 0, 0]);
    for i in 1..n {
        let o = full_index_at(i);
        meta[o..o + 8].copy_from_slice(&[2, 0, 0, 0, 1, 0, 1, 0]);
    }
    let nodes = vec![
        Node::Dir(vec![
            (b".".to_vec(), 0),
            (b"..".to_vec(), 0),
            (b"z".to_vec(), 1),
        ]),
        Node::Compressed { size, meta },
    ];
    std::sync::Arc::new(Counting(image(&nodes, 0), 0.into()))
}

/// A compressed file (4 KiB lclusters) of 2^40 bytes whose indexes after the first are
/// all NONHEAD with delta[0] = 1: reading at 16 MiB must not walk back 4096 lclusters
/// to the head, nor forward through the whole index to the next one. Both stop at
/// the largest extent (12 MiB): BadLcluster, after reading a few windows of index.
#[test]
fn index_lookback_and_lookahead_stop_at_the_largest_extent() {
    // 40,000 indexes present in the image (the rest lie beyond its end).
    let src = one_lcluster_hops(40_000, 0, 1 << 40);
    let img = Image::new(src.clone()).expect("open");
    let z = img.lookup(b"/z").expect("lookup");
    let before = src.reads();
    let mut buf = [0u8; 100];
    // 16 MiB in: the head is 4096 lclusters back.
    let e = img.read_at(&z, 16 << 20, &mut buf).expect_err("lookback");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::BadLcluster), "{e}");
    // 8 MiB in: the head (lcluster 0) is found, the end is never.
    let e = img.read_at(&z, 8 << 20, &mut buf).expect_err("lookahead");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::BadLcluster), "{e}");
    let read = src.reads() - before;
    // 12 MiB of 4 KiB lclusters is 3072 indexes (24 KiB) each way.
    assert!(read < 256 << 10, "{read} bytes of index read");
}

/// A file with a fragment tail (its last extent lives in the packed inode) may look
/// back further than 12 MiB to that tail's head, but writers reach back thousands of
/// lclusters a hop: an index of one-lcluster hops is refused after a few, without
/// walking the file's 40,000 indexes.
#[test]
fn fragment_tail_lookback_in_short_hops_is_refused() {
    // Map header: fragment offset 0, advise FRAGMENT_PCLUSTER.
    let n = 40_000;
    let src = one_lcluster_hops(n, 0x20, n as u64 * 4096);
    let img = Image::new(src.clone()).expect("open");
    let z = img.lookup(b"/z").expect("lookup");
    let before = src.reads();
    let mut buf = [0u8; 100];
    let e = img.read_at(&z, 0, &mut buf).expect_err("short hops");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::BadLcluster), "{e}");
    assert!(e.to_string().contains("short hops"), "{e}");
    let read = src.reads() - before;
    assert!(read < 64 << 10, "{read} bytes of index read");
}

/// A file mapped by 4-byte extent records (48-bit layout), each a hole: a record's
/// physical start is the sum of the lengths before it, and walking the file forward
/// must continue that sum, not restart it for every lcluster (which made a forward
/// walk quadratic: 8 * 10^8 record reads for these 40,000 lclusters).
#[test]
fn four_byte_extent_records_are_summed_once_per_walk() {
    let n = 40_000usize;
    let mut meta = vec![0u8; 16 + 4 * n];
    // Map header: advise = EXTENTS with 4-byte records, 4 KiB lclusters.
    meta[4..6].copy_from_slice(&1u16.to_le_bytes());
    // meta[8..16]: physical base 0; every record: length 0 (a hole).
    let nodes = vec![
        Node::Dir(vec![
            (b".".to_vec(), 0),
            (b"..".to_vec(), 0),
            (b"h".to_vec(), 1),
        ]),
        Node::Compressed {
            size: n as u64 * 4096,
            meta,
        },
    ];
    let img = Image::new(image(&nodes, 0)).expect("open");
    let h = img.lookup(b"/h").expect("lookup");
    let mut ctx = ferofs_reader::ReadCtx::new();
    let t = std::time::Instant::now();
    let end = img.hole_end(&mut ctx, &h, 0).expect("hole_end");
    assert_eq!(end, Some(n as u64 * 4096));
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < h.size {
        let got = img.read_at_with(&mut ctx, &h, off, &mut buf).expect("read");
        assert!(buf[..got].iter().all(|&b| b == 0));
        off += got as u64;
    }
    let took = t.elapsed();
    assert!(took.as_secs() < 5, "forward walk took {took:?}");
}

//! Count the blocks holding inode records (inode + xattrs + inline data / index) and
//! their total bytes: how well an image packs its metadata.
//! usage: cargo run --release --example meta_blocks IMAGE
use ferofs_format::inode::DataLayout;
use ferofs_reader::Image;
use std::collections::BTreeSet;

fn main() {
    let path = std::env::args().nth(1).expect("usage: meta_blocks IMAGE");
    let img = Image::open(&path).expect("open");
    let base = img.superblock().meta_blkaddr as u64 * img.block_size() as u64;
    let bs = img.block_size() as u64;
    let mut blocks = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut bytes = 0u64;
    img.walk(|_, ino| {
        if seen.insert(ino.nid) {
            let start = base + ino.nid * 32;
            // Inline data, or an estimate of a compact index (8-byte header, 2 bytes an
            // lcluster; ignores the 4-byte packs).
            let extra = match ino.layout {
                DataLayout::FlatInline => ino.size % bs,
                DataLayout::CompressedCompact | DataLayout::CompressedFull => {
                    8 + 2 * ino.size.div_ceil(bs)
                }
                _ => 0,
            };
            let end = start + ino.meta_size + extra;
            bytes += ino.meta_size + extra;
            for b in start / bs..end.div_ceil(bs) {
                blocks.insert(b);
            }
        }
        Ok(())
    })
    .expect("walk");
    println!(
        "{} records, {bytes} bytes, {} blocks, fill {:.4}",
        seen.len(),
        blocks.len(),
        bytes as f64 / (blocks.len() as u64 * bs) as f64
    );
}

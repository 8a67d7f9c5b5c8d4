//! Corrupt images: each defect gets its own error kind, never a panic.

use ferofs_reader::{CorruptKind, Error, Image};
use ferofs_testkit::golden;

fn plain() -> Vec<u8> {
    std::fs::read(golden("erofs-utils-1.9.3/plain.erofs.zst")).expect("read golden")
}

/// Recompute the superblock checksum after editing block 0.
fn fix_checksum(img: &mut [u8]) {
    let blksz = 1usize << img[1024 + 0x0C];
    let n = ferofs_format::sb::checksum_len(blksz as u32);
    let c = ferofs_format::sb::compute_checksum(&img[1024..1024 + n]);
    img[1028..1032].copy_from_slice(&c.to_le_bytes());
}

fn kind(r: Result<impl Sized, Error>) -> Option<CorruptKind> {
    match r {
        Err(e) => e.corrupt_kind(),
        Ok(_) => None,
    }
}

#[test]
fn truncated() {
    let img = plain();
    assert_eq!(
        kind(Image::new(img[..1100].to_vec())),
        Some(CorruptKind::Truncated)
    );
    assert_eq!(kind(Image::new(Vec::new())), Some(CorruptKind::Truncated));
    // Cut after block 0: the superblock is fine, reading files fails with Truncated.
    let cut = Image::new(img[..8192].to_vec()).expect("superblock still valid");
    let mut any_truncated = false;
    let r = cut.walk(|_, ino| {
        if ino.is_regular() {
            let mut b = vec![0u8; 4096];
            if let Err(e) = cut.read_at(ino, 0, &mut b) {
                any_truncated |= matches!(
                    e.corrupt_kind(),
                    Some(CorruptKind::Truncated)
                        | Some(CorruptKind::BadBlockAddress)
                        | Some(CorruptKind::NidOutOfRange)
                );
            }
        }
        Ok(())
    });
    assert!(
        r.is_err() || any_truncated,
        "a truncated image must report errors"
    );
}

#[test]
fn wrong_magic() {
    let mut img = plain();
    img[1024] ^= 0xFF;
    assert_eq!(kind(Image::new(img)), Some(CorruptKind::BadMagic));
}

#[test]
fn bad_checksum() {
    let mut img = plain();
    img[1024 + 0x40] ^= 1; // label byte
    match Image::new(img) {
        Err(Error::Corrupt(c)) => {
            assert_eq!(c.kind, CorruptKind::BadChecksum);
            assert_eq!(c.offset, Some(1028));
        }
        other => panic!("expected BadChecksum, got {:?}", other.err()),
    }
}

#[test]
fn unknown_incompat_is_unsupported() {
    let mut img = plain();
    img[1024 + 0x50 + 1] |= 0x40; // incompat bit 0x4000
    fix_checksum(&mut img);
    match Image::new(img) {
        Err(e) => assert!(e.is_unsupported(), "got {e}"),
        Ok(_) => panic!("unknown incompat bit accepted"),
    }
}

#[test]
fn nid_past_the_end() {
    let img = Image::new(plain()).expect("open");
    let far = img.superblock().blocks_lo as u64 * 4096 / 32 + 10;
    match img.inode(far) {
        Err(Error::Corrupt(c)) => {
            assert_eq!(c.kind, CorruptKind::NidOutOfRange);
            assert_eq!(c.nid, Some(far));
        }
        other => panic!("expected NidOutOfRange, got {other:?}"),
    }
}

/// Find the byte offset of the root directory's inline dirents in plain.erofs.
fn root_dirents(img: &[u8]) -> usize {
    let im = Image::new(img.to_vec()).expect("open");
    let root = im.inode(im.root_nid()).expect("root");
    assert_eq!(root.layout, ferofs_reader::DataLayout::FlatInline);
    assert!(root.size < 4096);
    (im.root_nid() * 32 + root.meta_size) as usize
}

#[test]
fn nameoff_out_of_range() {
    let mut img = plain();
    let d = root_dirents(&img);
    // Second dirent's nameoff beyond the block.
    img[d + 12 + 8..d + 12 + 10].copy_from_slice(&5000u16.to_le_bytes());
    fix_checksum(&mut img);
    let im = Image::new(img).expect("open");
    let root = im.inode(im.root_nid()).expect("root");
    assert_eq!(kind(im.read_dir(&root)), Some(CorruptKind::BadNameoff));
}

#[test]
fn directory_loop() {
    let mut img = plain();
    let im0 = Image::new(img.clone()).expect("open");
    let root = im0.inode(im0.root_nid()).expect("root");
    let ents = im0.read_dir(&root).expect("readdir");
    // Point the "deep" subdirectory's dirent at the root: root contains itself.
    let idx = ents.iter().position(|e| e.name == b"deep").expect("deep");
    let d = root_dirents(&img) + idx * 12;
    img[d..d + 8].copy_from_slice(&im0.root_nid().to_le_bytes());
    fix_checksum(&mut img);
    let im = Image::new(img).expect("open");
    assert_eq!(
        kind(im.walk(|_, _| Ok(()))),
        Some(CorruptKind::DirectoryLoop)
    );
}

#[test]
fn random_corruption_never_panics() {
    // Flip bytes in the metadata area (block 0 onward) and walk everything.
    let base = plain();
    let meta_end = 64 * 4096; // plenty of inodes and directories
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..300 {
        let mut img = base.clone();
        for _ in 0..8 {
            let at = 1024 + (next() as usize) % (meta_end - 1024);
            img[at] ^= (next() as u8) | 1;
        }
        fix_checksum(&mut img);
        let Ok(im) = Image::new(img) else { continue };
        let mut buf = vec![0u8; 65536];
        let _ = im.walk(|_, ino| {
            let _ = im.xattrs(ino);
            if ino.is_regular() {
                let _ = im.read_at(ino, 0, &mut buf);
                let _ = im.read_at(ino, ino.size.saturating_sub(10), &mut buf);
            } else if ino.is_symlink() {
                let _ = im.read_link(ino);
            }
            Ok(())
        });
    }
}

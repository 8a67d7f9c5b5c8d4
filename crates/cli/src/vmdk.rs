//! `build --vmdk-desc FILE` (mkfs.erofs's `--vmdk-desc`): a VMDK descriptor that joins
//! the image and its extra devices (the `--blobdev` blob, the `--tar-index` tar) into
//! one virtual disk, in device-table order, which is the image's unified address space
//! (each device right behind the one before): a VM (QEMU, VMware) sees one disk that
//! mounts as the image with every device in place.
//!
//! The descriptor is text: a header (CID from the UUID, no parent, type
//! `twoGbMaxExtentFlat`), one `RW SECTORS FLAT "FILE" OFFSET` extent line per file and
//! per 2 GiB of it (sectors of 512 bytes), and the disk database (IDE geometry: 16
//! heads, 63 sectors a track).

use anyhow::{bail, Context, Result};
use std::path::Path;

/// Most sectors one extent line covers (2 GiB).
const EXTENT_MAX: u64 = 0x8000_0000 >> 9;

/// The descriptor for files `(name, sectors, first sector)` of the disk, in order, and
/// the image's UUID.
pub fn descriptor(uuid: &[u8; 16], files: &[(String, u64, u64)]) -> String {
    let cid = uuid
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .fold(0u32, |a, w| a ^ w);
    let mut s = format!(
        "# Disk DescriptorFile\nversion=1\nCID={cid:x}\nparentCID=ffffffff\n\
         createType=\"twoGbMaxExtentFlat\"\n\n# Extent description\n"
    );
    let mut total = 0u64;
    for (name, sectors, first) in files {
        let (mut left, mut at) = (*sectors, *first);
        // Bounded: each line takes up to EXTENT_MAX (> 0) sectors.
        while left > 0 {
            let n = left.min(EXTENT_MAX);
            s.push_str(&format!("RW {n} FLAT \"{name}\" {at}\n"));
            left -= n;
            at += n;
        }
        total += sectors;
    }
    s.push_str(&format!(
        "\n# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"4\"\n\
         ddb.geometry.cylinders = \"{}\"\nddb.geometry.heads = \"16\"\n\
         ddb.geometry.sectors = \"63\"\nddb.adapterType = \"ide\"\n",
        total.div_ceil(63 * 16)
    ));
    s
}

/// Write the descriptor for the image `image` (starting `offset` bytes into the
/// file, where the reader opens it: the global `--offset`), whose extra devices are
/// the files `devices` in device-table order, to `out` (through a temporary file and a
/// rename: a half-written descriptor never stays).
pub fn write(out: &Path, image: &Path, offset: u64, devices: &[String]) -> Result<()> {
    if !offset.is_multiple_of(512) {
        bail!("--vmdk-desc with --offset {offset}: a disk extent starts on a 512-byte sector");
    }
    let img = crate::list::open_with(image, false)?;
    let shift = img.block_size().trailing_zeros() - 9;
    let (_, blocks) = img.superblock().root_nid_and_blocks();
    let slots = img.device_slots();
    if slots.len() != devices.len() {
        bail!(
            "--vmdk-desc: the image has {} extra devices, {} files were given for them",
            slots.len(),
            devices.len()
        );
    }
    let files: Vec<(String, u64, u64)> =
        std::iter::once((image.display().to_string(), blocks << shift, offset / 512))
            .chain(
                devices
                    .iter()
                    .zip(slots)
                    .map(|(name, slot)| (name.clone(), slot.blocks() << shift, 0)),
            )
            .collect();
    let text = descriptor(&img.superblock().uuid, &files);
    ferofs_builder::outfile::write_all(out, text.as_bytes(), false)
        .with_context(|| format!("--vmdk-desc: writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_text() {
        let uuid: [u8; 16] = [1, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0x80];
        // 5 GiB of blob: three extents (2 + 2 + 1 GiB), offsets going on.
        let d = descriptor(
            &uuid,
            &[("img.erofs".into(), 8, 0), ("blob".into(), 5 << 21, 0)],
        );
        assert_eq!(
            d,
            "# Disk DescriptorFile\nversion=1\nCID=80000007\nparentCID=ffffffff\n\
             createType=\"twoGbMaxExtentFlat\"\n\n# Extent description\n\
             RW 8 FLAT \"img.erofs\" 0\n\
             RW 4194304 FLAT \"blob\" 0\n\
             RW 4194304 FLAT \"blob\" 4194304\n\
             RW 2097152 FLAT \"blob\" 8388608\n\
             \n# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"4\"\n\
             ddb.geometry.cylinders = \"10403\"\nddb.geometry.heads = \"16\"\n\
             ddb.geometry.sectors = \"63\"\nddb.adapterType = \"ide\"\n"
        );
    }
}

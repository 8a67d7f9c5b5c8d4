//! Block 0: the superblock, the compression config records behind it (doc §1.5), the
//! UUID and the checksum. The records' length is known from the options alone, so the
//! plan can place the data region behind them before anything is written.

use crate::options::*;
use crate::out::Out;
use ferofs_format::sb::*;

/// The compression config records and whether the image needs them: pclusters over
/// one block or any algorithm other than LZ4.
#[derive(Default)]
pub struct ComprCfg {
    pub needed: bool,
    /// Bit per on-disk algorithm id used.
    pub algs: u16,
    /// The records, each 4-byte aligned relative to the superblock.
    pub bytes: Vec<u8>,
    /// Bytes of the superblock they follow: 128, or 144 with the extension slot that
    /// holds `metabox_nid`.
    pub sb_size: usize,
    /// Extra devices (tar index mode, `--blobdev`, merged layers): a device table of
    /// one 128-byte slot each behind the records.
    pub devices: Vec<crate::scan::Device>,
    /// The long xattr name prefixes (`--xattr-prefix`, `--xattr-inode-digest`), in
    /// table order. Room for their table is kept behind the device table; it goes there
    /// (a plain table) unless the packed inode takes it
    /// ([`SbFields::prefixes_in_packed`]).
    pub prefixes: Vec<ferofs_format::xattr::LongPrefix>,
    /// The `--xattr-inode-digest` prefix's index in the table.
    pub ishare: Option<u8>,
}

impl ComprCfg {
    pub fn new(o: &BuildOptions, devices: &[crate::scan::Device]) -> Self {
        let mut c = Self::records(o);
        c.devices = devices.to_vec();
        (c.prefixes, c.ishare) = o.long_prefixes();
        c
    }

    fn records(o: &BuildOptions) -> Self {
        let sb_size = if o.metabox {
            SB_BASE_SIZE + 16
        } else {
            SB_BASE_SIZE
        };
        let Some(c) = &o.compression else {
            return ComprCfg {
                needed: false,
                algs: 0,
                sb_size,
                ..Default::default()
            };
        };
        // The packed inode compresses with its own pcluster size (`-E fragments=SIZE`):
        // above the block size it needs the big-pcluster index and config records (and
        // LZMA's and zstd's dictionaries are sized from it), as any file's.
        let max_pcl = std::iter::once(c.pcluster_size)
            .chain(c.hints.iter().map(|h| h.pcluster_size))
            .chain(o.metabox_pcluster())
            .chain(o.packed_pcluster())
            .max()
            .unwrap_or(o.block_size);
        let mut algs = 0u16;
        for a in &c.algorithms {
            algs |= 1 << a.encoder.algorithm().id();
        }
        let needed = max_pcl > o.block_size || algs != 1;
        let mut bytes = Vec::new();
        if needed {
            for id in 0..4u8 {
                if algs & (1 << id) == 0 {
                    continue;
                }
                let Some(alg) = ferofs_compress::Algorithm::from_id(id) else {
                    continue;
                };
                let dict = c
                    .algorithms
                    .iter()
                    .filter(|a| a.encoder.algorithm() == alg)
                    .map(|a| a.effective_dict(max_pcl))
                    .max()
                    .unwrap_or(0);
                let rec =
                    ferofs_compress::config_record(alg, dict, (max_pcl / o.block_size) as u16);
                while !(sb_size + bytes.len()).is_multiple_of(4) {
                    bytes.push(0);
                }
                bytes.extend_from_slice(&(rec.len() as u16).to_le_bytes());
                bytes.extend_from_slice(&rec);
            }
        }
        ComprCfg {
            needed,
            algs,
            bytes,
            sb_size,
            ..Default::default()
        }
    }

    /// The long-prefix table's bytes (empty without prefixes; their lengths were
    /// checked with the options, so every record fits).
    pub fn prefix_table(&self) -> Vec<u8> {
        ferofs_format::xattr::encode_prefix_table(&self.prefixes).unwrap_or_default()
    }

    /// First byte of the device table (128-byte slots, addressed in slots).
    pub fn devt_at(&self) -> u64 {
        let records_end = SB_OFFSET + self.sb_size as u64 + self.bytes.len() as u64;
        records_end.div_ceil(DEVICE_SLOT_SIZE as u64) * DEVICE_SLOT_SIZE as u64
    }

    /// First byte after the superblock, the records and the device table.
    fn tables_end(&self) -> u64 {
        if self.devices.is_empty() {
            return SB_OFFSET + self.sb_size as u64 + self.bytes.len() as u64;
        }
        self.devt_at() + (DEVICE_SLOT_SIZE * self.devices.len()) as u64
    }

    /// Where a plain long-prefix table goes (4-byte aligned, behind the device table).
    pub fn prefixes_at(&self) -> u64 {
        self.tables_end().div_ceil(4) * 4
    }

    /// First byte after the superblock, the records, the device table and the room
    /// for a plain long-prefix table.
    pub fn end(&self) -> u64 {
        if self.prefixes.is_empty() {
            return self.tables_end();
        }
        self.prefixes_at() + self.prefix_table().len() as u64
    }
}

/// What the superblock says about the image, gathered by the write stage.
#[derive(Clone)]
pub struct SbFields {
    pub blkszbits: u8,
    /// Bit 63 set (root in the metabox) needs `metabox_nid`.
    pub root_nid: u64,
    /// The metabox inode's nid (`-m`): the 48-bit layout, whose 64-bit root nid field
    /// can hold a metabox nid, and the extension slot.
    pub metabox_nid: Option<u64>,
    pub inos: u64,
    pub build_time: i64,
    /// Compact inodes' mtime base (the build time, except in the 48-bit layout).
    pub epoch: i64,
    /// The 48-bit layout (`-E 48bit`; a metabox implies it).
    pub layout48: bool,
    pub total_blocks: u64,
    pub meta_blkaddr: u64,
    pub xattr_blkaddr: u64,
    pub xattr_filter: bool,
    pub chunked: bool,
    pub compressed: bool,
    /// Some compressed file has its tail pcluster inline (ztailpacking).
    pub inline_pcluster: bool,
    /// The packed inode, when some file has a fragment.
    pub packed_nid: Option<u64>,
    /// Some pcluster is referenced by several extents (full indexes).
    pub shared_pclusters: bool,
    /// The long-prefix table's byte offset in the packed inode's data, when it is
    /// there; else it is plain, at [`ComprCfg::prefixes_at`].
    pub prefixes_in_packed: Option<u64>,
}

/// The superblock (UUID still zero) for `f`.
pub fn superblock(f: &SbFields, cfg: &ComprCfg, label: Option<&str>) -> Result<Superblock> {
    let mut feature_incompat = 0;
    if f.chunked {
        feature_incompat |= INCOMPAT_CHUNKED_FILE;
    }
    let mut u1 = 0u16;
    if f.compressed {
        feature_incompat |= INCOMPAT_ZERO_PADDING;
        if cfg.needed {
            feature_incompat |= INCOMPAT_COMPR_CFGS;
            u1 = cfg.algs;
        } else {
            u1 = 0xFFFF; // lz4_max_distance: the default 64 KiB window
        }
    }
    if f.inline_pcluster {
        feature_incompat |= INCOMPAT_ZTAILPACKING;
    }
    if f.packed_nid.is_some() {
        feature_incompat |= INCOMPAT_FRAGMENTS;
    }
    if f.shared_pclusters {
        feature_incompat |= INCOMPAT_DEDUPE;
    }
    // Without the 48-bit layout the root nid is the 16-bit field; with it, a non-zero
    // `rootnid_8b` is the root and the 16-bit field holds blocks_hi (0 here). Like
    // mkfs.erofs, the 64-bit field only when the root needs it.
    let layout48 = f.layout48 || f.metabox_nid.is_some();
    if layout48 {
        feature_incompat |= INCOMPAT_48BIT;
    }
    let (rootnid_2b, rootnid_8b, sb_extslots, metabox_nid) = match f.metabox_nid {
        Some(m) => {
            feature_incompat |= INCOMPAT_METABOX;
            (0, f.root_nid, 1, m)
        }
        None if layout48 && f.root_nid > u64::from(u16::MAX) => (0, f.root_nid, 0, 0),
        None => (
            u16::try_from(f.root_nid)
                .map_err(|_| BuildError::TooLarge("root nid does not fit 16 bits".into()))?,
            0,
            0,
            0,
        ),
    };
    if cfg.sb_size != SB_BASE_SIZE + 16 * usize::from(sb_extslots) {
        return Err(BuildError::Options(
            "internal: superblock size differs from the plan's".into(),
        ));
    }
    let (extra_devices, devt_slotoff) = if cfg.devices.is_empty() {
        (0, 0)
    } else {
        feature_incompat |= INCOMPAT_DEVICE_TABLE;
        (
            u16::try_from(cfg.devices.len())
                .map_err(|_| BuildError::TooLarge("too many devices".into()))?,
            u16::try_from(cfg.devt_at() / DEVICE_SLOT_SIZE as u64)
                .map_err(|_| BuildError::TooLarge("device table offset".into()))?,
        )
    };
    // Long xattr prefixes: in the packed inode (any kernel since 6.4 reads them there
    // when there is one) or plain (read there by 6.4+ when there is no packed inode,
    // and by every kernel that knows the plain flag).
    let (mut xattr_prefix_count, mut xattr_prefix_start, mut plain_pfx) = (0, 0, 0);
    if !cfg.prefixes.is_empty() {
        feature_incompat |= INCOMPAT_XATTR_PREFIXES;
        xattr_prefix_count = u8::try_from(cfg.prefixes.len())
            .map_err(|_| BuildError::Options("more than 255 xattr name prefixes".into()))?;
        let at = match f.prefixes_in_packed {
            Some(off) => off,
            None => {
                plain_pfx = COMPAT_PLAIN_XATTR_PFX;
                cfg.prefixes_at()
            }
        };
        if at % 4 != 0 {
            return Err(BuildError::Options(
                "internal: long prefix table not 4-byte aligned".into(),
            ));
        }
        xattr_prefix_start = u32::try_from(at / 4)
            .map_err(|_| BuildError::TooLarge("long prefix table beyond 16 GiB".into()))?;
    }
    let mut sb = Superblock {
        extra_devices,
        devt_slotoff,
        magic: MAGIC,
        feature_compat: COMPAT_SB_CHKSUM
            | COMPAT_MTIME
            | plain_pfx
            | if cfg.ishare.is_some() {
                COMPAT_ISHARE_XATTRS
            } else {
                0
            }
            | if f.xattr_filter {
                COMPAT_XATTR_FILTER
            } else {
                0
            },
        blkszbits: f.blkszbits,
        sb_extslots,
        rootnid_2b,
        rootnid_8b,
        metabox_nid,
        inos: f.inos,
        // Signed when read; build time = epoch + build_time.
        epoch: f.epoch as u64,
        build_time: f
            .build_time
            .checked_sub(f.epoch)
            .and_then(|d| u32::try_from(d).ok())
            .ok_or_else(|| BuildError::Options("internal: epoch after the build time".into()))?,
        blocks_lo: u32::try_from(f.total_blocks)
            .map_err(|_| BuildError::TooLarge("more than 2^32 blocks".into()))?,
        meta_blkaddr: u32::try_from(f.meta_blkaddr)
            .map_err(|_| BuildError::TooLarge("metadata beyond 2^32 blocks".into()))?,
        xattr_blkaddr: u32::try_from(f.xattr_blkaddr).unwrap_or(0),
        feature_incompat,
        u1,
        packed_nid: f.packed_nid.unwrap_or(0),
        xattr_prefix_count,
        xattr_prefix_start,
        // The fingerprint's long-prefix index, without bit 7 (as mkfs.erofs writes it).
        ishare_xattr_prefix_id: cfg.ishare.unwrap_or(0),
        ..Default::default()
    };
    if let Some(l) = label {
        sb.volume_name[..l.len()].copy_from_slice(l.as_bytes());
    }
    Ok(sb)
}

/// The UUID: fixed, random, or derived from everything `out` has written so far and
/// the superblock itself (so it must be called after every other write).
pub fn uuid(choice: UuidChoice, out: &Out, sb: &Superblock) -> Result<[u8; 16]> {
    Ok(match choice {
        UuidChoice::Fixed(u) => u,
        UuidChoice::Random => {
            let mut u = [0u8; 16];
            getrandom::fill(&mut u)
                .map_err(|e| BuildError::Options(format!("random uuid: {e}")))?;
            set_v4(u)
        }
        UuidChoice::Derived => {
            let mut h = out.content_hash().to_vec();
            h.extend_from_slice(&sb.encode());
            let d: [u8; 32] =
                sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(&h)).into();
            let mut u = [0u8; 16];
            u.copy_from_slice(&d[..16]);
            set_v4(u)
        }
    })
}

/// Put the superblock (and, when `with_cfg`, the config records) into `block0` and
/// checksum it.
pub fn seal_block0(block0: &mut [u8], sb: &Superblock, cfg: &ComprCfg, with_cfg: bool) {
    let sbb = sb.encode();
    let sbo = SB_OFFSET as usize;
    block0[sbo..sbo + sbb.len()].copy_from_slice(&sbb);
    if with_cfg {
        let at = sbo + sbb.len();
        block0[at..at + cfg.bytes.len()].copy_from_slice(&cfg.bytes);
    }
    // Device slots: the tag (the kernel names the device at mount time; a merged
    // layer's is its UUID in hex, as mkfs.erofs writes it), its size in blocks, and
    // its place in the unified address space right behind this image (so the image
    // and the devices concatenated mount as one).
    let total = u64::from(sb.blocks_lo);
    let mut uniaddr = total;
    for (i, dev) in cfg.devices.iter().enumerate() {
        let blocks = dev.blocks;
        let at = cfg.devt_at() as usize + i * DEVICE_SLOT_SIZE;
        let slot = &mut block0[at..at + DEVICE_SLOT_SIZE];
        slot.fill(0);
        slot[..64].copy_from_slice(&dev.tag);
        slot[64..68].copy_from_slice(&(blocks as u32).to_le_bytes());
        slot[68..72].copy_from_slice(&(uniaddr as u32).to_le_bytes());
        slot[72..74].copy_from_slice(&((blocks >> 32) as u16).to_le_bytes());
        slot[74..76].copy_from_slice(&((uniaddr >> 32) as u16).to_le_bytes());
        uniaddr += blocks;
    }
    if sb.feature_compat & COMPAT_PLAIN_XATTR_PFX != 0 {
        let at = cfg.prefixes_at() as usize;
        let table = cfg.prefix_table();
        block0[at..at + table.len()].copy_from_slice(&table);
    }
    put_checksum(block0, sb);
}

/// With the checksum feature, `sb`'s checksum over `block0` (the image's first bytes,
/// superblock encoded at its offset) into its field.
pub fn put_checksum(block0: &mut [u8], sb: &Superblock) {
    if sb.feature_compat & COMPAT_SB_CHKSUM != 0 {
        let sbo = SB_OFFSET as usize;
        let clen = checksum_len(1u32 << sb.blkszbits);
        let csum = compute_checksum(&block0[sbo..sbo + clen]);
        block0[sbo + 4..sbo + 8].copy_from_slice(&csum.to_le_bytes());
    }
}

fn set_v4(mut u: [u8; 16]) -> [u8; 16] {
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zdata::Compression;

    fn fields(root_nid: u64, metabox_nid: Option<u64>) -> SbFields {
        SbFields {
            blkszbits: 12,
            root_nid,
            metabox_nid,
            inos: 3,
            build_time: 1_700_000_000,
            epoch: 1_700_000_000,
            layout48: false,
            total_blocks: 9,
            meta_blkaddr: 0,
            xattr_blkaddr: 8,
            xattr_filter: false,
            chunked: false,
            compressed: true,
            inline_pcluster: false,
            packed_nid: None,
            shared_pclusters: false,
            prefixes_in_packed: None,
        }
    }

    #[test]
    fn layout48_superblock() -> Result<()> {
        let o = BuildOptions {
            compression: Some(Compression::default()),
            layout48: true,
            ..BuildOptions::default()
        };
        let cfg = ComprCfg::new(&o, &[]);
        let mut f = fields(36, None);
        f.layout48 = true;
        f.epoch = 0;
        let sb = superblock(&f, &cfg, None)?;
        // The 48-bit flag, no extension slot, the 16-bit root nid while it fits, and
        // build time = epoch + build_time.
        assert_eq!(sb.feature_incompat, INCOMPAT_ZERO_PADDING | INCOMPAT_48BIT);
        assert_eq!((sb.sb_size(), sb.rootnid_2b, sb.rootnid_8b), (128, 36, 0));
        assert_eq!((sb.epoch, sb.build_time), (0, 1_700_000_000));
        assert_eq!(sb.root_nid_and_blocks(), (36, 9));
        // A root nid past 16 bits goes to the 64-bit field (which only 48-bit images
        // have: without the layout it is an error).
        f.root_nid = 0x1_0000;
        let sb = superblock(&f, &cfg, None)?;
        assert_eq!((sb.rootnid_2b, sb.rootnid_8b), (0, 0x1_0000));
        assert_eq!(sb.root_nid_and_blocks(), (0x1_0000, 9));
        f.layout48 = false;
        f.epoch = f.build_time;
        assert!(superblock(&f, &cfg, None).is_err());
        // An epoch after the build time cannot be written.
        f.layout48 = true;
        f.epoch = f.build_time + 1;
        assert!(superblock(&f, &cfg, None).is_err());
        Ok(())
    }

    #[test]
    fn metabox_superblock() -> Result<()> {
        let o = BuildOptions {
            compression: Some(Compression::default()),
            metabox: true,
            metabox_pcluster_size: 65536,
            ..BuildOptions::default()
        };
        let cfg = ComprCfg::new(&o, &[]);
        // The 144-byte superblock, then the lz4 record (2 + 14 bytes) the 64 KiB
        // metabox pcluster makes necessary.
        assert_eq!(cfg.sb_size, 144);
        assert!(cfg.needed);
        assert_eq!(cfg.end(), 1024 + 144 + 16);
        let sb = superblock(&fields(1 << 63, Some(37)), &cfg, None)?;
        assert_eq!(sb.sb_size(), 144);
        assert_eq!(sb.metabox_nid, 37);
        assert_eq!(sb.rootnid_8b, 1 << 63);
        assert_eq!(sb.rootnid_2b, 0);
        assert_eq!(
            sb.feature_incompat,
            INCOMPAT_ZERO_PADDING | INCOMPAT_COMPR_CFGS | INCOMPAT_48BIT | INCOMPAT_METABOX
        );
        assert_eq!(sb.root_nid_and_blocks(), (1 << 63, 9));
        let b = sb.encode();
        assert_eq!(b.len(), 144);
        assert_eq!(&b[0x80..0x88], &37u64.to_le_bytes());
        // A superblock planned without the slot cannot take a metabox.
        let plain = ComprCfg::new(&BuildOptions::default(), &[]);
        assert_eq!(plain.end(), 1024 + 128);
        assert!(superblock(&fields(1 << 63, Some(37)), &plain, None).is_err());
        assert!(superblock(&fields(1 << 16, None), &plain, None).is_err());
        Ok(())
    }
}

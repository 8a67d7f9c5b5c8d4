//! The image: superblock validation (like the kernel's super.c) and the two address
//! spaces inode metadata can live in (the image itself, or the metabox inode's data).

use crate::cache::ExtentCache;
use crate::error::*;
use crate::inode::Inode;
use crate::source::Source;
use ferofs_format::sb::*;
use ferofs_format::{INODE_SLOT_SIZE, MAX_BLKSZBITS, MIN_BLKSZBITS};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// nid bit 63: the inode lives in the metabox.
pub const NID_METABOX_BIT: u64 = 1 << 63;

/// One compression configuration record (doc §1.5), raw payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComprConfigs {
    /// Indexed by algorithm id; `None` when the algorithm is not available.
    pub records: [Option<Vec<u8>>; ALG_MAX as usize],
    pub available: u16,
}

impl ComprConfigs {
    /// LZMA dictionary size (for the MicroLZMA decoder).
    pub fn lzma_dict_size(&self) -> u32 {
        self.records[usize::from(ALG_LZMA)]
            .as_ref()
            .and_then(|r| r.get(0..4))
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(8 << 20)
    }
}

/// Long xattr name prefixes (base index, infix), loaded once; or why they could not be.
pub(crate) type PrefixTable = Result<Vec<(u8, Vec<u8>)>, String>;

/// An EROFS image over a positional-read source.
pub struct Image<S: Source = File> {
    pub(crate) src: S,
    pub(crate) sb: Superblock,
    pub(crate) blkszbits: u8,
    pub(crate) root_nid: u64,
    pub(crate) blocks: u64,
    pub(crate) len: u64,
    pub(crate) compr: ComprConfigs,
    pub(crate) devices: Vec<DeviceSlot>,
    pub(crate) metabox: OnceLock<Result<Inode, String>>,
    pub(crate) packed: OnceLock<Result<Inode, String>>,
    pub(crate) prefixes: OnceLock<PrefixTable>,
    /// Shared cache of decoded extents for reads that need part of one.
    pub(crate) cache: ExtentCache,
    /// Unique per opened image (never 0): keys what a [`crate::ReadCtx`] holds.
    pub(crate) id: u64,
}

/// Source of [`Image::id`]s.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Summary of the superblock for display.
#[derive(Debug, Clone)]
pub struct ImageInfo {
    pub block_size: u32,
    pub blocks: u64,
    pub root_nid: u64,
    pub inodes: u64,
    pub uuid: [u8; 16],
    pub label: Vec<u8>,
    pub build_time: i64,
    pub build_time_nsec: u32,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub compression_algorithms: u16,
}

impl Image<File> {
    /// Open an image file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let f = File::open(path.as_ref()).map_err(|e| Error::Io {
            offset: 0,
            error: e,
        })?;
        Self::new(f)
    }
}

impl<S: Source> Image<S> {
    /// Read and validate the superblock.
    pub fn new(src: S) -> Result<Self> {
        Self::new_with(src, true)
    }

    /// Like [`Image::new`], but a superblock checksum mismatch is not an error (for
    /// `check`, which reports it and goes on verifying the rest of the image).
    pub fn new_ignoring_checksum(src: S) -> Result<Self> {
        Self::new_with(src, false)
    }

    fn new_with(src: S, verify_checksum: bool) -> Result<Self> {
        let len = src.size().map_err(|e| Error::Io {
            offset: 0,
            error: e,
        })?;
        if len < SB_OFFSET + SB_BASE_SIZE as u64 {
            return Err(corrupt(
                CorruptKind::Truncated,
                None,
                Some(0),
                Some(len),
                "image shorter than a superblock",
            ));
        }
        let mut raw = [0u8; SB_MAX_SIZE];
        let avail = (len - SB_OFFSET).min(SB_MAX_SIZE as u64) as usize;
        read_src(&src, &mut raw[..avail], SB_OFFSET)?;
        let sb = Superblock::parse(&raw);
        if sb.magic != MAGIC {
            return Err(corrupt(
                CorruptKind::BadMagic,
                None,
                Some(SB_OFFSET),
                Some(u64::from(sb.magic)),
                "not an EROFS image",
            ));
        }
        if !(MIN_BLKSZBITS..=MAX_BLKSZBITS).contains(&sb.blkszbits) {
            return Err(corrupt(
                CorruptKind::BadBlockSize,
                None,
                Some(SB_OFFSET + 0x0C),
                Some(u64::from(sb.blkszbits)),
                "block size bits out of 9..=12",
            ));
        }
        let blksz = 1u32 << sb.blkszbits;
        if sb.has_compat(COMPAT_SB_CHKSUM) {
            let n = checksum_len(blksz) as u64;
            if len < SB_OFFSET + n {
                return Err(corrupt(
                    CorruptKind::Truncated,
                    None,
                    Some(SB_OFFSET),
                    Some(len),
                    "image shorter than the checksummed block",
                ));
            }
            let mut region = vec![0u8; n as usize];
            read_src(&src, &mut region, SB_OFFSET)?;
            let got = compute_checksum(&region);
            if verify_checksum && got != sb.checksum {
                return Err(corrupt(
                    CorruptKind::BadChecksum,
                    None,
                    Some(SB_OFFSET + 4),
                    Some(u64::from(sb.checksum)),
                    "superblock checksum mismatch",
                ));
            }
        }
        let unknown = sb.feature_incompat & !INCOMPAT_ALL_KNOWN;
        if unknown != 0 {
            return Err(unsupported(
                format!("unknown incompatible feature bits {unknown:#x}"),
                None,
            ));
        }
        if sb.dirblkbits != 0 {
            return Err(corrupt(
                CorruptKind::BadSuperblock,
                None,
                Some(SB_OFFSET + 0x5A),
                Some(u64::from(sb.dirblkbits)),
                "dirblkbits must be 0",
            ));
        }
        if sb.sb_size() > 4096 - 1024 {
            return Err(corrupt(
                CorruptKind::BadSuperblock,
                None,
                Some(SB_OFFSET + 0x0D),
                Some(u64::from(sb.sb_extslots)),
                "superblock too large",
            ));
        }
        if sb.has_incompat(INCOMPAT_METABOX) && sb.sb_size() <= 0x80 {
            return Err(corrupt(
                CorruptKind::BadSuperblock,
                None,
                Some(SB_OFFSET + 0x0D),
                Some(u64::from(sb.sb_extslots)),
                "metabox needs an extended superblock",
            ));
        }
        if sb.packed_nid & NID_METABOX_BIT != 0 || sb.metabox_nid & NID_METABOX_BIT != 0 {
            return Err(corrupt(
                CorruptKind::BadSuperblock,
                None,
                Some(SB_OFFSET + 0x60),
                Some(sb.packed_nid),
                "packed/metabox nid has bit 63",
            ));
        }
        let (root_nid, blocks) = sb.root_nid_and_blocks();
        let compr = read_compr_cfgs(&src, &sb, len)?;
        let devices = read_devices(&src, &sb, len)?;
        Ok(Image {
            src,
            blkszbits: sb.blkszbits,
            root_nid,
            blocks,
            len,
            compr,
            devices,
            sb,
            metabox: OnceLock::new(),
            packed: OnceLock::new(),
            prefixes: OnceLock::new(),
            cache: ExtentCache::new(crate::limits::DEFAULT_CACHE_BUDGET),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }
    /// The device table's slots (extra devices), in device order.
    pub fn device_slots(&self) -> &[DeviceSlot] {
        &self.devices
    }
    /// The bytes the image is read from.
    pub fn source(&self) -> &S {
        &self.src
    }
    pub fn root_nid(&self) -> u64 {
        self.root_nid
    }
    pub fn block_size(&self) -> u32 {
        1 << self.blkszbits
    }
    pub fn compr_configs(&self) -> &ComprConfigs {
        &self.compr
    }
    /// Bytes held by the decompressed-extent cache.
    pub fn cache_used(&self) -> usize {
        self.cache.used()
    }
    /// Set the decompressed-extent cache budget in bytes (default 64 MiB).
    pub fn set_cache_budget(&self, bytes: usize) {
        self.cache.set_budget(bytes);
    }

    pub fn info(&self) -> ImageInfo {
        let bt = self.sb.build_time_secs();
        ImageInfo {
            block_size: self.block_size(),
            blocks: self.blocks,
            root_nid: self.root_nid,
            inodes: self.sb.inos,
            uuid: self.sb.uuid,
            label: self.sb.label().to_vec(),
            build_time: i64::try_from(bt).unwrap_or(i64::MAX),
            build_time_nsec: self.sb.fixed_nsec,
            feature_compat: self.sb.feature_compat,
            feature_incompat: self.sb.feature_incompat,
            compression_algorithms: self.compr.available,
        }
    }

    /// Read raw image bytes (bounds-checked against the image length).
    pub(crate) fn read_raw(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        match end {
            Some(e) if e <= self.len => read_src(&self.src, buf, offset),
            _ => Err(corrupt(
                CorruptKind::Truncated,
                None,
                Some(offset),
                Some(buf.len() as u64),
                "read beyond the end of the image",
            )),
        }
    }

    /// Byte position of block `blk`, checked.
    pub(crate) fn blk_pos(&self, blk: u64) -> Option<u64> {
        blk.checked_mul(1u64 << self.blkszbits)
    }

    /// The metabox inode (loaded once).
    pub(crate) fn metabox_inode(&self) -> Result<&Inode> {
        let r = self.metabox.get_or_init(|| {
            if !self.sb.has_incompat(INCOMPAT_METABOX) {
                return Err("image has no metabox".into());
            }
            self.inode(self.sb.metabox_nid).map_err(|e| e.to_string())
        });
        r.as_ref()
            .map_err(|e| corrupt_msg(CorruptKind::NidOutOfRange, self.sb.metabox_nid, e))
    }

    /// The packed inode (fragments), loaded once.
    pub(crate) fn packed_inode(&self) -> Result<&Inode> {
        let r = self.packed.get_or_init(|| {
            if !self.sb.has_incompat(INCOMPAT_FRAGMENTS) || self.sb.packed_nid == 0 {
                return Err("image has no packed inode".into());
            }
            self.inode(self.sb.packed_nid).map_err(|e| e.to_string())
        });
        r.as_ref()
            .map_err(|e| corrupt_msg(CorruptKind::NidOutOfRange, self.sb.packed_nid, e))
    }

    /// Read `buf.len()` bytes at `rel` bytes after the start of inode `nid`, in the
    /// address space the inode lives in (image, or metabox data for nid bit 63).
    pub(crate) fn read_inode_meta(&self, nid: u64, rel: u64, buf: &mut [u8]) -> Result<()> {
        let (pos, in_metabox) = self.inode_pos(nid)?;
        let at = pos.checked_add(rel).ok_or_else(|| {
            corrupt(
                CorruptKind::NidOutOfRange,
                Some(nid),
                None,
                Some(rel),
                "inode metadata offset overflows",
            )
        })?;
        if in_metabox {
            let mb = self.metabox_inode()?;
            let end = at.saturating_add(buf.len() as u64);
            if end > mb.size {
                return Err(corrupt(
                    CorruptKind::NidOutOfRange,
                    Some(nid),
                    Some(at),
                    Some(mb.size),
                    "inode beyond the metabox",
                ));
            }
            let n = self.read_at(mb, at, buf)?;
            if n != buf.len() {
                return Err(corrupt(
                    CorruptKind::Truncated,
                    Some(nid),
                    Some(at),
                    None,
                    "short metabox read",
                ));
            }
            Ok(())
        } else {
            let end = at.saturating_add(buf.len() as u64);
            if end > self.len {
                return Err(corrupt(
                    CorruptKind::NidOutOfRange,
                    Some(nid),
                    Some(at),
                    Some(self.len),
                    "inode beyond the end of the image",
                ));
            }
            self.read_raw(buf, at)
        }
    }

    /// The image bytes `[start, end)` of `ino`'s on-disk record (core and inline
    /// xattrs; inline data and indexes follow it), or None when it lives in the
    /// metabox (another address space).
    pub fn inode_record(&self, ino: &Inode) -> Option<(u64, u64)> {
        match self.inode_pos(ino.nid) {
            Ok((pos, false)) => pos.checked_add(ino.meta_size).map(|e| (pos, e)),
            _ => None,
        }
    }

    /// (byte position of the inode in its address space, in metabox?)
    pub(crate) fn inode_pos(&self, nid: u64) -> Result<(u64, bool)> {
        let in_metabox = nid & NID_METABOX_BIT != 0;
        let slot = nid & !NID_METABOX_BIT;
        let rel = slot.checked_mul(INODE_SLOT_SIZE);
        let pos = if in_metabox {
            if !self.sb.has_incompat(INCOMPAT_METABOX) {
                return Err(corrupt(
                    CorruptKind::NidOutOfRange,
                    Some(nid),
                    None,
                    None,
                    "metabox nid in an image without a metabox",
                ));
            }
            rel
        } else {
            self.blk_pos(u64::from(self.sb.meta_blkaddr))
                .and_then(|m| rel.and_then(|r| m.checked_add(r)))
        };
        pos.map(|p| (p, in_metabox)).ok_or_else(|| {
            corrupt(
                CorruptKind::NidOutOfRange,
                Some(nid),
                None,
                None,
                "nid overflows",
            )
        })
    }
}

fn corrupt_msg(kind: CorruptKind, nid: u64, _msg: &str) -> Error {
    corrupt(
        kind,
        Some(nid),
        None,
        None,
        "special inode (metabox/packed) unreadable",
    )
}

pub(crate) fn read_src<S: Source + ?Sized>(src: &S, buf: &mut [u8], offset: u64) -> Result<()> {
    src.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(
                CorruptKind::Truncated,
                None,
                Some(offset),
                Some(buf.len() as u64),
                "read beyond the end of the image",
            )
        } else {
            Error::Io { offset, error: e }
        }
    })
}

fn read_compr_cfgs<S: Source>(src: &S, sb: &Superblock, len: u64) -> Result<ComprConfigs> {
    let mut c = ComprConfigs::default();
    if !sb.has_incompat(INCOMPAT_COMPR_CFGS) {
        if sb.has_incompat(INCOMPAT_ZERO_PADDING) {
            c.available = 1 << ALG_LZ4;
        }
        return Ok(c);
    }
    c.available = sb.u1;
    if sb.u1 >> ALG_MAX != 0 {
        return Err(corrupt(
            CorruptKind::BadComprConfig,
            None,
            Some(SB_OFFSET + 0x54),
            Some(u64::from(sb.u1)),
            "unknown compression algorithm bits",
        ));
    }
    let mut pos = SB_OFFSET + sb.sb_size() as u64;
    for alg in 0..ALG_MAX {
        if sb.u1 & (1 << alg) == 0 {
            continue;
        }
        pos = (pos + 3) & !3;
        let mut l = [0u8; 2];
        if pos + 2 > len {
            return Err(corrupt(
                CorruptKind::Truncated,
                None,
                Some(pos),
                None,
                "compression config beyond the image",
            ));
        }
        read_src(src, &mut l, pos)?;
        let n = u64::from(u16::from_le_bytes(l));
        if n == 0 || pos + 2 + n > len || n > 4096 {
            return Err(corrupt(
                CorruptKind::BadComprConfig,
                None,
                Some(pos),
                Some(n),
                "bad compression config length",
            ));
        }
        let mut payload = vec![0u8; n as usize];
        read_src(src, &mut payload, pos + 2)?;
        c.records[usize::from(alg)] = Some(payload);
        pos += 2 + n;
    }
    Ok(c)
}

fn read_devices<S: Source>(src: &S, sb: &Superblock, len: u64) -> Result<Vec<DeviceSlot>> {
    if !sb.has_incompat(INCOMPAT_DEVICE_TABLE) || sb.extra_devices == 0 {
        return Ok(Vec::new());
    }
    let mut v = Vec::new();
    let base = u64::from(sb.devt_slotoff) * DEVICE_SLOT_SIZE as u64;
    for i in 0..u64::from(sb.extra_devices) {
        let pos = base + i * DEVICE_SLOT_SIZE as u64;
        if pos + DEVICE_SLOT_SIZE as u64 > len {
            return Err(corrupt(
                CorruptKind::BadDeviceTable,
                None,
                Some(pos),
                Some(i),
                "device slot beyond the image",
            ));
        }
        let mut b = [0u8; DEVICE_SLOT_SIZE];
        read_src(src, &mut b, pos)?;
        v.push(DeviceSlot::parse(&b));
    }
    Ok(v)
}

//! `inspect` (superblock, features, counts). `check` lives in check.rs.

use crate::fmt::*;
use crate::list::open;
use anyhow::Result;
use ferofs_format::sb::*;
use ferofs_reader::Source;
use serde_json::json;
use std::io::Write;
use std::path::Path;

const COMPAT_NAMES: [(u32, &str); 6] = [
    (COMPAT_SB_CHKSUM, "sb_csum"),
    (COMPAT_MTIME, "mtime"),
    (COMPAT_XATTR_FILTER, "xattr_filter"),
    (COMPAT_SHARED_EA_IN_METABOX, "shared_ea_in_metabox"),
    (COMPAT_PLAIN_XATTR_PFX, "plain_xattr_pfx"),
    (COMPAT_ISHARE_XATTRS, "ishare_xattrs"),
];
const INCOMPAT_NAMES: [(u32, &str); 9] = [
    (INCOMPAT_ZERO_PADDING, "0padding"),
    (INCOMPAT_COMPR_CFGS, "compr_cfgs/big_pcluster"),
    (INCOMPAT_CHUNKED_FILE, "chunked_file"),
    (INCOMPAT_DEVICE_TABLE, "device_table"),
    (INCOMPAT_ZTAILPACKING, "ztailpacking"),
    (INCOMPAT_FRAGMENTS, "fragments/dedupe"),
    (INCOMPAT_XATTR_PREFIXES, "xattr_prefixes"),
    (INCOMPAT_48BIT, "48bit"),
    (INCOMPAT_METABOX, "metabox"),
];

fn names(bits: u32, table: &[(u32, &'static str)]) -> Vec<String> {
    let mut v: Vec<String> = table
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let known: u32 = table.iter().map(|(b, _)| b).fold(0, |a, b| a | b);
    if bits & !known != 0 {
        v.push(format!("unknown:{:#x}", bits & !known));
    }
    v
}

#[derive(Default)]
struct Counts {
    files: u64,
    dirs: u64,
    symlinks: u64,
    special: u64,
    bytes: u64,
    compressed_files: u64,
    extended_inodes: u64,
    xattrs: u64,
}

pub fn inspect(image: &Path, json_out: bool) -> Result<()> {
    let img = open(image)?;
    let sb = img.superblock().clone();
    let (root, blocks) = sb.root_nid_and_blocks();
    let blksz = 1u64 << sb.blkszbits;
    let mut c = Counts::default();
    img.walk(|_path, ino| {
        match ino.mode & ferofs_format::inode::S_IFMT {
            ferofs_format::inode::S_IFREG => {
                c.files += 1;
                c.bytes += ino.size;
                if ino.layout.is_compressed() {
                    c.compressed_files += 1;
                }
            }
            ferofs_format::inode::S_IFDIR => c.dirs += 1,
            ferofs_format::inode::S_IFLNK => c.symlinks += 1,
            _ => c.special += 1,
        }
        if ino.extended {
            c.extended_inodes += 1;
        }
        c.xattrs += img.xattrs(ino)?.len() as u64;
        Ok(())
    })?;
    let compat = names(sb.feature_compat, &COMPAT_NAMES);
    let incompat = names(sb.feature_incompat, &INCOMPAT_NAMES);
    let algs: Vec<&str> = if sb.has_incompat(INCOMPAT_COMPR_CFGS) {
        [
            (ALG_LZ4, "lz4"),
            (ALG_LZMA, "lzma"),
            (ALG_DEFLATE, "deflate"),
            (ALG_ZSTD, "zstd"),
        ]
        .iter()
        .filter(|(a, _)| sb.u1 & (1 << a) != 0)
        .map(|(_, n)| *n)
        .collect()
    } else if c.compressed_files > 0 || sb.has_incompat(INCOMPAT_ZERO_PADDING) {
        vec!["lz4"]
    } else {
        vec![]
    };
    let image_bytes = img.source().size()?;
    // A verity superblock right behind the image (`build --verity`).
    let verity_at = (blocks * blksz).div_ceil(4096) * 4096;
    let verity = (image_bytes > verity_at)
        .then(|| ferofs_builder::verity::read_sb(img.source(), verity_at).ok())
        .flatten();
    let build_time = sb.build_time_secs();
    // A table no xattr uses may be damaged without harm: say so, show the rest.
    let prefixes: Vec<String> = match img.xattr_prefixes() {
        Ok(v) => v.iter().map(|p| bytes_display(p)).collect(),
        Err(e) => vec![format!("(unreadable: {e})")],
    };
    let v = json!({
        "magic": format!("{:#010x}", sb.magic),
        "block_size": blksz,
        "blocks": blocks,
        "image_bytes": image_bytes,
        "filesystem_bytes": blocks * blksz,
        "root_nid": root,
        "inodes": sb.inos,
        "meta_blkaddr": sb.meta_blkaddr,
        "xattr_blkaddr": sb.xattr_blkaddr,
        "uuid": uuid_string(&sb.uuid),
        "label": bytes_display(sb.label()),
        "build_time": build_time as i64,
        "build_time_utc": time_string(build_time as i64, sb.fixed_nsec),
        "sb_size": sb.sb_size(),
        "checksum": format!("{:#010x}", sb.checksum),
        "feature_compat": compat,
        "feature_incompat": incompat,
        "compression_algorithms": algs,
        "packed_nid": sb.packed_nid,
        "metabox_nid": sb.has_incompat(INCOMPAT_METABOX).then_some(sb.metabox_nid),
        "extra_devices": sb.extra_devices,
        "xattr_prefix_count": sb.xattr_prefix_count,
        "xattr_prefixes": prefixes,
        "verity": verity.as_ref().map(|v| json!({
            "hash_offset": verity_at,
            "hash_algorithm": v.algorithm,
            "data_blocks": v.data_blocks,
            "salt": hex(&v.salt),
            "uuid": uuid_string(&v.uuid),
        })),
        "counts": {
            "regular_files": c.files, "directories": c.dirs, "symlinks": c.symlinks,
            "special_files": c.special, "file_bytes": c.bytes,
            "compressed_files": c.compressed_files, "extended_inodes": c.extended_inodes,
            "xattrs": c.xattrs,
        },
    });
    let mut out = std::io::stdout().lock();
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    writeln!(out, "Filesystem UUID:   {}", uuid_string(&sb.uuid))?;
    writeln!(out, "Label:             {}", bytes_display(sb.label()))?;
    writeln!(out, "Block size:        {blksz}")?;
    writeln!(
        out,
        "Blocks:            {blocks} ({} bytes; file is {image_bytes} bytes)",
        blocks * blksz
    )?;
    writeln!(out, "Root nid:          {root}")?;
    if sb.has_incompat(INCOMPAT_METABOX) {
        writeln!(out, "Metabox nid:       {}", sb.metabox_nid)?;
    }
    writeln!(out, "Inodes:            {}", sb.inos)?;
    writeln!(out, "Meta block addr:   {}", sb.meta_blkaddr)?;
    writeln!(
        out,
        "Build time:        {}",
        time_string(build_time as i64, sb.fixed_nsec)
    )?;
    if !prefixes.is_empty() {
        writeln!(out, "Xattr prefixes:    {}", prefixes.join(" "))?;
    }
    writeln!(out, "Compat features:   {}", compat.join(" "))?;
    writeln!(out, "Incompat features: {}", incompat.join(" "))?;
    writeln!(
        out,
        "Compression:       {}",
        if algs.is_empty() {
            "none".into()
        } else {
            algs.join(" ")
        }
    )?;
    writeln!(
        out,
        "Contents:          {} files ({} bytes, {} compressed), {} directories, {} symlinks, {} special, {} xattrs, {} extended inodes",
        c.files, c.bytes, c.compressed_files, c.dirs, c.symlinks, c.special, c.xattrs, c.extended_inodes
    )?;
    if let Some(v) = &verity {
        writeln!(
            out,
            "Verity:            {}, {} data blocks, salt {}, superblock at byte {verity_at} (--hash-offset)",
            v.algorithm,
            v.data_blocks,
            if v.salt.is_empty() { "-".into() } else { hex(&v.salt) }
        )?;
    }
    Ok(())
}

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

/// udev's properties of the filesystem on `image` (what `blkid -o udev` and dump.erofs
/// `--blkid-udev` print): type, usage, UUID and, when the image has one, the label,
/// raw with unsafe characters as `_` and encoded with `\xNN` escapes as blkid does.
pub fn udev(image: &Path) -> Result<()> {
    let img = open(image)?;
    let sb = img.superblock();
    print!("{}", udev_lines(&uuid_string(&sb.uuid), &sb.volume_name));
    Ok(())
}

fn udev_lines(uuid: &str, label: &[u8]) -> String {
    let mut out = format!(
        "ID_FS_UUID={uuid}\nID_FS_UUID_ENC={uuid}\nID_FS_TYPE=erofs\nID_FS_USAGE=filesystem\n"
    );
    let label: &[u8] = label.split(|&b| b == 0).next().unwrap_or(&[]);
    if label.is_empty() {
        return out;
    }
    // As blkid: the raw value with whitespace, control characters and bytes that are
    // not UTF-8 as `_`; the encoded one with every byte outside [A-Za-z0-9#+-.:=@_]
    // and outside a multibyte UTF-8 character as `\xNN`.
    let (mut raw, mut enc) = (String::new(), String::new());
    for chunk in label.utf8_chunks() {
        for c in chunk.valid().chars() {
            raw.push(if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            });
            if c.is_ascii_alphanumeric() || "#+-.:=@_".contains(c) || !c.is_ascii() {
                enc.push(c);
            } else {
                enc.push_str(&format!("\\x{:02x}", c as u32));
            }
        }
        for b in chunk.invalid() {
            raw.push('_');
            enc.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push_str(&format!("ID_FS_LABEL={raw}\nID_FS_LABEL_ENC={enc}\n"));
    out
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
    // The device table: each slot's tag (text up to its first NUL), size in blocks
    // and place in the unified address space.
    let devices: Vec<(String, u64, u64)> = img
        .device_slots()
        .iter()
        .map(|d| (bytes_display(d.tag_bytes()), d.blocks(), d.uniaddr()))
        .collect();
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
        "devices": devices.iter().map(|(tag, blocks, at)| json!({
            "tag": tag, "blocks": blocks, "mapped_blkaddr": at,
        })).collect::<Vec<_>>(),
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
    for (k, (tag, blocks, at)) in devices.iter().enumerate() {
        writeln!(
            out,
            "Device {}:          {blocks} blocks at block {at}{}",
            k + 1,
            if tag.is_empty() {
                String::new()
            } else {
                format!(", tag {tag}")
            }
        )?;
    }
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

#[cfg(test)]
mod udev_tests {
    #[test]
    fn lines_as_blkid_prints_them() {
        let u = "3c9764b4-1a88-4e1f-8dfc-f4d3f73bc8d0";
        assert_eq!(
            super::udev_lines(u, &[0; 16]),
            format!(
                "ID_FS_UUID={u}\nID_FS_UUID_ENC={u}\nID_FS_TYPE=erofs\nID_FS_USAGE=filesystem\n"
            )
        );
        let l = super::udev_lines(u, b"my disk/1\0\0\0\0\0\0\0");
        assert!(
            l.ends_with("ID_FS_LABEL=my_disk/1\nID_FS_LABEL_ENC=my\\x20disk\\x2f1\n"),
            "{l}"
        );
        let l = super::udev_lines(u, "d\u{e9}j\u{e0}\t\u{ff}".as_bytes());
        assert!(
            l.ends_with(
                "ID_FS_LABEL=d\u{e9}j\u{e0}_\u{ff}\nID_FS_LABEL_ENC=d\u{e9}j\u{e0}\\x09\u{ff}\n"
            ),
            "{l}"
        );
        let l = super::udev_lines(u, b"a\xffb");
        assert!(
            l.ends_with("ID_FS_LABEL=a_b\nID_FS_LABEL_ENC=a\\xffb\n"),
            "{l}"
        );
    }
}

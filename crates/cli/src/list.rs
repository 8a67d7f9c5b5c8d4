//! `ls`, `cat`, `stat`.

use crate::fmt::*;
use crate::source::Image;
use anyhow::{Context, Result};
use ferofs_reader::Inode;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;

pub fn open(image: &Path) -> Result<Image> {
    open_with(image, crate::source::has_devices())
}

/// [`open`], joined with the `--device` files only when `devices`.
pub fn open_with(image: &Path, devices: bool) -> Result<Image> {
    let src = crate::source::open_src_with(image, devices)
        .with_context(|| format!("cannot open image {}", image.display()))?;
    Image::new(src).map_err(|e| crate::source::cannot_open(image, e))
}

/// [`open`], not verifying the superblock checksum (`--no-sb-checksum`).
pub fn open_ignoring_checksum(image: &Path) -> Result<Image> {
    let src = crate::source::open_src_with(image, crate::source::has_devices())
        .with_context(|| format!("cannot open image {}", image.display()))?;
    Image::new_ignoring_checksum(src).map_err(|e| crate::source::cannot_open(image, e))
}

/// [`open`] for one of several images on one command line (`diff`): the `--device`
/// files go to an image whose device table has extra devices, not to one without.
pub fn open_one_of(image: &Path) -> Result<Image> {
    if !crate::source::has_devices() || crate::source::is_url(image) {
        return open(image);
    }
    let plain = open_with(image, false)?;
    if plain.superblock().extra_devices == 0 {
        return Ok(plain);
    }
    open_with(image, true)
}

fn lookup(img: &Image, path: &str) -> Result<Inode> {
    img.lookup(path.as_bytes())
        .with_context(|| format!("{path}: lookup failed"))
}

/// `ls -l` JSON object for one entry.
pub fn entry_json(img: &Image, name: &[u8], ino: &Inode) -> Result<Value> {
    let mut v = json!({
        "name": bytes_display(name),
        "nid": ino.nid,
        "type": type_name(ino.mode),
        "mode": format!("{:04o}", ino.mode & 0o7777),
        "nlink": ino.nlink,
        "uid": ino.uid,
        "gid": ino.gid,
        "size": ino.size,
        "mtime": ino.mtime,
        "mtime_nsec": ino.mtime_nsec,
        "mtime_utc": time_string(ino.mtime, ino.mtime_nsec),
    });
    if ino.is_symlink() {
        v["target"] = json!(bytes_display(&img.read_link(ino)?));
    }
    if ino.is_device() {
        let (ma, mi) = ino.rdev_major_minor();
        v["rdev"] = json!({"major": ma, "minor": mi});
    }
    Ok(v)
}

/// The inode `--nid` names, or else the one at `path`, and how to name it.
fn by_path_or_nid(img: &Image, path: Option<&str>, nid: Option<u64>) -> Result<(Inode, String)> {
    match (path, nid) {
        (_, Some(n)) => Ok((
            img.inode(n).with_context(|| format!("nid {n}"))?,
            format!("(nid {n})"),
        )),
        (Some(p), None) => Ok((lookup(img, p)?, p.to_string())),
        (None, None) => anyhow::bail!("give a PATH or --nid"),
    }
}

/// One `ls -l` line: mode, links, owner, size (or device numbers), mtime, the name
/// shown and a symlink's target.
fn ls_line(img: &Image, name: &[u8], i: &Inode) -> Result<String> {
    let size = if i.is_device() {
        let (ma, mi) = i.rdev_major_minor();
        format!("{ma}, {mi}")
    } else {
        i.size.to_string()
    };
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>10} {} {}",
        mode_string(i.mode),
        i.nlink,
        i.uid,
        i.gid,
        size,
        time_string(i.mtime, i.mtime_nsec),
        bytes_display(name)
    );
    if i.is_symlink() {
        line.push_str(" -> ");
        line.push_str(&bytes_display(&img.read_link(i)?));
    }
    Ok(line)
}

/// `ls -R`: every entry at and below `top`, one line (or one JSON object with its
/// `path`) each, written as the walk goes (nothing held per entry).
fn ls_recursive(img: &Image, top: &Inode, shown: &str, json_out: bool) -> Result<()> {
    let base = shown.trim_end_matches('/');
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if json_out {
        writeln!(out, "[")?;
    }
    let mut first = true;
    let mut failed: Option<anyhow::Error> = None;
    let mut one = |rel: &[u8], ino: &Inode| -> Result<()> {
        let mut full = base.as_bytes().to_vec();
        if rel != b"/" {
            full.extend_from_slice(rel);
        }
        if full.is_empty() {
            full.push(b'/');
        }
        if json_out {
            let mut v = entry_json(img, &full, ino)?;
            if let Some(o) = v.as_object_mut() {
                if let Some(n) = o.remove("name") {
                    o.insert("path".into(), n);
                }
            }
            let sep = if first { "" } else { ",\n" };
            write!(out, "{sep}{}", serde_json::to_string(&v)?)?;
        } else {
            writeln!(out, "{}", ls_line(img, &full, ino)?)?;
        }
        first = false;
        Ok(())
    };
    let walked = img.walk_from(top, |rel, ino| {
        one(rel, ino).map_err(|e| {
            failed = Some(e);
            crate::export::stop()
        })
    });
    if let Some(e) = failed {
        return Err(e);
    }
    walked?;
    if json_out {
        writeln!(out, "\n]")?;
    }
    out.flush()?;
    Ok(())
}

pub fn ls(
    image: &Path,
    path: &str,
    nid: Option<u64>,
    json_out: bool,
    all: bool,
    recursive: bool,
) -> Result<()> {
    let img = open(image)?;
    let (ino, path) = by_path_or_nid(&img, Some(path), nid)?;
    let path = path.as_str();
    if recursive {
        let shown = if nid.is_some() { "" } else { path };
        return ls_recursive(&img, &ino, shown, json_out);
    }
    let entries: Vec<(Vec<u8>, Inode)> = if ino.is_dir() {
        let mut v = Vec::new();
        // A DOT_OMITTED directory stores no "."; show it as the kernel does.
        if all && ino.dot_omitted {
            v.push((b".".to_vec(), ino.clone()));
        }
        for d in img.read_dir(&ino)? {
            if !all && (d.name == b"." || d.name == b"..") {
                continue;
            }
            let child = img
                .inode(d.nid)
                .with_context(|| format!("{path}/{}", bytes_display(&d.name)))?;
            v.push((d.name, child));
        }
        v
    } else {
        vec![(path.as_bytes().to_vec(), ino)]
    };
    let mut out = std::io::stdout().lock();
    if json_out {
        let arr: Result<Vec<Value>> = entries
            .iter()
            .map(|(n, i)| entry_json(&img, n, i))
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&arr?)?)?;
        return Ok(());
    }
    for (name, i) in &entries {
        writeln!(out, "{}", ls_line(&img, name, i)?)?;
    }
    Ok(())
}

pub fn cat(image: &Path, path: Option<&str>, nid: Option<u64>) -> Result<()> {
    let img = open(image)?;
    let (ino, path) = by_path_or_nid(&img, path, nid)?;
    let path = path.as_str();
    anyhow::ensure!(!ino.is_dir(), "{path}: is a directory");
    let mut out = std::io::stdout().lock();
    if ino.is_symlink() {
        out.write_all(&img.read_link(&ino)?)?;
        return Ok(());
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut ctx = ferofs_reader::ReadCtx::new();
    let mut off = 0u64;
    while off < ino.size {
        let n = img
            .read_at_with(&mut ctx, &ino, off, &mut buf)
            .with_context(|| format!("{path}: read at offset {off}"))?;
        if n == 0 {
            anyhow::bail!(
                "{path}: unexpected end of data at offset {off} (size {})",
                ino.size
            );
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    out.flush()?;
    Ok(())
}

pub fn stat(image: &Path, path: Option<&str>, nid: Option<u64>, json_out: bool) -> Result<()> {
    let img = open(image)?;
    let (ino, path) = by_path_or_nid(&img, path, nid)?;
    let path = path.as_str();
    let mut v = entry_json(&img, path.as_bytes(), &ino)?;
    v["ino"] = json!(ino.ino);
    v["inode_format"] = json!(if ino.extended { "extended" } else { "compact" });
    v["layout"] = json!(ino.layout.name());
    let xattrs: Vec<Value> = img
        .xattrs(&ino)?
        .iter()
        .map(|x| json!({"name": bytes_display(&x.name), "value_hex": hex(&x.value), "value": bytes_display(&x.value)}))
        .collect();
    v["xattrs"] = json!(xattrs);
    v["xattr_shared_ids"] = json!(img.xattr_shared_ids(&ino)?);
    v["xattr_isize"] = json!(ferofs_format::inode::xattr_ibody_size(ino.xattr_icount));
    let fingerprint = img
        .fingerprint(&ino)?
        .map(|f| match f.strip_prefix(b"sha256:") {
            Some(d) => format!("sha256:{}", hex(d)),
            None => bytes_display(&f),
        });
    v["fingerprint"] = json!(fingerprint);
    let extents: Vec<Value> = img
        .extents(&ino)?
        .iter()
        .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
        .collect();
    v["extents"] = json!(extents);
    let mut out = std::io::stdout().lock();
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    writeln!(out, "  File: {path}")?;
    writeln!(
        out,
        "  Type: {}   Size: {}   Links: {}",
        type_name(ino.mode),
        ino.size,
        ino.nlink
    )?;
    writeln!(
        out,
        "   Nid: {}   Ino: {}   Inode: {}   Layout: {}",
        ino.nid,
        ino.ino,
        if ino.extended { "extended" } else { "compact" },
        ino.layout.name()
    )?;
    writeln!(
        out,
        "Access: ({:04o}/{})  Uid: {}  Gid: {}",
        ino.mode & 0o7777,
        mode_string(ino.mode),
        ino.uid,
        ino.gid
    )?;
    writeln!(out, "Modify: {}", time_string(ino.mtime, ino.mtime_nsec))?;
    if ino.is_device() {
        let (ma, mi) = ino.rdev_major_minor();
        writeln!(out, "Device: {ma}, {mi}")?;
    }
    if ino.is_symlink() {
        writeln!(out, "Target: {}", bytes_display(&img.read_link(&ino)?))?;
    }
    for x in img.xattrs(&ino)? {
        writeln!(
            out,
            " Xattr: {} = {}",
            bytes_display(&x.name),
            bytes_display(&x.value)
        )?;
    }
    if let Some(f) = &fingerprint {
        writeln!(out, "Fingerprint: {f}")?;
    }
    for e in img.extents(&ino)? {
        writeln!(out, "Extent: {e}")?;
    }
    Ok(())
}

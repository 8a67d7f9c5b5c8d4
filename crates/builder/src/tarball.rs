//! Stage 1 for tar input: one or more tar streams (a layer stack) become a [`Tree`].
//!
//! Headers: ustar, GNU (long names `L`/`K`, old sparse `S`) and PAX (`x`, `g`: path,
//! linkpath, size, uid, gid, mtime with nanoseconds, `SCHILY.xattr.*`,
//! `LIBARCHIVE.xattr.*`, `SCHILY.acl.*` text ACLs, GNU sparse 0.0 / 0.1 / 1.0);
//! numbers in octal or base-256. The parser is our own, not the `tar` crate's: the
//! builder needs each entry's data offset and sparse map as they are, which that
//! crate does not expose.
//!
//! Data: an uncompressed tar in a regular file is read in place (a file's [`Source`]
//! is a byte range of the tar); any other stream (compressed, stdin) has its file
//! contents copied to a spool file beside the output (only data segments of sparse
//! files), removed when the build ends. Memory holds metadata only.
//!
//! Tree rules: a leading `/` and `.` components are dropped, `..` is refused; a
//! repeated path replaces the earlier entry (a directory over a directory keeps the
//! children); a hardlink names the inode its target has at that point of the stream;
//! directories that appear only as parents get mode 0755, owner 0:0 and the newest
//! mtime of the input. With `aufs`, `.wh.NAME` becomes an overlayfs whiteout (char 0:0,
//! mode 0, owner and mtime of the `.wh.` entry; the parent gets an empty
//! `trusted.overlay.origin`, as mkfs.erofs 1.9.3 does) and
//! `.wh..wh..opq` sets `trusted.overlay.opaque=y` on its directory. With more than one
//! layer the stack is flattened: each layer's whiteouts remove what earlier layers
//! put there, an opaque directory drops the earlier layers' children, and no whiteout
//! is left in the image.

use crate::options::*;
use crate::scan::{fix_nlinks, InodeId, Kind, Node, Tree};
use crate::source::{Segment, Source};
use ferofs_format::inode::*;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tar stream: a file (`-` for stdin).
#[derive(Debug, Clone)]
pub enum TarInput {
    File(PathBuf),
    Stdin,
}

impl TarInput {
    pub fn parse(s: &std::ffi::OsStr) -> TarInput {
        if s == "-" {
            TarInput::Stdin
        } else {
            TarInput::File(PathBuf::from(s))
        }
    }
    fn shown(&self) -> PathBuf {
        match self {
            TarInput::File(p) => p.clone(),
            TarInput::Stdin => PathBuf::from("(stdin)"),
        }
    }
}

/// What a tar scan holds on to until the image is written: the spool files.
pub struct TarTree {
    pub tree: Tree,
    pub spools: Vec<tempfile::NamedTempFile>,
    /// By node: a directory the input only implied (a parent of its entries, no entry
    /// of its own): its metadata is made up, and a layer under it keeps its own.
    pub implicit: Vec<bool>,
}

/// Longest GNU long name / link name, PAX header, and ACL text accepted.
const MAX_LONGNAME: u64 = 1 << 20;
const MAX_PAX: u64 = 16 << 20;
/// Deepest path accepted.
const MAX_DEPTH: usize = 4096;
pub(crate) const OVL_OPAQUE: &[u8] = b"trusted.overlay.opaque";
pub(crate) const OVL_ORIGIN: &[u8] = b"trusted.overlay.origin";

/// An overlayfs whiteout: a character device 0:0.
pub(crate) fn is_whiteout(n: &Node) -> bool {
    matches!(n.kind, Kind::Device { rdev: 0 }) && n.mode & S_IFMT == S_IFCHR
}

#[derive(Debug, Clone)]
enum TKind {
    Dir(BTreeMap<Vec<u8>, Dent>),
    File { src: Source, size: u64 },
    Symlink(Vec<u8>),
    Device(u32),
    Fifo,
}

#[derive(Debug, Clone, Copy)]
struct Dent {
    id: usize,
    layer: usize,
}

#[derive(Debug, Clone)]
struct TNode {
    kind: TKind,
    mode: u16,
    uid: u32,
    gid: u32,
    mtime: i64,
    nsec: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Made as a parent only (no entry of its own yet).
    implicit: bool,
}

struct Arena {
    nodes: Vec<TNode>,
    newest: (i64, u32),
    aufs: bool,
    flatten: bool,
    /// `--ovlfs-strip`: no `trusted.overlay.origin` for whiteouts' parents.
    strip: bool,
    /// `--tar-headerball`: regular files' data is not in the stream.
    headerball: bool,
}

fn invalid(path: impl Into<PathBuf>, what: impl Into<String>) -> BuildError {
    BuildError::Invalid {
        path: path.into(),
        what: what.into(),
    }
}

/// Scan tar streams (a layer stack when there are several) into a tree. Spools go in
/// `spool_dir`.
pub fn scan_tars(inputs: &[TarInput], spool_dir: &Path, opts: &BuildOptions) -> Result<TarTree> {
    if inputs.is_empty() {
        return Err(BuildError::Options("no tar input".into()));
    }
    let mut a = Arena {
        nodes: vec![TNode {
            kind: TKind::Dir(BTreeMap::new()),
            mode: S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            nsec: 0,
            xattrs: BTreeMap::new(),
            implicit: true,
        }],
        newest: (i64::MIN, 0),
        aufs: opts.aufs,
        flatten: inputs.len() > 1,
        strip: opts.ovlfs_strip,
        headerball: opts.tar_headerball,
    };
    if opts.tar_index {
        if inputs.len() != 1 {
            return Err(BuildError::Options(
                "tar index mode takes one tar (it becomes the image's extra device)".into(),
            ));
        }
        if opts.block_size != 512 {
            return Err(BuildError::Options(format!(
                "tar index mode needs 512-byte blocks (tar data is 512-byte aligned), not {}",
                opts.block_size
            )));
        }
    }
    let mut spools = Vec::new();
    let mut tar_len = 0;
    for (layer, input) in inputs.iter().enumerate() {
        let (s, len) = read_layer(
            &mut a,
            input,
            layer,
            spool_dir,
            opts.tar_index,
            opts.reserve_data,
            &opts.progress,
        )?;
        spools.extend(s);
        tar_len = len;
    }
    let (mut tree, implicit) = a.finish(opts)?;
    if opts.tar_index {
        tree.devices = vec![crate::scan::Device::untagged(tar_len.div_ceil(512))];
    }
    Ok(TarTree {
        tree,
        spools,
        implicit,
    })
}

/// Where an input's file data goes.
enum Sink {
    /// The tar itself (uncompressed, seekable): data stays where it is.
    InPlace(Arc<Path>),
    /// Index mode: the tar is the image's extra device 1; data is only pointed at.
    Index,
    /// `--reserve-data`: the data is skipped; the image reserves its blocks.
    Reserve,
    Spool {
        path: Arc<Path>,
        w: BufWriter<std::fs::File>,
        len: u64,
    },
}

/// The most an `.lzma` stream's decoder may take (its dictionary): more is an error,
/// not an allocation (xz's own default for `--format=lzma` is 8 MiB, its largest
/// preset 64 MiB).
const LZMA_MEMLIMIT: u64 = 1 << 30;

/// The compression of a tar stream that starts with `head` (its first bytes, 13 or
/// more): `gzip`, `xz`, `zstd`, `bzip2` or `lzma` by magic or header, else `none`.
pub fn stream_compression(head: &[u8]) -> &'static str {
    if head.starts_with(&[0x1f, 0x8b]) {
        "gzip"
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        "xz"
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "zstd"
    } else if head.starts_with(b"BZh") {
        "bzip2"
    } else if lzma_alone(head) {
        "lzma"
    } else {
        "none"
    }
}

/// A `.lzma` (LZMA-alone) header: it has no magic, so its fields must hold what
/// encoders write: properties below 225, a dictionary of 2^n or 2^n + 2^(n-1) bytes
/// (4 KiB up; or all ones) and an uncompressed size that a tar can have (all ones:
/// unknown, as xz writes it; or a multiple of 512 bytes). A tar does not start so:
/// the dictionary needs a zero byte before a non-zero one inside the first name,
/// which tar writers pad with zeros after its end only.
fn lzma_alone(head: &[u8]) -> bool {
    let Some(h) = head.get(..13) else {
        return false;
    };
    let dict = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
    let size = u64::from_le_bytes([h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12]]);
    let pow = |d: u32| d.is_power_of_two() || (d.is_multiple_of(3) && (d / 3).is_power_of_two());
    h[0] < 225
        && (dict == u32::MAX || dict >= 4096 && pow(dict))
        && (size == u64::MAX || ((512..1 << 48).contains(&size) && size.is_multiple_of(512)))
}

fn read_layer(
    a: &mut Arena,
    input: &TarInput,
    layer: usize,
    spool_dir: &Path,
    index: bool,
    reserve: bool,
    progress: &Option<Arc<crate::Progress>>,
) -> Result<(Option<tempfile::NamedTempFile>, u64)> {
    let shown = input.shown();
    let peek = |b: &mut dyn BufRead| -> Result<Vec<u8>> {
        Ok(b.fill_buf().map_err(io_err(&shown, "tar: read"))?.to_vec())
    };
    let decoder = |comp: &str, r: Box<dyn BufRead>| -> Result<Box<dyn Read>> {
        Ok(match comp {
            "gzip" => Box::new(flate2::read::MultiGzDecoder::new(r)),
            "xz" => Box::new(liblzma::read::XzDecoder::new_multi_decoder(r)),
            "lzma" => Box::new(liblzma::read::XzDecoder::new_stream(
                r,
                liblzma::stream::Stream::new_lzma_decoder(LZMA_MEMLIMIT)
                    .map_err(|e| invalid(&shown, format!("tar: lzma: {e}")))?,
            )),
            "zstd" => Box::new(
                zstd::stream::read::Decoder::with_buffer(r).map_err(io_err(&shown, "tar: zstd"))?,
            ),
            "bzip2" => Box::new(bzip2::read::MultiBzDecoder::new(r)),
            _ => Box::new(r),
        })
    };
    let (stream, comp, in_place) = match input {
        TarInput::File(p) => {
            let f = std::fs::File::open(p).map_err(io_err(p, "tar: open"))?;
            let md = f.metadata().map_err(io_err(p, "tar: stat"))?;
            let mut b = std::io::BufReader::with_capacity(1 << 20, f);
            let comp = stream_compression(&peek(&mut b)?);
            if comp == "none" && md.is_file() {
                let canon = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
                (In::File(b, md.len()), comp, Some(canon))
            } else {
                (In::Stream(decoder(comp, Box::new(b))?), comp, None)
            }
        }
        TarInput::Stdin => {
            let mut b = std::io::BufReader::with_capacity(1 << 20, std::io::stdin());
            let comp = stream_compression(&peek(&mut b)?);
            (In::Stream(decoder(comp, Box::new(b))?), comp, None)
        }
    };
    if index && comp != "none" {
        return Err(invalid(
            &shown,
            format!("tar index mode needs an uncompressed tar (this is {comp}): the image points into it"),
        ));
    }
    let (mut sink, spool) = match in_place {
        _ if index => (Sink::Index, None),
        // Headerballs have no data to reserve space for (as mkfs.erofs, whose
        // --tar=headerball wins over --clean=rvsp).
        _ if reserve && !a.headerball => (Sink::Reserve, None),
        Some(p) => (Sink::InPlace(Arc::from(p.as_path())), None),
        None => {
            let t = crate::cleanup::scratch(spool_dir, ".ferofs-spool-")
                .map_err(io_err(spool_dir, "tar: create spool"))?;
            let f = t.reopen().map_err(io_err(t.path(), "tar: open spool"))?;
            (
                Sink::Spool {
                    path: Arc::from(t.path()),
                    w: BufWriter::with_capacity(1 << 20, f),
                    len: 0,
                },
                Some(t),
            )
        }
    };
    let mut r = TarStream {
        r: stream,
        progress: progress.clone(),
        pos: 0,
        shown: shown.clone(),
        comp,
    };
    parse(a, &mut r, &mut sink, layer)?;
    if let Sink::Spool { w, path, .. } = &mut sink {
        w.flush().map_err(io_err(path, "tar: write spool"))?;
    }
    // The archive's length (index mode: the device's size): a file's, or what is
    // left of the stream read to its end.
    let len = match &r.r {
        In::File(_, len) => *len,
        In::Stream(_) => {
            let mut buf = vec![0u8; 64 << 10];
            // Bounded by the stream.
            while r.fill(&mut buf)? > 0 {}
            r.pos
        }
    };
    Ok((spool, len))
}

/// The uncompressed tar: a regular file (seekable, its length known) or a stream.
enum In {
    File(std::io::BufReader<std::fs::File>, u64),
    Stream(Box<dyn Read>),
}

struct TarStream {
    r: In,
    /// The CLI's progress: bytes of the tar scanned.
    progress: Option<Arc<crate::Progress>>,
    /// Bytes of the (uncompressed) tar consumed.
    pos: u64,
    shown: PathBuf,
    comp: &'static str,
}

impl TarStream {
    /// Read up to `buf.len()` bytes; fewer only at the end of the stream.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            let got = match &mut self.r {
                In::File(f, _) => f.read(&mut buf[n..]),
                In::Stream(s) => s.read(&mut buf[n..]),
            };
            match got {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(invalid(
                        &self.shown,
                        format!(
                            "reading the {} stream at tar byte {}: {e}",
                            self.comp,
                            self.pos + n as u64
                        ),
                    ))
                }
            }
        }
        self.pos += n as u64;
        if let Some(p) = &self.progress {
            p.add_scanned(n as u64);
        }
        Ok(n)
    }

    /// Exactly `buf.len()` bytes, or a truncation error naming `what`.
    fn exact(&mut self, buf: &mut [u8], what: &dyn Fn() -> String) -> Result<()> {
        let at = self.pos;
        let n = self.fill(buf)?;
        if n < buf.len() {
            return Err(invalid(
                &self.shown,
                format!(
                    "truncated archive: {} ends at tar byte {} ({} of {} bytes from byte {at})",
                    what(),
                    self.pos,
                    n,
                    buf.len()
                ),
            ));
        }
        Ok(())
    }

    /// Skip `n` bytes (data not kept): a seek in a file, else reading them.
    fn skip(&mut self, mut n: u64, what: &dyn Fn() -> String) -> Result<()> {
        if let In::File(f, len) = &mut self.r {
            let end = self.pos.checked_add(n).filter(|e| e <= len);
            let Some(end) = end.filter(|&e| i64::try_from(e).is_ok()) else {
                return Err(invalid(
                    &self.shown,
                    format!(
                        "truncated archive: {} needs {n} bytes from tar byte {}, the archive has {len}",
                        what(),
                        self.pos
                    ),
                ));
            };
            f.seek_relative(n as i64)
                .map_err(io_err(&self.shown, "tar: seek"))?;
            if let Some(p) = &self.progress {
                p.add_scanned(n);
            }
            self.pos = end;
            return Ok(());
        }
        let mut buf = vec![0u8; 64 << 10];
        // Bounded: each pass consumes up to 64 KiB or fails.
        while n > 0 {
            let k = n.min(buf.len() as u64) as usize;
            self.exact(&mut buf[..k], what)?;
            n -= k as u64;
        }
        Ok(())
    }

    /// Read `n` bytes (n already bounded by the caller) into a vector.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        let mut v = vec![0u8; n as usize];
        self.exact(&mut v, what)?;
        Ok(v)
    }
}

fn pad512(n: u64) -> u64 {
    n.div_ceil(512).saturating_mul(512)
}

/// A numeric header field: octal (spaces/NULs around), or base-256 (first byte
/// 0x80 positive, 0xff negative).
fn num(f: &[u8]) -> Option<i64> {
    match f.first() {
        Some(&b) if b & 0x80 != 0 => {
            let neg = b == 0xff;
            let mut v: i128 = if neg { -1 } else { i128::from(b & 0x7f) };
            for &c in &f[1..] {
                v = v.checked_mul(256)?.checked_add(i128::from(c))?;
            }
            i64::try_from(v).ok()
        }
        _ => {
            let s: Vec<u8> = f
                .iter()
                .copied()
                .skip_while(|&c| c == b' ')
                .take_while(|&c| c != 0 && c != b' ')
                .collect();
            if s.is_empty() {
                return Some(0);
            }
            let mut v: i64 = 0;
            for c in s {
                if !(b'0'..=b'7').contains(&c) {
                    return None;
                }
                v = v.checked_mul(8)?.checked_add(i64::from(c - b'0'))?;
            }
            Some(v)
        }
    }
}

fn cstr(f: &[u8]) -> &[u8] {
    let n = f.iter().position(|&c| c == 0).unwrap_or(f.len());
    &f[..n]
}

/// PAX `mtime`: `[-]SECONDS[.FRACTION]`.
fn pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let (i, f) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = i.parse().ok()?;
    let mut frac = f.chars().take(9).collect::<String>();
    if !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    while frac.len() < 9 {
        frac.push('0');
    }
    let ns: u32 = frac.parse().ok()?;
    if !neg {
        return Some((secs, ns));
    }
    if ns == 0 {
        Some((secs.checked_neg()?, 0))
    } else {
        Some((secs.checked_neg()?.checked_sub(1)?, 1_000_000_000 - ns))
    }
}

/// Records of a PAX header: `LEN KEY=VALUE\n`, repeated keys kept in order.
fn pax_records(data: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut v = Vec::new();
    let mut rest = data;
    // Bounded: each record consumes at least one byte.
    while !rest.is_empty() && rest[0] != 0 {
        let sp = rest.iter().position(|&c| c == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return None;
        }
        let rec = &rest[sp + 1..len - 1];
        let eq = rec.iter().position(|&c| c == b'=')?;
        v.push((rec[..eq].to_vec(), rec[eq + 1..].to_vec()));
        rest = &rest[len..];
    }
    Some(v)
}

fn base64(s: &[u8]) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s: Vec<u8> = s.iter().copied().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for ch in s.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in ch.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..ch.len()]);
    }
    Some(out)
}

fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let Ok(b) = u8::from_str_radix(&String::from_utf8_lossy(&s[i + 1..i + 3]), 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// Look a user or group name up in the host's /etc/passwd or /etc/group.
fn lookup_id(file: &str, name: &[u8]) -> Option<u32> {
    let text = std::fs::read(file).ok()?;
    text.split(|&c| c == b'\n').find_map(|l| {
        let mut f = l.split(|&c| c == b':');
        (f.next()? == name).then_some(())?;
        f.next()?;
        std::str::from_utf8(f.next()?).ok()?.parse().ok()
    })
}

/// A text ACL (`user::rw-\nuser:NAME:r--\n...`, as GNU tar writes `SCHILY.acl.*`)
/// as the `system.posix_acl_*` xattr value.
fn acl_xattr(text: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut ents: Vec<(u16, u16, u32)> = Vec::new();
    for item in text.split(|&c| c == b'\n' || c == b',') {
        let item = item.split(|&c| c == b'#').next().unwrap_or(&[]);
        let item: &[u8] = item.trim_ascii();
        if item.is_empty() {
            continue;
        }
        let f: Vec<&[u8]> = item.split(|&c| c == b':').collect();
        if f.len() < 3 {
            return Err(format!("ACL entry {:?}", String::from_utf8_lossy(item)));
        }
        let (tag, qual, perms) = (f[0], f[1], f[2]);
        let mut p = 0u16;
        for (i, &c) in perms.iter().enumerate() {
            match (i, c) {
                (0, b'r') => p |= 4,
                (1, b'w') => p |= 2,
                (2, b'x') => p |= 1,
                (_, b'-') => {}
                _ => {
                    return Err(format!(
                        "ACL permissions {:?}",
                        String::from_utf8_lossy(perms)
                    ))
                }
            }
        }
        // A numeric id may follow as a fourth field (star's format).
        let id = |db: &str| -> std::result::Result<u32, String> {
            if let Some(n) = f
                .get(3)
                .and_then(|s| std::str::from_utf8(s).ok()?.parse().ok())
            {
                return Ok(n);
            }
            if let Some(n) = std::str::from_utf8(qual).ok().and_then(|s| s.parse().ok()) {
                return Ok(n);
            }
            lookup_id(db, qual).ok_or_else(|| {
                format!(
                    "ACL names {:?}, which is neither a number nor in {db}",
                    String::from_utf8_lossy(qual)
                )
            })
        };
        let e = match (tag, qual.is_empty()) {
            (b"user" | b"u", true) => (0x01, p, u32::MAX),
            (b"user" | b"u", false) => (0x02, p, id("/etc/passwd")?),
            (b"group" | b"g", true) => (0x04, p, u32::MAX),
            (b"group" | b"g", false) => (0x08, p, id("/etc/group")?),
            (b"mask" | b"m", _) => (0x10, p, u32::MAX),
            (b"other" | b"o", _) => (0x20, p, u32::MAX),
            _ => return Err(format!("ACL tag {:?}", String::from_utf8_lossy(tag))),
        };
        ents.push(e);
    }
    ents.sort_by_key(|&(t, _, id)| (t, id));
    let mut v = 2u32.to_le_bytes().to_vec();
    for (t, p, id) in ents {
        v.extend_from_slice(&t.to_le_bytes());
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    Ok(v)
}

/// One entry's header, with what PAX and GNU extensions said.
#[derive(Default)]
struct Ext {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u32>,
    gid: Option<u32>,
    mtime: Option<(i64, u32)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    acl_access: Option<Vec<u8>>,
    acl_default: Option<Vec<u8>>,
    devmajor: Option<u32>,
    devminor: Option<u32>,
    sparse_name: Option<Vec<u8>>,
    sparse_realsize: Option<u64>,
    sparse_major: Option<u64>,
    sparse_minor: Option<u64>,
    /// 0.0: offset/numbytes pairs; 0.1: the map.
    sparse_map: Vec<u64>,
}

impl Ext {
    fn apply(&mut self, recs: Vec<(Vec<u8>, Vec<u8>)>) -> std::result::Result<(), String> {
        let n = |v: &[u8]| -> std::result::Result<u64, String> {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("PAX number {:?}", String::from_utf8_lossy(v)))
        };
        let id = |v: &[u8]| -> std::result::Result<u32, String> {
            u32::try_from(n(v)?).map_err(|_| "PAX uid/gid beyond 2^32".to_string())
        };
        for (k, v) in recs {
            match k.as_slice() {
                b"path" => self.path = Some(v),
                b"linkpath" => self.link = Some(v),
                b"size" => self.size = Some(n(&v)?),
                b"uid" => self.uid = Some(id(&v)?),
                b"gid" => self.gid = Some(id(&v)?),
                b"mtime" => {
                    self.mtime =
                        Some(pax_time(&v).ok_or_else(|| {
                            format!("PAX mtime {:?}", String::from_utf8_lossy(&v))
                        })?)
                }
                b"SCHILY.devmajor" => self.devmajor = Some(id(&v)?),
                b"SCHILY.devminor" => self.devminor = Some(id(&v)?),
                b"SCHILY.acl.access" => self.acl_access = Some(v),
                b"SCHILY.acl.default" => self.acl_default = Some(v),
                b"GNU.sparse.name" => self.sparse_name = Some(v),
                b"GNU.sparse.realsize" | b"GNU.sparse.size" => self.sparse_realsize = Some(n(&v)?),
                b"GNU.sparse.major" => self.sparse_major = Some(n(&v)?),
                b"GNU.sparse.minor" => self.sparse_minor = Some(n(&v)?),
                b"GNU.sparse.offset" | b"GNU.sparse.numbytes" => self.sparse_map.push(n(&v)?),
                b"GNU.sparse.map" => {
                    self.sparse_map.clear();
                    for x in v.split(|&c| c == b',').filter(|x| !x.is_empty()) {
                        self.sparse_map.push(n(x)?);
                    }
                }
                _ => {
                    if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                        self.xattrs.push((name.to_vec(), v));
                    } else if let Some(name) = k.strip_prefix(b"LIBARCHIVE.xattr.") {
                        let val = base64(&v).ok_or("LIBARCHIVE.xattr value is not base64")?;
                        self.xattrs.push((percent_decode(name), val));
                    }
                    // Other keywords (atime, ctime, uname, comments...) do not
                    // change the tree.
                }
            }
        }
        Ok(())
    }
}

/// Split a tar path into components: a leading `/` and `.` dropped, `..` refused.
fn components(p: &[u8]) -> std::result::Result<Vec<&[u8]>, String> {
    let mut v = Vec::new();
    for c in p.split(|&c| c == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err("path has a \"..\" component (refused: it could leave the root)".into())
            }
            _ if c.len() > ferofs_format::MAX_NAME_LEN => {
                return Err("name longer than 255 bytes".into())
            }
            _ => v.push(c),
        }
    }
    if v.len() > MAX_DEPTH {
        return Err("path nested too deep".into());
    }
    Ok(v)
}

fn parse(a: &mut Arena, r: &mut TarStream, sink: &mut Sink, layer: usize) -> Result<()> {
    let mut global = Ext::default();
    let mut ext = Ext::default();
    let mut have_ext = false;
    let mut last_name = String::from("(none: the first header)");
    let mut hdr = [0u8; 512];
    // Bounded by the stream: every pass consumes at least one 512-byte block.
    loop {
        let at = r.pos;
        let n = r.fill(&mut hdr)?;
        if n == 0 {
            if have_ext {
                return Err(invalid(
                    &r.shown,
                    format!("truncated archive: an extended header at tar byte {at} has no entry (after {last_name})"),
                ));
            }
            break; // No end-of-archive blocks: accepted, as GNU tar does.
        }
        if n < 512 {
            return Err(invalid(
                &r.shown,
                format!("truncated archive: header at tar byte {at} has {n} of 512 bytes (after {last_name})"),
            ));
        }
        if hdr.iter().all(|&b| b == 0) {
            break;
        }
        let shown = r.shown.clone();
        let prev = last_name.clone();
        let bad = |what: String| {
            invalid(
                &shown,
                format!("header at tar byte {at} (after {prev}): {what}"),
            )
        };
        // Checksum: the sum of the header with its checksum field as spaces.
        let want =
            num(&hdr[148..156]).ok_or_else(|| bad("checksum field is not a number".into()))?;
        let mut sum_u: i64 = 0;
        let mut sum_s: i64 = 0;
        for (i, &b) in hdr.iter().enumerate() {
            let b = if (148..156).contains(&i) { b' ' } else { b };
            sum_u += i64::from(b);
            sum_s += i64::from(b as i8);
        }
        if want != sum_u && want != sum_s {
            return Err(bad(format!(
                "bad header checksum ({want}, computed {sum_u}): not a tar archive, or corrupt"
            )));
        }
        let typ = hdr[156];
        let posix = &hdr[257..263] == b"ustar\0";
        let field = |r: std::ops::Range<usize>, what: &str| -> Result<i64> {
            num(&hdr[r]).ok_or_else(|| bad(format!("{what} field is not a number")))
        };
        let hsize = field(124..136, "size")?;
        let hsize = u64::try_from(hsize).map_err(|_| bad("negative size".into()))?;
        let what_data = || format!("data of the extended header at tar byte {at}");
        match typ {
            b'x' | b'g' | b'L' | b'K' => {
                let limit = if matches!(typ, b'L' | b'K') {
                    MAX_LONGNAME
                } else {
                    MAX_PAX
                };
                if hsize > limit {
                    return Err(bad(format!(
                        "extended header of {hsize} bytes (at most {limit} accepted)"
                    )));
                }
                let data = r.take(hsize, &what_data)?;
                r.skip(pad512(hsize) - hsize, &what_data)?;
                match typ {
                    b'L' => ext.path = Some(cstr(&data).to_vec()),
                    b'K' => ext.link = Some(cstr(&data).to_vec()),
                    _ => {
                        let recs = pax_records(&data)
                            .ok_or_else(|| bad("malformed PAX records".into()))?;
                        let target = if typ == b'g' { &mut global } else { &mut ext };
                        target.apply(recs).map_err(bad)?;
                    }
                }
                have_ext |= typ != b'g';
                continue;
            }
            _ => {}
        }
        // The entry's name.
        let mut name = match (&ext.sparse_name, &ext.path) {
            (Some(n), _) => n.clone(),
            (None, Some(p)) => p.clone(),
            (None, None) => {
                let base = cstr(&hdr[0..100]);
                let prefix = cstr(&hdr[345..500]);
                if posix && !prefix.is_empty() {
                    let mut v = prefix.to_vec();
                    v.push(b'/');
                    v.extend_from_slice(base);
                    v
                } else {
                    base.to_vec()
                }
            }
        };
        if typ == b'5' && !name.ends_with(b"/") {
            name.push(b'/');
        }
        last_name = format!("entry {:?}", String::from_utf8_lossy(&name));
        let entry = String::from_utf8_lossy(&name).into_owned();
        let ebad = |what: String| {
            invalid(
                &shown,
                format!("entry {entry:?} (header at tar byte {at}): {what}"),
            )
        };
        let mode = (field(100..108, "mode")? & 0o7777) as u16;
        let uid = match ext.uid.or(global.uid) {
            Some(u) => u,
            None => u32::try_from(field(108..116, "uid")?)
                .map_err(|_| ebad("uid out of range".into()))?,
        };
        let gid = match ext.gid.or(global.gid) {
            Some(g) => g,
            None => u32::try_from(field(116..124, "gid")?)
                .map_err(|_| ebad("gid out of range".into()))?,
        };
        let (mtime, nsec) = match ext.mtime.or(global.mtime) {
            Some(t) => t,
            None => (field(136..148, "mtime")?, 0),
        };
        let size = ext.size.unwrap_or(hsize);
        let link = match &ext.link {
            Some(l) => l.clone(),
            None => cstr(&hdr[157..257]).to_vec(),
        };
        let mut xattrs: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for (k, v) in global.xattrs.iter().chain(&ext.xattrs) {
            xattrs.insert(k.clone(), v.clone());
        }
        for (key, text) in [
            (&b"system.posix_acl_access"[..], &ext.acl_access),
            (&b"system.posix_acl_default"[..], &ext.acl_default),
        ] {
            if let Some(t) = text {
                if !xattrs.contains_key(key) && !t.is_empty() {
                    let v = acl_xattr(t).map_err(ebad)?;
                    // An access ACL of the owner, group and other entries only is the
                    // mode itself: the kernel keeps no xattr for it.
                    let minimal = v.len() == 4 + 3 * 8
                        && key == b"system.posix_acl_access"
                        && v[4..].chunks(8).all(|e| matches!(e[0], 0x01 | 0x04 | 0x20));
                    if !minimal {
                        xattrs.insert(key.to_vec(), v);
                    }
                }
            }
        }
        for (k, v) in &xattrs {
            if ferofs_format::xattr::split_name(k).is_none() {
                return Err(ebad(format!(
                    "xattr {} has a namespace EROFS cannot store",
                    String::from_utf8_lossy(k)
                )));
            }
            if v.len() > usize::from(u16::MAX) {
                return Err(ebad("xattr value larger than 65535 bytes".into()));
            }
        }
        let data_what = || format!("entry {entry:?}: its data");
        let data_at = r.pos;
        // What the entry is, consuming its data.
        let kind = match typ {
            b'0' | 0 | b'7' | b'S' => {
                let pax_sparse = ext.sparse_major.is_some()
                    || !ext.sparse_map.is_empty()
                    || ext.sparse_realsize.is_some();
                if (typ == b'S' || pax_sparse) && matches!(sink, Sink::Index) {
                    return Err(ebad(
                        "a sparse file cannot be pointed at in tar index mode (its data is not laid out as the file)".into(),
                    ));
                }
                if (typ == b'S' || pax_sparse) && matches!(sink, Sink::Reserve) {
                    return Err(ebad(
                        "a sparse file cannot have its space reserved (--reserve-data): its data is not laid out in the tar as in the file".into(),
                    ));
                }
                if (typ == b'S' || pax_sparse) && a.headerball {
                    return Err(ebad(
                        "a sparse file in a headerball (its map is data the headerball leaves out)"
                            .into(),
                    ));
                }
                if a.headerball {
                    // No data follows the header: the file is its size of zeros, a
                    // hole (mkfs.erofs's --tar=headerball).
                    TKind::File {
                        src: Source::Sparse {
                            file: sink_path(sink),
                            segs: Vec::new().into(),
                        },
                        size,
                    }
                } else if typ == b'S' || pax_sparse {
                    let (segs, real) =
                        read_sparse_map(r, &hdr, typ == b'S', &ext, size, &data_what, &ebad)?;
                    // GNU `S` extension blocks come before the data and are not in its
                    // size; a PAX 1.0 map is at the start of the data.
                    let consumed = if typ == b'S' { 0 } else { r.pos - data_at };
                    let stored = segs
                        .iter()
                        .try_fold(0u64, |a, s| a.checked_add(s.1))
                        .ok_or_else(|| ebad("sparse map sizes overflow".into()))?;
                    if stored > size.saturating_sub(consumed) {
                        return Err(ebad(format!(
                            "sparse map holds {stored} bytes of data, the entry {}",
                            size.saturating_sub(consumed)
                        )));
                    }
                    let mut out = Vec::with_capacity(segs.len());
                    let mut prev_end = 0u64;
                    for &(off, len) in &segs {
                        let end = off.checked_add(len).filter(|&e| e <= real);
                        if off < prev_end || end.is_none() {
                            return Err(ebad(format!("sparse map segment {off}+{len} out of order or beyond the size {real}")));
                        }
                        prev_end = off + len;
                        let at = store(r, sink, len, &data_what)?;
                        out.push(Segment {
                            start: off,
                            len,
                            at,
                        });
                    }
                    let left = size.saturating_sub(consumed).saturating_sub(stored);
                    r.skip(left + pad512(size) - size, &data_what)?;
                    let file = sink_path(sink);
                    TKind::File {
                        src: Source::Sparse {
                            file,
                            segs: out.into(),
                        },
                        size: real,
                    }
                } else {
                    let at = store(r, sink, size, &data_what)?;
                    r.skip(pad512(size) - size, &data_what)?;
                    TKind::File {
                        src: sink_source(sink, at),
                        size,
                    }
                }
            }
            b'1' => {
                if !a.headerball {
                    r.skip(pad512(size), &data_what)?;
                }
                let comps = components(&name).map_err(ebad)?;
                let target =
                    components(&link).map_err(|e| ebad(format!("hardlink target: {e}")))?;
                a.hardlink(&comps, &target, layer).map_err(ebad)?;
                a.note_time(mtime, nsec);
                ext = Ext::default();
                have_ext = false;
                continue;
            }
            b'2' => {
                if link.is_empty() || link.len() > 4095 {
                    return Err(ebad(format!(
                        "symlink target of {} bytes (1..=4095 allowed)",
                        link.len()
                    )));
                }
                TKind::Symlink(link)
            }
            b'3' | b'4' => {
                let major = match ext.devmajor {
                    Some(m) => i64::from(m),
                    None => field(329..337, "devmajor")?,
                };
                let minor = match ext.devminor {
                    Some(m) => i64::from(m),
                    None => field(337..345, "devminor")?,
                };
                if !(0..=0xfff).contains(&major) || !(0..=0xfffff).contains(&minor) {
                    return Err(ebad(format!("device number {major}:{minor} does not fit")));
                }
                TKind::Device(encode_rdev(major as u32, minor as u32))
            }
            b'5' => TKind::Dir(BTreeMap::new()),
            b'6' => TKind::Fifo,
            b'D' => {
                // GNU dumpdir: a directory with a listing as data.
                r.skip(pad512(size), &data_what)?;
                TKind::Dir(BTreeMap::new())
            }
            b'V' => {
                r.skip(pad512(size), &data_what)?;
                ext = Ext::default();
                have_ext = false;
                continue;
            }
            t => {
                return Err(ebad(format!(
                    "entry type {:?} is not supported (multi-volume and other special archives)",
                    char::from(t)
                )))
            }
        };
        let ftype = match &kind {
            TKind::Dir(_) => S_IFDIR,
            TKind::File { .. } => S_IFREG,
            TKind::Symlink(_) => S_IFLNK,
            TKind::Device(_) if typ == b'3' => S_IFCHR,
            TKind::Device(_) => S_IFBLK,
            TKind::Fifo => S_IFIFO,
        };
        let node = TNode {
            kind,
            mode: ftype | mode,
            uid,
            gid,
            mtime,
            nsec,
            xattrs,
            implicit: false,
        };
        a.note_time(mtime, nsec);
        let comps = components(&name).map_err(ebad)?;
        a.put(&comps, node, layer).map_err(ebad)?;
        ext = Ext::default();
        have_ext = false;
    }
    Ok(())
}

/// The source of `size` bytes stored at `at` (see [`store`]).
fn sink_source(s: &Sink, at: u64) -> Source {
    match s {
        Sink::InPlace(p) | Sink::Spool { path: p, .. } => Source::Range {
            file: p.clone(),
            at,
        },
        Sink::Reserve => Source::Reserved { at },
        Sink::Index => Source::External {
            device: 1,
            blkaddr: at / 512,
            tail: None,
        },
    }
}

fn sink_path(s: &Sink) -> Arc<Path> {
    match s {
        Sink::InPlace(p) | Sink::Spool { path: p, .. } => p.clone(),
        Sink::Index | Sink::Reserve => Arc::from(Path::new("(tar)")),
    }
}

/// Consume `len` bytes of file data: in place, note where they are; else copy them
/// to the spool. Returns their offset in the backing file.
fn store(r: &mut TarStream, sink: &mut Sink, len: u64, what: &dyn Fn() -> String) -> Result<u64> {
    match sink {
        Sink::InPlace(_) | Sink::Index | Sink::Reserve => {
            let at = r.pos;
            r.skip(len, what)?;
            Ok(at)
        }
        Sink::Spool {
            path,
            w,
            len: spooled,
        } => {
            let at = *spooled;
            let mut buf = vec![0u8; (1u64 << 20).min(len) as usize];
            let mut left = len;
            let from = r.pos;
            // Bounded: each pass consumes up to 1 MiB or fails.
            while left > 0 {
                let k = left.min(buf.len() as u64) as usize;
                if r.fill(&mut buf[..k])? < k {
                    return Err(invalid(
                        &r.shown,
                        format!(
                            "truncated archive: {} ends at tar byte {} ({} of {len} bytes from byte {from})",
                            what(),
                            r.pos,
                            r.pos - from
                        ),
                    ));
                }
                w.write_all(&buf[..k])
                    .map_err(io_err(path, "tar: write spool"))?;
                left -= k as u64;
            }
            *spooled += len;
            Ok(at)
        }
    }
}

/// The sparse map of a GNU `S` entry (header and extension blocks) or a PAX sparse
/// entry (0.0 / 0.1 from the PAX records, 1.0 from the start of the data). Returns
/// (offset, length) pairs and the real size.
fn read_sparse_map(
    r: &mut TarStream,
    hdr: &[u8; 512],
    gnu_s: bool,
    ext: &Ext,
    size: u64,
    what: &dyn Fn() -> String,
    ebad: &dyn Fn(String) -> BuildError,
) -> Result<(Vec<(u64, u64)>, u64)> {
    let n = |f: &[u8]| -> Result<u64> {
        num(f)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| ebad("sparse map number".into()))
    };
    let mut segs = Vec::new();
    if gnu_s {
        let real = n(&hdr[483..495])?;
        let mut push = |block: &[u8], count: usize| -> Result<()> {
            for i in 0..count {
                let e = &block[i * 24..i * 24 + 24];
                if e[0] == 0 {
                    break;
                }
                segs.push((n(&e[..12])?, n(&e[12..])?));
            }
            Ok(())
        };
        push(&hdr[386..482], 4)?;
        let mut extended = hdr[482] != 0;
        let mut blk = [0u8; 512];
        // Bounded by the stream: each extension block is read from it.
        while extended {
            r.exact(&mut blk, what)?;
            push(&blk[..504], 21)?;
            extended = blk[504] != 0;
        }
        return Ok((segs, real));
    }
    let real = ext
        .sparse_realsize
        .ok_or_else(|| ebad("PAX sparse file without GNU.sparse.realsize".into()))?;
    if ext.sparse_major == Some(1) {
        // 1.0: decimal numbers, one a line, at the start of the data, padded to a block.
        let mut block = [0u8; 512];
        let mut text: Vec<u8> = Vec::new();
        let mut pos = 0usize;
        let mut used = 0u64;
        let mut next = |r: &mut TarStream,
                        text: &mut Vec<u8>,
                        pos: &mut usize,
                        used: &mut u64|
         -> Result<u64> {
            // Bounded: a number is at most 20 digits; a block is read when none is left.
            loop {
                if let Some(nl) = text[*pos..].iter().position(|&c| c == b'\n') {
                    let s = &text[*pos..*pos + nl];
                    *pos += nl + 1;
                    return std::str::from_utf8(s)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| ebad("sparse map (1.0) number".into()));
                }
                if text.len() - *pos > 64 || *used + 512 > size {
                    return Err(ebad("sparse map (1.0) malformed".into()));
                }
                r.exact(&mut block, what)?;
                *used += 512;
                text.extend_from_slice(&block);
            }
        };
        let count = next(r, &mut text, &mut pos, &mut used)?;
        if count > size / 2 + 1 {
            return Err(ebad(format!("sparse map of {count} entries")));
        }
        for _ in 0..count {
            let off = next(r, &mut text, &mut pos, &mut used)?;
            let len = next(r, &mut text, &mut pos, &mut used)?;
            segs.push((off, len));
        }
        return Ok((segs, real));
    }
    if !ext.sparse_map.len().is_multiple_of(2) {
        return Err(ebad("PAX sparse map with an odd count".into()));
    }
    for p in ext.sparse_map.chunks(2) {
        segs.push((p[0], p[1]));
    }
    Ok((segs, real))
}

impl Arena {
    fn note_time(&mut self, t: i64, ns: u32) {
        if (t, ns) > self.newest {
            self.newest = (t, ns);
        }
    }

    fn implicit_dir(&mut self) -> usize {
        self.nodes.push(TNode {
            kind: TKind::Dir(BTreeMap::new()),
            mode: S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            nsec: 0,
            xattrs: BTreeMap::new(),
            implicit: true,
        });
        self.nodes.len() - 1
    }

    fn children(
        &mut self,
        dir: usize,
    ) -> std::result::Result<&mut BTreeMap<Vec<u8>, Dent>, String> {
        match &mut self.nodes[dir].kind {
            TKind::Dir(c) => Ok(c),
            _ => Err("a parent is not a directory".into()),
        }
    }

    /// The directory at `comps`, made (implicitly) where missing when `create`.
    fn dir(
        &mut self,
        comps: &[&[u8]],
        layer: usize,
        create: bool,
    ) -> std::result::Result<Option<usize>, String> {
        let mut d = 0;
        for c in comps {
            let next = self.children(d)?.get(*c).copied();
            d = match next {
                Some(e) if matches!(self.nodes[e.id].kind, TKind::Dir(_)) => e.id,
                Some(_) => {
                    return Err(format!(
                        "parent {:?} is not a directory",
                        String::from_utf8_lossy(c)
                    ))
                }
                None if create => {
                    let id = self.implicit_dir();
                    self.children(d)?.insert(c.to_vec(), Dent { id, layer });
                    id
                }
                None => return Ok(None),
            };
        }
        Ok(Some(d))
    }

    /// Add an entry (the last wins; a directory over a directory keeps its children).
    fn put(
        &mut self,
        comps: &[&[u8]],
        mut node: TNode,
        layer: usize,
    ) -> std::result::Result<(), String> {
        let Some((&name, parents)) = comps.split_last() else {
            // The root itself ("./"): its metadata.
            if !matches!(node.kind, TKind::Dir(_)) {
                return Err("the root entry is not a directory".into());
            }
            let root = &mut self.nodes[0];
            node.kind = std::mem::replace(&mut root.kind, TKind::Fifo);
            *root = node;
            return Ok(());
        };
        if self.aufs || self.flatten {
            if name == b".wh..wh..opq" {
                let Some(d) = self.dir(parents, layer, !self.flatten)? else {
                    return Ok(());
                };
                if self.flatten {
                    self.children(d)?.retain(|_, e| e.layer >= layer);
                } else {
                    self.nodes[d]
                        .xattrs
                        .insert(OVL_OPAQUE.to_vec(), b"y".to_vec());
                }
                return Ok(());
            }
            if let Some(hidden) = name.strip_prefix(b".wh.") {
                if hidden.is_empty() {
                    return Err("whiteout of an empty name".into());
                }
                if self.flatten {
                    if let Some(d) = self.dir(parents, layer, false)? {
                        let c = self.children(d)?;
                        if c.get(hidden).is_some_and(|e| e.layer < layer) {
                            c.remove(hidden);
                        }
                    }
                    return Ok(());
                }
                let d = self.dir(parents, layer, true)?.ok_or("no parent")?;
                // Mode 0 as overlayfs makes them (and mkfs.erofs 1.9.3 --aufs).
                node.kind = TKind::Device(0);
                node.mode = S_IFCHR;
                if !self.strip {
                    self.nodes[d].xattrs.insert(OVL_ORIGIN.to_vec(), Vec::new());
                }
                return self.link(d, hidden, node, layer);
            }
        }
        let d = self.dir(parents, layer, true)?.ok_or("no parent")?;
        self.link(d, name, node, layer)
    }

    fn link(
        &mut self,
        d: usize,
        name: &[u8],
        mut node: TNode,
        layer: usize,
    ) -> std::result::Result<(), String> {
        let old = self.children(d)?.get(name).copied();
        if let Some(o) = old {
            if let (TKind::Dir(_), TKind::Dir(_)) = (&self.nodes[o.id].kind, &node.kind) {
                let keep = std::mem::replace(&mut self.nodes[o.id].kind, TKind::Fifo);
                // A directory made as a parent keeps the overlay xattrs put on it.
                if self.nodes[o.id].implicit {
                    for (k, v) in std::mem::take(&mut self.nodes[o.id].xattrs) {
                        node.xattrs.entry(k).or_insert(v);
                    }
                }
                node.kind = keep;
                self.nodes[o.id] = node;
                self.children(d)?
                    .insert(name.to_vec(), Dent { id: o.id, layer });
                return Ok(());
            }
        }
        self.nodes.push(node);
        let id = self.nodes.len() - 1;
        self.children(d)?.insert(name.to_vec(), Dent { id, layer });
        Ok(())
    }

    fn hardlink(
        &mut self,
        comps: &[&[u8]],
        target: &[&[u8]],
        layer: usize,
    ) -> std::result::Result<(), String> {
        let missing = || {
            format!(
                "hardlink target {:?} is not in the archive (before this entry)",
                String::from_utf8_lossy(&target.join(&b'/'))
            )
        };
        let Some((&tname, tpar)) = target.split_last() else {
            return Err("hardlink to the root".into());
        };
        let td = self
            .dir(tpar, layer, false)
            .map_err(|_| missing())?
            .ok_or_else(missing)?;
        let t = self.children(td)?.get(tname).copied().ok_or_else(missing)?;
        if matches!(self.nodes[t.id].kind, TKind::Dir(_)) {
            return Err("hardlink to a directory".into());
        }
        let Some((&name, parents)) = comps.split_last() else {
            return Err("hardlink named as the root".into());
        };
        let d = self.dir(parents, layer, true)?.ok_or("no parent")?;
        self.children(d)?
            .insert(name.to_vec(), Dent { id: t.id, layer });
        Ok(())
    }

    /// The tree, inodes numbered as `scan` numbers a directory's: the root, then for
    /// each directory in depth-first pre-order all of its entries in name order.
    fn finish(mut self, o: &BuildOptions) -> Result<(Tree, Vec<bool>)> {
        let newest = if self.newest.0 == i64::MIN {
            (0, 0)
        } else {
            self.newest
        };
        for n in self.nodes.iter_mut().filter(|n| n.implicit) {
            (n.mtime, n.nsec) = newest;
        }
        let excl = crate::scan::Excludes::new(o);
        let excluded = |rel: &[u8]| excl.matches(rel);
        let mut nodes: Vec<Node> = Vec::new();
        let mut implicit: Vec<bool> = Vec::new();
        let mut map: HashMap<usize, InodeId> = HashMap::new();
        let mut mk = |src: &TNode, rel: Vec<u8>, nodes: &mut Vec<Node>| -> InodeId {
            implicit.push(src.implicit);
            let kind = match &src.kind {
                TKind::Dir(_) => Kind::Dir {
                    entries: Vec::new(),
                    parent: 0,
                },
                TKind::File { src, size } => Kind::File {
                    src: src.clone(),
                    size: *size,
                },
                TKind::Symlink(t) => Kind::Symlink { target: t.clone() },
                TKind::Device(rdev) => Kind::Device { rdev: *rdev },
                TKind::Fifo => Kind::Fifo,
            };
            nodes.push(Node {
                kind,
                mode: src.mode,
                uid: o.force_uid.unwrap_or(if o.all_root { 0 } else { src.uid }),
                gid: o.force_gid.unwrap_or(if o.all_root { 0 } else { src.gid }),
                mtime: src.mtime,
                mtime_nsec: src.nsec,
                nlink: 0,
                xattrs: src
                    .xattrs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                rel,
            });
            nodes.len() - 1
        };
        let root = mk(&self.nodes[0], Vec::new(), &mut nodes);
        let mut stack: Vec<(usize, InodeId, Vec<u8>)> = vec![(0, root, Vec::new())];
        // Bounded: each directory is pushed once (directories have one name).
        while let Some((aid, tid, rel)) = stack.pop() {
            let TKind::Dir(children) = std::mem::replace(&mut self.nodes[aid].kind, TKind::Fifo)
            else {
                continue;
            };
            let mut entries = Vec::with_capacity(children.len());
            let mut subdirs = Vec::new();
            for (name, d) in children {
                let crel = crate::scan::child_rel(&rel, &name);
                if excluded(&crel) {
                    continue;
                }
                let is_dir = matches!(self.nodes[d.id].kind, TKind::Dir(_));
                let cid = match map.get(&d.id) {
                    Some(&c) if !is_dir => c,
                    _ => {
                        let c = mk(&self.nodes[d.id], crel.clone(), &mut nodes);
                        map.insert(d.id, c);
                        c
                    }
                };
                if is_dir {
                    if let Kind::Dir { parent, .. } = &mut nodes[cid].kind {
                        *parent = tid;
                    }
                    subdirs.push((d.id, cid, crel));
                }
                entries.push((name, cid));
            }
            if let Kind::Dir { entries: e, .. } = &mut nodes[tid].kind {
                *e = entries;
            }
            stack.extend(subdirs.into_iter().rev());
        }
        let mut tree = Tree {
            nodes,
            root,
            packed: None,
            devices: Vec::new(),
        };
        if o.ovlfs_strip {
            let gone = strip_overlay(&mut tree);
            let mut i = 0;
            implicit.retain(|_| {
                i += 1;
                !gone.get(i - 1).copied().unwrap_or(false)
            });
        }
        fix_nlinks(&mut tree);
        Ok((tree, implicit))
    }
}

/// `--ovlfs-strip`: drop overlayfs whiteouts (char 0:0) and opaque markers, as
/// mkfs.erofs 1.9.3 does. Inodes left unnamed stay in the node list but are
/// unreachable; they are removed by renumbering. Returns which nodes went (by their
/// old ids; the others keep their order).
pub fn strip_overlay(tree: &mut Tree) -> Vec<bool> {
    let wh: Vec<bool> = tree.nodes.iter().map(is_whiteout).collect();
    if !wh.iter().any(|&w| w) {
        for n in &mut tree.nodes {
            n.xattrs.retain(|(k, _)| k != OVL_OPAQUE);
        }
        return wh;
    }
    for n in &mut tree.nodes {
        n.xattrs.retain(|(k, _)| k != OVL_OPAQUE);
        if let Kind::Dir { entries, .. } = &mut n.kind {
            entries.retain(|(_, c)| !wh[*c]);
        }
    }
    // Renumber without the whiteouts (order kept, so numbering stays mkfs's).
    let mut new_id = vec![usize::MAX; tree.nodes.len()];
    let mut k = 0;
    for (i, &w) in wh.iter().enumerate() {
        if !w {
            new_id[i] = k;
            k += 1;
        }
    }
    let old = std::mem::take(&mut tree.nodes);
    for (i, mut n) in old.into_iter().enumerate() {
        if wh[i] {
            continue;
        }
        if let Kind::Dir { entries, parent } = &mut n.kind {
            *parent = new_id[*parent];
            for (_, c) in entries.iter_mut() {
                *c = new_id[*c];
            }
        }
        tree.nodes.push(n);
    }
    tree.root = new_id[tree.root];
    wh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_octal_and_base256() {
        assert_eq!(num(b"0000644\0"), Some(0o644));
        assert_eq!(num(b"  755 \0"), Some(0o755));
        assert_eq!(num(b"\0\0\0\0"), Some(0));
        assert_eq!(num(b"0009\0"), None);
        // base-256: 0x80 then big-endian; 0xff negative.
        let mut f = [0u8; 8];
        f[0] = 0x80;
        f[4..].copy_from_slice(&3_000_000_000u32.to_be_bytes());
        assert_eq!(num(&f), Some(3_000_000_000));
        assert_eq!(num(&[0xff; 12]), Some(-1));
        let mut big = [0xffu8; 12];
        big[0] = 0x80;
        assert_eq!(num(&big), None, "beyond i64");
    }

    #[test]
    fn pax_times_and_records() {
        assert_eq!(
            pax_time(b"1700000000.123456789"),
            Some((1700000000, 123456789))
        );
        assert_eq!(pax_time(b"5.5"), Some((5, 500_000_000)));
        assert_eq!(pax_time(b"-1.25"), Some((-2, 750_000_000)));
        assert_eq!(pax_time(b"-3"), Some((-3, 0)));
        assert_eq!(pax_time(b"1.2x"), None);
        let r = pax_records(b"18 path=a/b/c/d/e\n12 uid=1000\n").expect("records");
        assert_eq!(r[0], (b"path".to_vec(), b"a/b/c/d/e".to_vec()));
        assert_eq!(r[1], (b"uid".to_vec(), b"1000".to_vec()));
        for bad in [
            &b"99 path=x\n"[..],
            b"5 a=b\n",
            b"x path=y\n",
            b"11 pathxyz\n",
        ] {
            assert!(
                pax_records(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn acl_text_to_xattr() {
        let v = acl_xattr(
            b"user::rwx\nuser:1000:r-x #effective:r--\ngroup::r--\nmask::r-x\nother::---\n",
        )
        .expect("acl");
        let mut want = 2u32.to_le_bytes().to_vec();
        for (t, p, id) in [
            (1u16, 7u16, u32::MAX),
            (2, 5, 1000),
            (4, 4, u32::MAX),
            (0x10, 5, u32::MAX),
            (0x20, 0, u32::MAX),
        ] {
            want.extend_from_slice(&t.to_le_bytes());
            want.extend_from_slice(&p.to_le_bytes());
            want.extend_from_slice(&id.to_le_bytes());
        }
        assert_eq!(v, want);
        assert!(acl_xattr(b"user:no-such-user-here:rwx").is_err());
        assert!(acl_xattr(b"user::rwz").is_err());
        assert!(acl_xattr(b"bogus::rwx").is_err());
    }

    #[test]
    fn names_and_encodings() {
        assert_eq!(components(b"/./a//b/").expect("ok"), [&b"a"[..], b"b"]);
        assert!(components(b"a/../b").is_err());
        assert!(components(&[b'x'; 256]).is_err());
        assert_eq!(base64(b"bGliYXJjaGl2ZQ==").expect("b64"), b"libarchive");
        assert_eq!(base64(b"YQ").expect("b64"), b"a");
        assert!(base64(b"@@@@").is_none());
        assert_eq!(percent_decode(b"user.a%40b%2"), b"user.a@b%2");
        assert_eq!(stream_compression(&[0x28, 0xb5, 0x2f, 0xfd, 0]), "zstd");
        assert_eq!(stream_compression(b"BZh9"), "bzip2");
        assert_eq!(stream_compression(b"./file"), "none");
        // xz --format=lzma -6: properties 0x5d, an 8 MiB dictionary, size unknown.
        let mut h = vec![0x5d, 0, 0, 0x80, 0];
        h.extend([0xff; 8]);
        assert_eq!(stream_compression(&h), "lzma");
        h[1..5].copy_from_slice(&(3u32 << 20).to_le_bytes()); // 2^21 + 2^20
        assert_eq!(stream_compression(&h), "lzma");
        h[1..5].copy_from_slice(&(5u32 << 20).to_le_bytes());
        assert_eq!(stream_compression(&h), "none");
        h[1..5].copy_from_slice(&(1u32 << 20).to_le_bytes());
        h[0] = 225;
        assert_eq!(stream_compression(&h), "none");
        // A tar header whose first name starts with ']' (0x5d) is still a tar.
        let mut t = b"]a".to_vec();
        t.resize(512, 0);
        assert_eq!(stream_compression(&t), "none");
        assert_eq!(stream_compression(&h[..12]), "none");
        // A known size must be one a tar can have (found by fuzzing: a 0-byte "tar").
        h[0] = 0x5d;
        h[5..13].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(stream_compression(&h), "none");
        h[5..13].copy_from_slice(&10240u64.to_le_bytes());
        assert_eq!(stream_compression(&h), "lzma");
        h[5..13].copy_from_slice(&10241u64.to_le_bytes());
        assert_eq!(stream_compression(&h), "none");
    }
}

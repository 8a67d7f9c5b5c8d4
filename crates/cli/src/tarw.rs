//! A PAX (POSIX.1-2001) tar writer: just the header encoding, no I/O.
//!
//! Each entry is an optional PAX extended header (`x`) carrying what the ustar block
//! cannot hold — long or non-ASCII paths and link targets, ids above 2^21 - 1, sizes of
//! 8 GiB and more, times before 1970 or with nanoseconds, xattrs as `SCHILY.xattr.NAME`,
//! POSIX ACLs also as `SCHILY.acl.access` / `SCHILY.acl.default` text (numeric ids),
//! and sparse files as PAX sparse format 1.0 (`GNU.sparse.*`, map at the start of the
//! data) — followed by the ustar block. User and group names are left empty: an image
//! holds numeric ids only, so extraction uses them whatever the extracting host's
//! `/etc/passwd` says. This is what GNU tar 1.34 writes with
//! `--format=posix --xattrs --acls --numeric-owner`, which also reads it back.

/// Tar block size.
pub const BLOCK: usize = 512;

/// Entry kinds tar can hold (sockets are not among them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    HardLink,
    Symlink,
    Char,
    Block,
    Dir,
    Fifo,
}

impl Kind {
    fn flag(self) -> u8 {
        match self {
            Kind::File => b'0',
            Kind::HardLink => b'1',
            Kind::Symlink => b'2',
            Kind::Char => b'3',
            Kind::Block => b'4',
            Kind::Dir => b'5',
            Kind::Fifo => b'6',
        }
    }
}

/// One entry's metadata. `path` is the archive path ("./a/b", "./" for the root);
/// directories get their trailing slash here.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: Vec<u8>,
    pub kind: Kind,
    /// Permission bits (0o7777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// File size (the real size for a sparse file).
    pub size: u64,
    /// Symlink or hardlink target.
    pub link: Vec<u8>,
    pub dev: (u32, u32),
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Data runs `(offset, length)` when the file has holes; the data that follows the
    /// header is these runs' bytes, in order.
    pub sparse: Option<Vec<(u64, u64)>>,
}

/// Largest value of an octal field of `width` bytes (one byte for the terminator).
fn octal_max(width: usize) -> u64 {
    (1u64 << (3 * (width - 1))) - 1
}

fn put_octal(field: &mut [u8], v: u64) {
    let w = field.len() - 1;
    let s = format!("{v:0w$o}");
    let b = s.as_bytes();
    let start = b.len().saturating_sub(w);
    field[..w].copy_from_slice(&b[start..]);
    field[w] = 0;
}

fn put_bytes(field: &mut [u8], v: &[u8]) {
    let n = v.len().min(field.len());
    field[..n].copy_from_slice(&v[..n]);
}

/// One PAX record: "LEN KEY=VALUE\n", LEN counting itself.
pub fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    // Bounded: the digit count converges in at most two steps.
    for _ in 0..4 {
        let l = rest + len.to_string().len();
        if l == len {
            break;
        }
        len = l;
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// PAX time value: seconds with up to 9 fraction digits, trailing zeros dropped; a
/// negative time with a fraction is written as -S.F (GNU tar's reading).
pub fn pax_time(sec: i64, nsec: u32) -> String {
    let nsec = nsec.min(999_999_999);
    if nsec == 0 {
        return sec.to_string();
    }
    let (sign, whole, frac) = if sec < 0 {
        // sec + nsec/1e9 = -((-sec - 1) + (1e9 - nsec)/1e9)
        let whole = sec.unsigned_abs() - 1;
        ("-", whole, 1_000_000_000 - nsec)
    } else {
        ("", sec.unsigned_abs(), nsec)
    };
    let f = format!("{frac:09}");
    format!("{sign}{whole}.{}", f.trim_end_matches('0'))
}

/// `=` and `%` in an xattr name are %-encoded in the key (as GNU tar does).
fn xattr_key(name: &[u8]) -> Vec<u8> {
    let mut k = b"SCHILY.xattr.".to_vec();
    for &c in name {
        match c {
            b'=' => k.extend_from_slice(b"%3D"),
            b'%' => k.extend_from_slice(b"%25"),
            _ => k.push(c),
        }
    }
    k
}

/// POSIX ACL xattr (`system.posix_acl_*`, version 2) as acl(5) long text with numeric
/// ids, one entry per line; None when the blob is not a valid ACL.
pub fn acl_text(blob: &[u8]) -> Option<String> {
    let (head, rest) = blob.split_at_checked(4)?;
    if head != 2u32.to_le_bytes() || rest.len() % 8 != 0 {
        return None;
    }
    let mut s = String::new();
    for e in rest.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let (name, qual) = match tag {
            0x01 => ("user", String::new()),
            0x02 => ("user", id.to_string()),
            0x04 => ("group", String::new()),
            0x08 => ("group", id.to_string()),
            0x10 => ("mask", String::new()),
            0x20 => ("other", String::new()),
            _ => return None,
        };
        let p = |bit: u16, c: char| if perm & bit != 0 { c } else { '-' };
        s.push_str(&format!(
            "{name}:{qual}:{}{}{}\n",
            p(4, 'r'),
            p(2, 'w'),
            p(1, 'x')
        ));
    }
    Some(s)
}

fn ascii_fits(v: &[u8], width: usize) -> bool {
    v.len() <= width && v.iter().all(|&c| (0x20..0x7f).contains(&c))
}

/// The base name of a path (without a trailing slash).
fn base_name(p: &[u8]) -> &[u8] {
    let p = p.strip_suffix(b"/").unwrap_or(p);
    match p.iter().rposition(|&c| c == b'/') {
        Some(i) => &p[i + 1..],
        None => p,
    }
}

/// Sparse map text (PAX 1.0): count, then offset and length per run, one number a
/// line, padded with zeros to a whole block.
fn sparse_map(runs: &[(u64, u64)]) -> Vec<u8> {
    let mut m = format!("{}\n", runs.len()).into_bytes();
    for (o, l) in runs {
        m.extend_from_slice(format!("{o}\n{l}\n").as_bytes());
    }
    pad(&mut m);
    m
}

/// Zero-pad to a whole block.
pub fn pad(v: &mut Vec<u8>) {
    let r = v.len() % BLOCK;
    if r != 0 {
        v.resize(v.len() + BLOCK - r, 0);
    }
}

/// Zero bytes that pad `len` bytes of data to a whole block.
pub fn padding(len: u64) -> usize {
    let r = (len % BLOCK as u64) as usize;
    if r == 0 {
        0
    } else {
        BLOCK - r
    }
}

/// A ustar header block.
#[allow(clippy::too_many_arguments)]
fn ustar(
    name: &[u8],
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: i64,
    flag: u8,
    link: &[u8],
    dev: (u32, u32),
) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    put_bytes(&mut h[0..100], name);
    put_octal(&mut h[100..108], u64::from(mode & 0o7777));
    let id = |v: u32| {
        if u64::from(v) > octal_max(8) {
            0
        } else {
            u64::from(v)
        }
    };
    put_octal(&mut h[108..116], id(uid));
    put_octal(&mut h[116..124], id(gid));
    put_octal(
        &mut h[124..136],
        if size > octal_max(12) { 0 } else { size },
    );
    let t = u64::try_from(mtime).unwrap_or(0).min(octal_max(12));
    put_octal(&mut h[136..148], t);
    h[156] = flag;
    put_bytes(&mut h[157..257], link);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if flag == b'3' || flag == b'4' {
        put_octal(&mut h[329..337], u64::from(dev.0));
        put_octal(&mut h[337..345], u64::from(dev.1));
    }
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    put_octal(&mut h[148..155], sum);
    h[155] = b' ';
    h
}

impl Entry {
    /// Bytes of the entry's data area before padding: the sparse map (if any) plus the
    /// data runs, or the file size.
    pub fn data_len(&self) -> u64 {
        match (&self.kind, &self.sparse) {
            (Kind::File, Some(runs)) => {
                sparse_map(runs).len() as u64 + runs.iter().map(|r| r.1).sum::<u64>()
            }
            (Kind::File, None) => self.size,
            _ => 0,
        }
    }

    /// The PAX header (if needed), the ustar header and, for a sparse file, its map:
    /// everything before the data. The caller writes `data_len() - map` data bytes and
    /// [`padding`]`(data_len())` zeros after it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut pax = Vec::new();
        let name_field: Vec<u8>;
        if let (Kind::File, Some(_)) = (&self.kind, &self.sparse) {
            // PAX sparse 1.0: a stand-in name in the header, the real one here.
            pax_record(&mut pax, b"GNU.sparse.major", b"1");
            pax_record(&mut pax, b"GNU.sparse.minor", b"0");
            pax_record(&mut pax, b"GNU.sparse.name", &self.path);
            pax_record(
                &mut pax,
                b"GNU.sparse.realsize",
                self.size.to_string().as_bytes(),
            );
            let mut n = b"./GNUSparseFile.0/".to_vec();
            n.extend_from_slice(base_name(&self.path));
            n.truncate(100);
            name_field = n;
        } else if ascii_fits(&self.path, 100) {
            name_field = self.path.clone();
        } else {
            pax_record(&mut pax, b"path", &self.path);
            let mut n = self.path.clone();
            n.truncate(100);
            name_field = n;
        }
        if !ascii_fits(&self.link, 100) {
            pax_record(&mut pax, b"linkpath", &self.link);
        }
        if u64::from(self.uid) > octal_max(8) {
            pax_record(&mut pax, b"uid", self.uid.to_string().as_bytes());
        }
        if u64::from(self.gid) > octal_max(8) {
            pax_record(&mut pax, b"gid", self.gid.to_string().as_bytes());
        }
        let size = self.data_len();
        if size > octal_max(12) {
            pax_record(&mut pax, b"size", size.to_string().as_bytes());
        }
        let t_max = i64::try_from(octal_max(12)).unwrap_or(i64::MAX);
        if self.mtime_nsec != 0 || self.mtime < 0 || self.mtime > t_max {
            pax_record(
                &mut pax,
                b"mtime",
                pax_time(self.mtime, self.mtime_nsec).as_bytes(),
            );
        }
        for (name, value) in &self.xattrs {
            let acl = match name.as_slice() {
                b"system.posix_acl_access" => Some(&b"SCHILY.acl.access"[..]),
                b"system.posix_acl_default" => Some(&b"SCHILY.acl.default"[..]),
                _ => None,
            };
            if let Some(key) = acl {
                if let Some(text) = acl_text(value) {
                    pax_record(&mut pax, key, text.as_bytes());
                }
            }
            pax_record(&mut pax, &xattr_key(name), value);
        }
        if !pax.is_empty() {
            let mut n = b"./PaxHeaders/".to_vec();
            n.extend_from_slice(base_name(&name_field));
            n.truncate(100);
            out.extend_from_slice(&ustar(
                &n,
                0o644,
                0,
                0,
                pax.len() as u64,
                self.mtime.max(0),
                b'x',
                b"",
                (0, 0),
            ));
            out.extend_from_slice(&pax);
            pad(out);
        }
        let mut link = self.link.clone();
        link.truncate(100);
        out.extend_from_slice(&ustar(
            &name_field,
            self.mode,
            self.uid,
            self.gid,
            size,
            self.mtime,
            self.kind.flag(),
            &link,
            self.dev,
        ));
        if let (Kind::File, Some(runs)) = (&self.kind, &self.sparse) {
            out.extend_from_slice(&sparse_map(runs));
        }
    }
}

/// The global PAX header that opens an archive: `hdrcharset=BINARY`, since names are
/// bytes, not necessarily UTF-8 or in one normal form (without it libarchive composes
/// NFD names and refuses invalid UTF-8; GNU tar accepts the keyword only here).
pub fn global_header() -> Vec<u8> {
    let mut pax = Vec::new();
    pax_record(&mut pax, b"hdrcharset", b"BINARY");
    let mut out = ustar(
        b"./PaxHeaders/global",
        0o644,
        0,
        0,
        pax.len() as u64,
        0,
        b'g',
        b"",
        (0, 0),
    )
    .to_vec();
    out.extend_from_slice(&pax);
    pad(&mut out);
    out
}

/// The end of an archive: two zero blocks, then zeros up to a multiple of GNU tar's
/// default record size (10240 bytes), given the bytes written so far.
pub fn trailer(written: u64) -> Vec<u8> {
    let mut n = 2 * BLOCK as u64;
    let rec = 20 * BLOCK as u64;
    let r = (written + n) % rec;
    if r != 0 {
        n += rec - r;
    }
    vec![0u8; usize::try_from(n).unwrap_or(2 * BLOCK)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_length_counts_itself() {
        let mut v = Vec::new();
        pax_record(&mut v, b"path", b"a");
        assert_eq!(v, b"9 path=a\n");
        let mut v = Vec::new();
        // 3 + 4 + 2 = 9 without digits -> 10 with two digits... "10 k=123456\n"
        pax_record(&mut v, b"k", b"123456");
        assert_eq!(v, b"12 k=123456\n");
        assert_eq!(v.len(), 12);
    }

    #[test]
    fn times() {
        assert_eq!(pax_time(1600000000, 123456789), "1600000000.123456789");
        assert_eq!(pax_time(1600000000, 5), "1600000000.000000005");
        assert_eq!(pax_time(-1, 0), "-1");
        // -100 s + 0.25 s = -99.75 s
        assert_eq!(pax_time(-100, 250_000_000), "-99.75");
        assert_eq!(pax_time(-1, 500_000_000), "-0.5");
    }

    #[test]
    fn acl() {
        let mut b = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [(1u16, 6u16, u32::MAX), (2, 4, 1000), (4, 4, u32::MAX)] {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        assert_eq!(
            acl_text(&b).expect("valid"),
            "user::rw-\nuser:1000:r--\ngroup::r--\n"
        );
        assert_eq!(acl_text(&b[..7]), None);
    }

    fn base(path: &[u8], kind: Kind) -> Entry {
        Entry {
            path: path.to_vec(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            mtime_nsec: 0,
            size: 0,
            link: vec![],
            dev: (0, 0),
            xattrs: vec![],
            sparse: None,
        }
    }

    fn records(out: &[u8]) -> String {
        String::from_utf8_lossy(&out[BLOCK..]).into_owned()
    }

    #[test]
    fn long_names_big_sizes_sparse() {
        // A 150-byte path and link target go to PAX records.
        let long = format!("./{}", "d/".repeat(74));
        let mut e = base(long.as_bytes(), Kind::Symlink);
        e.link = vec![b'x'; 150];
        let mut out = Vec::new();
        e.encode(&mut out);
        let r = records(&out);
        assert!(r.contains(&format!(" path={long}\n")), "{r}");
        assert!(
            r.contains(&format!(" linkpath={}\n", "x".repeat(150))),
            "{r}"
        );
        // 8 GiB and more: a PAX size, 0 in the header.
        let mut e = base(b"./big", Kind::File);
        e.size = 1 << 34;
        let mut out = Vec::new();
        e.encode(&mut out);
        assert!(records(&out).starts_with("20 size=17179869184\n"));
        assert_eq!(&out[2 * BLOCK + 124..2 * BLOCK + 136], b"00000000000\0");
        // Sparse 1.0: stand-in name, real name and size in records, map in the data.
        let mut e = base(b"./dir/holes", Kind::File);
        e.size = 1 << 20;
        e.sparse = Some(vec![(4096, 10), (1 << 20, 0)]);
        let mut out = Vec::new();
        e.encode(&mut out);
        let r = records(&out);
        assert!(r.contains(" GNU.sparse.name=./dir/holes\n"), "{r}");
        assert!(r.contains(" GNU.sparse.realsize=1048576\n"), "{r}");
        let h = &out[2 * BLOCK..3 * BLOCK];
        assert!(h.starts_with(b"./GNUSparseFile.0/holes\0"));
        assert_eq!(
            &out[3 * BLOCK..3 * BLOCK + 21],
            b"2\n4096\n10\n1048576\n0\n\0"
        );
        assert_eq!(e.data_len(), BLOCK as u64 + 10);
        assert_eq!(out.len(), 4 * BLOCK);
    }

    #[test]
    fn trailer_fills_the_record() {
        assert_eq!(trailer(0).len(), 10240);
        assert_eq!(trailer(3 * 512).len(), 10240 - 3 * 512);
        assert_eq!(trailer(19 * 512).len(), 10240 + 512);
    }

    #[test]
    fn header_checksum_and_fields() {
        let e = Entry {
            path: b"./a".to_vec(),
            kind: Kind::File,
            mode: 0o644,
            uid: 4_000_000_000,
            gid: 7,
            mtime: 5,
            mtime_nsec: 0,
            size: 3,
            link: vec![],
            dev: (0, 0),
            xattrs: vec![(b"user.a=b".to_vec(), b"v".to_vec())],
            sparse: None,
        };
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(out.len(), 3 * BLOCK);
        let pax = &out[BLOCK..2 * BLOCK];
        assert!(pax.starts_with(b"18 uid=4000000000\n"));
        assert!(String::from_utf8_lossy(pax).contains("SCHILY.xattr.user.a%3Db=v\n"));
        let h = &out[2 * BLOCK..];
        assert_eq!(&h[0..4], b"./a\0");
        assert_eq!(&h[124..136], b"00000000003\0");
        let mut sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        sum -= h[148..156].iter().map(|&b| u64::from(b)).sum::<u64>();
        sum += 8 * u64::from(b' ');
        assert_eq!(&h[148..156], format!("{sum:06o}\0 ").as_bytes());
    }
}

//! The reader against images made by mkfs.erofs 1.9.3: every entry the reader shows
//! must equal what the Linux kernel shows when it mounts the same image.

use ferofs_reader::{Image, Inode};
use ferofs_testkit::{golden, kernel_available, Mount};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A canonical line per entry: everything the kernel exposes that we compare.
#[allow(clippy::too_many_arguments)]
fn line(
    ftype: &str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: Option<u64>,
    mtime: (i64, u32),
    extra: String,
    mut xattrs: Vec<(Vec<u8>, Vec<u8>)>,
) -> String {
    xattrs.sort();
    let xs: Vec<String> = xattrs
        .iter()
        .map(|(n, v)| format!("{}={}", String::from_utf8_lossy(n), hex(v)))
        .collect();
    format!(
        "{ftype} {mode:o} {uid}:{gid} size={} mtime={}.{:09} {extra} [{}]",
        size.map(|s| s.to_string()).unwrap_or_default(),
        mtime.0,
        mtime.1,
        xs.join(",")
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sha(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

/// Listing through our reader.
pub fn reader_listing(img: &Image) -> BTreeMap<Vec<u8>, String> {
    let mut out = BTreeMap::new();
    let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
    img.walk(|path, ino: &Inode| {
        let ft = ino.mode & 0o170000;
        let (ftype, extra, size) = match ft {
            0o040000 => ("dir", String::new(), None),
            0o100000 => {
                let mut h = Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                let mut off = 0;
                while off < ino.size {
                    let n = img.read_at(ino, off, &mut buf)?;
                    assert!(n > 0, "short read");
                    h.update(&buf[..n]);
                    off += n as u64;
                }
                let mut extra = format!("sha256={}", hex(&h.finalize()));
                if ino.nlink > 1 {
                    let f = first.entry(ino.nid).or_insert_with(|| path.to_vec());
                    extra.push_str(&format!(" link={}", String::from_utf8_lossy(f)));
                }
                ("file", extra, Some(ino.size))
            }
            0o120000 => (
                "symlink",
                format!("target={}", sha(&img.read_link(ino)?)),
                Some(ino.size),
            ),
            0o020000 | 0o060000 => {
                let (ma, mi) = ino.rdev_major_minor();
                (
                    if ft == 0o020000 { "chr" } else { "blk" },
                    format!("rdev={ma}:{mi}"),
                    None,
                )
            }
            0o010000 => ("fifo", String::new(), None),
            _ => ("sock", String::new(), None),
        };
        let xattrs = img
            .xattrs(ino)?
            .into_iter()
            .map(|x| (x.name, x.value))
            .collect();
        out.insert(
            path.to_vec(),
            line(
                ftype,
                u32::from(ino.mode & 0o7777),
                ino.uid,
                ino.gid,
                size,
                (ino.mtime, ino.mtime_nsec),
                extra,
                xattrs,
            ),
        );
        Ok(())
    })
    .expect("walk the image");
    out
}

fn dev_major_minor(d: u64) -> (u64, u64) {
    (
        ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff),
        (d & 0xff) | ((d >> 12) & !0xff),
    )
}

/// Listing of a directory tree (a kernel mount) in the same format.
pub fn fs_listing(root: &Path) -> BTreeMap<Vec<u8>, String> {
    let mut out = BTreeMap::new();
    let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut stack = vec![(root.to_path_buf(), b"/".to_vec())];
    while let Some((p, rel)) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).expect("lstat");
        let ft = md.mode() & 0o170000;
        let (ftype, extra, size) = match ft {
            0o040000 => {
                let mut kids: Vec<_> = std::fs::read_dir(&p)
                    .expect("readdir")
                    .map(|e| e.expect("entry"))
                    .collect();
                kids.sort_by_key(|e| e.file_name());
                for k in kids {
                    let mut r = if rel == b"/" { Vec::new() } else { rel.clone() };
                    r.push(b'/');
                    r.extend_from_slice(k.file_name().as_bytes());
                    stack.push((k.path(), r));
                }
                ("dir", String::new(), None)
            }
            0o100000 => {
                let data = std::fs::read(&p).expect("read");
                let mut extra = format!("sha256={}", sha(&data));
                if md.nlink() > 1 {
                    let f = first.entry(md.ino()).or_insert_with(|| rel.clone());
                    extra.push_str(&format!(" link={}", String::from_utf8_lossy(f)));
                }
                ("file", extra, Some(md.size()))
            }
            0o120000 => {
                let t = std::fs::read_link(&p).expect("readlink");
                (
                    "symlink",
                    format!("target={}", sha(t.as_os_str().as_bytes())),
                    Some(md.size()),
                )
            }
            0o020000 | 0o060000 => {
                let (ma, mi) = dev_major_minor(md.rdev());
                (
                    if ft == 0o020000 { "chr" } else { "blk" },
                    format!("rdev={ma}:{mi}"),
                    None,
                )
            }
            0o010000 => ("fifo", String::new(), None),
            _ => ("sock", String::new(), None),
        };
        let mut xattrs = Vec::new();
        for n in xattr::list(&p).expect("listxattr") {
            let v = xattr::get(&p, &n).expect("getxattr").unwrap_or_default();
            xattrs.push((n.as_bytes().to_vec(), v));
        }
        out.insert(
            rel.clone(),
            line(
                ftype,
                md.mode() & 0o7777,
                md.uid(),
                md.gid(),
                size,
                (md.mtime(), md.mtime_nsec() as u32),
                extra,
                xattrs,
            ),
        );
    }
    out
}

/// Hardlink groups are keyed by first path in walk order; both walks sort names, but
/// the fs walk is LIFO. Normalise "link=" to the smallest path of each group.
fn normalise(mut m: BTreeMap<Vec<u8>, String>) -> BTreeMap<Vec<u8>, String> {
    let mut groups: HashMap<String, Vec<u8>> = HashMap::new();
    for (p, l) in &m {
        if let Some(i) = l.find(" link=") {
            let key = l[i..].split(' ').nth(1).unwrap_or("").to_string();
            let e = groups.entry(key).or_insert_with(|| p.clone());
            if p < e {
                *e = p.clone();
            }
        }
    }
    for l in m.values_mut() {
        if let Some(i) = l.find(" link=") {
            let rest = &l[i + 1..];
            let (tok, tail) = rest.split_at(rest.find(' ').unwrap_or(rest.len()));
            let key = tok.to_string();
            if let Some(g) = groups.get(&key) {
                *l = format!("{} link={}{}", &l[..i], String::from_utf8_lossy(g), tail);
            }
        }
    }
    m
}

fn compare_with_kernel(name: &str) {
    let path = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
    let img = Image::open(&path).expect("open golden image");
    let ours = normalise(reader_listing(&img));
    if !kernel_available(name) {
        return;
    }
    let m = Mount::erofs(&path);
    let theirs = normalise(fs_listing(m.path()));
    let mut diffs = Vec::new();
    for (p, l) in &theirs {
        match ours.get(p) {
            Some(o) if o == l => {}
            Some(o) => diffs.push(format!(
                "{}\n  kernel: {l}\n  ferofs: {o}",
                String::from_utf8_lossy(p)
            )),
            None => diffs.push(format!("{}: missing in ferofs", String::from_utf8_lossy(p))),
        }
    }
    for p in ours.keys() {
        if !theirs.contains_key(p) {
            diffs.push(format!("{}: only in ferofs", String::from_utf8_lossy(p)));
        }
    }
    assert!(
        diffs.is_empty(),
        "{name}: {} differences with the kernel, first ones:\n{}",
        diffs.len(),
        diffs
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let expected = if name.contains("tpfd") { 3239 } else { 3240 };
    assert_eq!(
        ours.len(),
        expected,
        "{name}: entry count (make-tree prints 3240 entries, root included)"
    );
}

macro_rules! golden_tests {
    ($($f:ident => $n:expr),* $(,)?) => { $( #[test] fn $f() { compare_with_kernel($n); } )* };
}

golden_tests! {
    plain => "plain",
    plain_noinline => "plain-noinline",
    plain_extended => "plain-extended",
    plain_b1024 => "plain-b1024",
    plain_b512 => "plain-b512",
    plain_chunk64k => "plain-chunk64k",
    plain_chunk64k_indexes => "plain-chunk64k-indexes",
    plain_dot_omitted => "plain-dot-omitted",
    plain_48bit => "plain-48bit",
    plain_xattr_prefix => "plain-xattr-prefix",
    plain_metabox => "plain-metabox",
    lz4 => "lz4",
    lz4_c64k => "lz4-C64k",
    lz4_c64k_tpfd => "lz4-C64k-tpfd",
    lz4hc => "lz4hc",
    lz4hc_c64k => "lz4hc-C64k",
    lz4hc_c64k_tpfd => "lz4hc-C64k-tpfd",
    lzma => "lzma",
    lzma_c64k => "lzma-C64k",
    lzma_c64k_tpfd => "lzma-C64k-tpfd",
    deflate => "deflate",
    deflate_c64k => "deflate-C64k",
    deflate_c64k_tpfd => "deflate-C64k-tpfd",
    libdeflate => "libdeflate",
    libdeflate_c64k => "libdeflate-C64k",
    libdeflate_c64k_tpfd => "libdeflate-C64k-tpfd",
    zstd => "zstd",
    zstd_c64k => "zstd-C64k",
    zstd_c64k_tpfd => "zstd-C64k-tpfd",
    lz4hc_all_fragments => "lz4hc-all-fragments",
    lz4hc_zd => "lz4hc-zD",
    lz4hc_metabox => "lz4hc-metabox",
    lz4hc_48bit_c64k => "lz4hc-48bit-C64k",
    lz4hc_xattr_prefix_packed => "lz4hc-xattr-prefix-packed",
    lz4hc_lzma => "lz4hc-lzma",
}

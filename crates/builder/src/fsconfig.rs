//! Android's canned fs_config (`--fs-config-file`, as mkfs.erofs built for Android reads
//! it through libcutils): owner, permission bits and file capabilities per path, in
//! place of the source's.
//!
//! The file has one entry a line, fields separated by spaces: `PATH UID GID MODE
//! [capabilities=CAPS] [other tokens, ignored]`. PATH is relative to the partition root
//! (a leading `/` is dropped; a line starting with a space, or PATH `/`, is the root),
//! UID and GID are decimal, MODE octal, CAPS a number in C notation (`0x` hex, `0`
//! octal, else decimal). When a path has several lines the last one wins. An image
//! path is looked up as `MOUNT_POINT/PATH` (`--mount-point`, its leading `/` dropped),
//! the root as the empty path; a path the file does not list is an error (libcutils
//! exits there too). Non-zero capabilities become the `security.capability` xattr
//! (a revision-2 `vfs_cap_data`: permitted set, effective flag), replacing the
//! source's.

use crate::options::*;
use crate::scan::Tree;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The xattr file capabilities live in.
pub const CAPS_XATTR: &[u8] = b"security.capability";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (setuid, setgid, sticky included).
    pub mode: u16,
    pub capabilities: u64,
}

#[derive(Debug)]
pub struct FsConfig {
    file: PathBuf,
    entries: HashMap<Vec<u8>, Entry>,
}

fn bad(file: &Path, line: usize, what: String) -> BuildError {
    BuildError::Options(format!("{}:{line}: {what}", file.display()))
}

/// A number in C notation (`strtoull` with base 0).
fn c_number(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

impl FsConfig {
    /// Parse `text`, the contents of `file` (named in errors with the line number).
    pub fn parse(file: &Path, text: &[u8]) -> Result<Self> {
        let mut entries = HashMap::new();
        // Lines as getline reads them: none in an empty file, nothing behind a last
        // newline.
        let body = text.strip_suffix(b"\n").unwrap_or(text);
        let lines = (!text.is_empty()).then(|| body.split(|&b| b == b'\n'));
        for (i, raw) in lines.into_iter().flatten().enumerate() {
            let n = i + 1;
            let line = std::str::from_utf8(raw)
                .map_err(|_| bad(file, n, "not UTF-8".into()))?
                .trim_end_matches('\r');
            // The root as a line starting with a space (historical).
            let root = line.starts_with(' ');
            let mut tokens = line.split(' ').filter(|t| !t.is_empty());
            let first = if root { Some("/") } else { tokens.next() };
            let (Some(path), Some(uid), Some(gid), Some(mode)) =
                (first, tokens.next(), tokens.next(), tokens.next())
            else {
                return Err(bad(
                    file,
                    n,
                    format!("{line:?}: expected PATH UID GID MODE [capabilities=CAPS]"),
                ));
            };
            let uid = uid
                .parse::<u32>()
                .map_err(|_| bad(file, n, format!("uid {uid:?}: not a decimal number")))?;
            let gid = gid
                .parse::<u32>()
                .map_err(|_| bad(file, n, format!("gid {gid:?}: not a decimal number")))?;
            let mode = u16::from_str_radix(mode, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| bad(file, n, format!("mode {mode:?}: not octal up to 7777")))?;
            let mut capabilities = 0;
            for t in tokens {
                // Other tokens (e.g. `selabel=`) are ignored, as libcutils does.
                if let Some(v) = t.strip_prefix("capabilities=") {
                    capabilities = c_number(v)
                        .ok_or_else(|| bad(file, n, format!("capabilities {v:?}: not a number")))?;
                    break;
                }
            }
            let path = path.strip_prefix('/').unwrap_or(path);
            entries.insert(
                path.as_bytes().to_vec(),
                Entry {
                    uid,
                    gid,
                    mode,
                    capabilities,
                },
            );
        }
        Ok(FsConfig {
            file: file.to_path_buf(),
            entries,
        })
    }

    /// Read and parse `file`.
    pub fn load(file: &Path) -> Result<Self> {
        let text = std::fs::read(file).map_err(io_err(file, "fs_config: read"))?;
        Self::parse(file, &text)
    }

    /// The entry for an image path (relative to the image root, `b""` the root) under
    /// `mount_point`.
    pub fn lookup(&self, mount_point: &[u8], rel: &[u8]) -> Option<&Entry> {
        self.entries.get(&key(mount_point, rel))
    }
}

/// What an image path is looked up as: `MOUNT_POINT/REL` without its leading `/`
/// (doubled slashes as one), the root as the empty path.
fn key(mount_point: &[u8], rel: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        return Vec::new();
    }
    let full = crate::selabel::lookup_path(mount_point, rel);
    full.strip_prefix(b"/").unwrap_or(&full).to_vec()
}

/// The `security.capability` value for a capability set: revision 2 with the
/// effective flag, the set as permitted, nothing inheritable (little-endian).
pub fn caps_value(caps: u64) -> Vec<u8> {
    const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
    const VFS_CAP_FLAGS_EFFECTIVE: u32 = 0x1;
    let mut v = Vec::with_capacity(20);
    v.extend_from_slice(&(VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE).to_le_bytes());
    v.extend_from_slice(&(caps as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&((caps >> 32) as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

/// Give every inode of `tree` the owner, permission bits and capabilities `cfg` lists
/// for its path (the type bits stay the source's); an unlisted path is an error.
pub fn apply(tree: &mut Tree, cfg: &FsConfig, mount_point: &[u8]) -> Result<()> {
    for n in &mut tree.nodes {
        let Some(e) = cfg.lookup(mount_point, &n.rel) else {
            return Err(BuildError::Invalid {
                path: PathBuf::from(std::ffi::OsStr::new(
                    &String::from_utf8_lossy(&key(mount_point, &n.rel)).into_owned(),
                )),
                what: format!("not listed in the fs_config file {}", cfg.file.display()),
            });
        };
        n.uid = e.uid;
        n.gid = e.gid;
        n.mode = (n.mode & !0o7777) | e.mode;
        if e.capabilities != 0 {
            let x = &mut n.xattrs;
            x.retain(|(k, _)| k.as_slice() != CAPS_XATTR);
            let at = x.partition_point(|(k, _)| k.as_slice() < CAPS_XATTR);
            x.insert(at, (CAPS_XATTR.to_vec(), caps_value(e.capabilities)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<FsConfig> {
        FsConfig::parse(Path::new("fs_config"), text.as_bytes())
    }

    #[test]
    fn entries_and_lookups() -> Result<()> {
        let c = cfg(" 0 0 0755\n\
             system/bin 0 2000 0751\n\
             /system/bin/sh 0 2000 0755 selabel=u:x capabilities=0x1000000000\n\
             system/bin/ping 0 0 04755 capabilities=8192\n\
             system/bin/ping 1000 1000 0750\n\
             system/etc/a\t1 0 0 0644\n")?;
        let e = |u, g, m, c| Entry {
            uid: u,
            gid: g,
            mode: m,
            capabilities: c,
        };
        assert_eq!(c.lookup(b"/system", b""), Some(&e(0, 0, 0o755, 0)));
        assert_eq!(c.lookup(b"/system", b"bin"), Some(&e(0, 2000, 0o751, 0)));
        assert_eq!(
            c.lookup(b"system", b"bin/sh"),
            Some(&e(0, 2000, 0o755, 1 << 36))
        );
        // The last line of a path wins.
        assert_eq!(
            c.lookup(b"/system", b"bin/ping"),
            Some(&e(1000, 1000, 0o750, 0))
        );
        assert_eq!(c.lookup(b"", b"bin/sh"), None);
        // Only spaces separate fields: a tab is part of the path.
        assert_eq!(c.lookup(b"/system", b"etc/a"), None);
        // Without a mount point paths are the image's own.
        let c = cfg("/ 0 0 0700\nbin/sh 5 6 0755\n")?;
        assert_eq!(c.lookup(b"", b""), Some(&e(0, 0, 0o700, 0)));
        assert_eq!(c.lookup(b"", b"bin/sh"), Some(&e(5, 6, 0o755, 0)));
        assert_eq!(c.lookup(b"/", b"bin/sh"), Some(&e(5, 6, 0o755, 0)));
        Ok(())
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, what) in [
            ("a 0 0\n", "fs_config:1: \"a 0 0\": expected"),
            ("a 0 0 0644\n\nb 0 0 0644\n", "fs_config:2:"),
            ("a x 0 0644\n", "uid \"x\""),
            ("a 0 0 0649\n", "mode \"0649\""),
            ("a 0 0 17777\n", "mode \"17777\""),
            ("a 0 0 0644 capabilities=zz\n", "capabilities \"zz\""),
        ] {
            let e = cfg(text).expect_err(text).to_string();
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn capability_xattr_bytes() {
        // Bits 13 and 21 in the first 32-bit word, bit 35 as bit 3 of the second.
        let v = caps_value((1 << 13) | (1 << 21) | (1 << 35));
        assert_eq!(
            v,
            [1, 0, 0, 2, 0, 0x20, 0x20, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}

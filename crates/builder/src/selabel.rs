//! SELinux labels from a `file_contexts` file (`--file-contexts`, with `--mount-point`):
//! every inode gets the `security.selinux` xattr its path and type select, as
//! mkfs.erofs does through libselinux's file backend. Images for Android partitions and
//! SELinux-enforcing embedded systems are built this way.
//!
//! The text format (selabel_file(5)): one spec a line, `REGEX [TYPE] CONTEXT` (fields
//! past the third ignored, as libselinux does), `#` comments, blank lines; TYPE is `--` (regular file), `-d`, `-l`, `-c`, `-b`, `-p` or
//! `-s`, and none matches every type; CONTEXT `<<none>>` means "no label". The regex
//! matches the whole path (`/MOUNT_POINT/REL`, runs of `/` taken as one; the root is
//! `/MOUNT_POINT/`). Which spec wins, as libselinux decides: a spec without regex
//! meta-characters (a plain path) beats every regex; among each kind the last matching
//! spec of the file wins. A spec whose literal text up to its second `/` has no
//! meta-character only matches paths beginning with that same component (libselinux's
//! "stem"; it also makes the lookup fast).
//!
//! Differences from libselinux: regexes are Rust's `regex` syntax (PCRE's back-references
//! and look-arounds are refused with the line named), the whole regex is anchored
//! (libselinux puts `^...$` around the text after the stem, so a top-level `|` there
//! would leave one side unanchored), and the compiled `file_contexts.bin` format,
//! `.homedirs`, `.local` and `.subs` files are not read.

use crate::options::{BuildError, Result};
use crate::scan::Tree;
use regex::bytes::{Regex, RegexBuilder};
use std::path::{Path, PathBuf};

/// The first four bytes of a compiled `file_contexts.bin` (libselinux's magic, LE).
const COMPILED_MAGIC: [u8; 4] = 0xf97c_ff8au32.to_le_bytes();

/// Regex meta-characters as libselinux counts them (a `\` escapes the next byte).
const META: &[u8] = b".^$?*+|[({";

/// At most this many specs (Android's biggest files hold a few thousand).
const MAX_SPECS: usize = 1 << 20;

#[derive(Debug)]
struct Spec {
    regex: Regex,
    /// File type bits (`S_IFMT` part), 0 for any.
    kind: u32,
    /// None: `<<none>>`.
    context: Option<Vec<u8>>,
    /// The literal first component (`/usr`), when the spec has one.
    stem: Option<Vec<u8>>,
}

/// A parsed `file_contexts` file, in lookup order (regexes, then plain paths; each in
/// file order: the last match wins).
#[derive(Debug)]
pub struct FileContexts {
    specs: Vec<Spec>,
    /// Indexes (ascending) of the specs without a stem, and of those with each stem: a
    /// lookup tries only these two lists.
    no_stem: Vec<usize>,
    by_stem: std::collections::HashMap<Vec<u8>, Vec<usize>>,
}

fn invalid(path: &Path, what: String) -> BuildError {
    BuildError::Invalid {
        path: path.to_path_buf(),
        what,
    }
}

/// Whether the regex text has meta-characters (libselinux's `hasMetaChars`).
fn has_meta(re: &[u8]) -> bool {
    let mut i = 0;
    while i < re.len() {
        match re[i] {
            b'\\' => i += 2,
            c if META.contains(&c) => return true,
            _ => i += 1,
        }
    }
    false
}

/// The literal text up to the second `/` of a spec's regex, when it has no
/// meta-character (or escape) in it.
fn spec_stem(re: &[u8]) -> Option<Vec<u8>> {
    let end = 1 + re.get(1..)?.iter().position(|&c| c == b'/')?;
    let stem = &re[..end];
    (!stem.iter().any(|c| META.contains(c) || *c == b'\\')).then(|| stem.to_vec())
}

/// The first component of a path (`/usr` of `/usr/bin/x`), when it has a second `/`.
fn path_stem(path: &[u8]) -> Option<&[u8]> {
    let end = 1 + path.get(1..)?.iter().position(|&c| c == b'/')?;
    Some(&path[..end])
}

fn file_type(tok: &str) -> Option<u32> {
    Some(match tok {
        "--" => 0o100000,
        "-d" => 0o040000,
        "-l" => 0o120000,
        "-c" => 0o020000,
        "-b" => 0o060000,
        "-p" => 0o010000,
        "-s" => 0o140000,
        _ => return None,
    })
}

impl FileContexts {
    /// Read and compile `path`; a malformed line is an error naming the file and line.
    pub fn load(path: &Path) -> Result<FileContexts> {
        let text = std::fs::read(path).map_err(|error| BuildError::Io {
            path: path.to_path_buf(),
            stage: "reading the file contexts",
            error,
        })?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &[u8]) -> Result<FileContexts> {
        if text.starts_with(&COMPILED_MAGIC) {
            return Err(invalid(
                path,
                "a compiled file_contexts.bin: give the text file_contexts it was made from".into(),
            ));
        }
        let text = std::str::from_utf8(text)
            .map_err(|e| invalid(path, format!("not UTF-8 text ({e})")))?;
        let (mut regexes, mut plain) = (Vec::new(), Vec::new());
        for (no, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |what: String| invalid(path, format!("line {}: {what}", no + 1));
            let toks: Vec<&str> = line.split_whitespace().collect();
            // Fields past the third are ignored, as libselinux does.
            let (re, kind, ctx) = match toks[..] {
                [re, ctx] => (re, 0, ctx),
                [re, ty, ctx, ..] => (
                    re,
                    file_type(ty).ok_or_else(|| {
                        at(format!(
                            "unknown file type {ty:?} (--, -d, -l, -c, -b, -p or -s)"
                        ))
                    })?,
                    ctx,
                ),
                _ => return Err(at("1 field: expected REGEX [TYPE] CONTEXT".into())),
            };
            let regex = RegexBuilder::new(&format!("^(?:{re})$"))
                .unicode(false)
                .build()
                .map_err(|e| at(format!("regex {re:?}: {e}")))?;
            let spec = Spec {
                regex,
                kind,
                context: (ctx != "<<none>>").then(|| ctx.as_bytes().to_vec()),
                stem: spec_stem(re.as_bytes()),
            };
            if has_meta(re.as_bytes()) {
                regexes.push(spec);
            } else {
                plain.push(spec);
            }
            if regexes.len() + plain.len() > MAX_SPECS {
                return Err(at(format!("more than {MAX_SPECS} specs")));
            }
        }
        regexes.append(&mut plain);
        let mut no_stem = Vec::new();
        let mut by_stem: std::collections::HashMap<Vec<u8>, Vec<usize>> = Default::default();
        for (i, sp) in regexes.iter().enumerate() {
            match &sp.stem {
                Some(st) => by_stem.entry(st.clone()).or_default().push(i),
                None => no_stem.push(i),
            }
        }
        Ok(FileContexts {
            specs: regexes,
            no_stem,
            by_stem,
        })
    }

    /// The context for `path` (absolute, runs of `/` already single) of file type
    /// `mode & S_IFMT`; None when no spec matches or the winner says `<<none>>`.
    pub fn lookup(&self, path: &[u8], mode: u32) -> Option<&[u8]> {
        let kind = mode & 0o170000;
        let stemmed: &[usize] = path_stem(path)
            .and_then(|st| self.by_stem.get(st))
            .map_or(&[], |v| v.as_slice());
        // The candidates from the last: the two ascending lists merged backwards.
        let (mut a, mut b) = (self.no_stem.len(), stemmed.len());
        loop {
            let from_no_stem = match (a, b) {
                (0, 0) => return None,
                (_, 0) => true,
                (0, _) => false,
                _ => self.no_stem[a - 1] > stemmed[b - 1],
            };
            let i = if from_no_stem {
                a -= 1;
                self.no_stem[a]
            } else {
                b -= 1;
                stemmed[b]
            };
            let s = &self.specs[i];
            if (s.kind == 0 || s.kind == kind) && s.regex.is_match(path) {
                return s.context.as_deref();
            }
        }
    }
}

/// The path libselinux is asked about for the inode at `rel`: `/MOUNT/REL` with runs of
/// `/` made one (the root: `/MOUNT/`, or `/`).
pub fn lookup_path(mount_point: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(mount_point.len() + rel.len() + 2);
    raw.push(b'/');
    if !mount_point.is_empty() {
        raw.extend_from_slice(mount_point);
        raw.push(b'/');
    }
    raw.extend_from_slice(rel);
    let mut out = Vec::with_capacity(raw.len());
    for &c in &raw {
        if !(c == b'/' && out.last() == Some(&b'/')) {
            out.push(c);
        }
    }
    out
}

/// Label every inode of `tree`: its `security.selinux` from the source goes, the
/// looked-up context (if any) comes in.
pub fn label(tree: &mut Tree, fc: &FileContexts, mount_point: &[u8]) {
    use rayon::prelude::*;
    const NAME: &[u8] = b"security.selinux";
    tree.nodes.par_iter_mut().for_each(|n| {
        n.xattrs.retain(|(k, _)| k.as_slice() != NAME);
        let path = lookup_path(mount_point, &n.rel);
        if let Some(ctx) = fc.lookup(&path, u32::from(n.mode)) {
            n.xattrs.push((NAME.to_vec(), ctx.to_vec()));
        }
    });
}

/// `--mount-point`: one trailing `/` dropped, as mkfs.erofs does.
pub fn mount_point(arg: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let b = arg.as_os_str().as_bytes();
    let b = b.strip_suffix(b"/").unwrap_or(b);
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fc(text: &str) -> FileContexts {
        FileContexts::parse(Path::new("fc"), text.as_bytes()).expect("parse")
    }

    const REG: u32 = 0o100644;
    const DIR: u32 = 0o040755;

    #[test]
    fn plain_paths_beat_regexes_and_the_last_match_wins() {
        let f = fc("# comment\n\n\
             /system(/.*)?        u:object_r:system_file:s0\n\
             /system/bin/sh  --   u:object_r:shell_exec:s0\n\
             /system/bin(/.*)?    u:object_r:bin_a:s0\n\
             /system/bin/.*  --   u:object_r:bin_b:s0\n\
             /system/lost  <<none>>\n\
             /system/dev/null -c u:object_r:null_device:s0 ignored\n");
        let l = |p: &str, m| f.lookup(p.as_bytes(), m).map(|c| c.to_vec());
        assert_eq!(
            l("/system/", DIR),
            Some(b"u:object_r:system_file:s0".to_vec())
        );
        assert_eq!(
            l("/system", DIR),
            Some(b"u:object_r:system_file:s0".to_vec())
        );
        // A plain path wins although regexes come later in the file.
        assert_eq!(
            l("/system/bin/sh", REG),
            Some(b"u:object_r:shell_exec:s0".to_vec())
        );
        // ... but only for its type.
        assert_eq!(
            l("/system/bin/sh", DIR),
            Some(b"u:object_r:bin_a:s0".to_vec())
        );
        // The last of two matching regexes wins.
        assert_eq!(
            l("/system/bin/ls", REG),
            Some(b"u:object_r:bin_b:s0".to_vec())
        );
        assert_eq!(l("/system/lost", REG), None);
        assert_eq!(
            l("/system/dev/null", 0o020644),
            Some(b"u:object_r:null_device:s0".to_vec())
        );
        assert_eq!(
            l("/system/dev/null", REG),
            Some(b"u:object_r:system_file:s0".to_vec())
        );
        // Anchored: a match inside the path is not a match.
        assert_eq!(l("/vendor/system/x", REG), None);
    }

    #[test]
    fn stems_limit_specs_to_their_first_component() {
        let f = fc("/sys/?  u:object_r:a:s0\n/sys/x  u:object_r:b:s0\n");
        // "/sys/?" has the stem "/sys", which the path "/sys" (one component) lacks:
        // libselinux does not try it there.
        assert_eq!(f.lookup(b"/sys", DIR), None);
        assert_eq!(f.lookup(b"/sys/", DIR), Some(&b"u:object_r:a:s0"[..]));
        assert_eq!(f.lookup(b"/sys/x", REG), Some(&b"u:object_r:b:s0"[..]));
        assert_eq!(f.lookup(b"/sysx/x", REG), None);
    }

    #[test]
    fn bad_files_name_the_line() {
        let e = |t: &[u8]| {
            FileContexts::parse(Path::new("fc"), t)
                .expect_err("accepted")
                .to_string()
        };
        assert_eq!(
            e(b"/a u:r:a:s0\n/b -x u:r:b:s0\n"),
            "fc: line 2: unknown file type \"-x\" (--, -d, -l, -c, -b, -p or -s)"
        );
        assert_eq!(
            e(b"/a\n"),
            "fc: line 1: 1 field: expected REGEX [TYPE] CONTEXT"
        );
        assert!(e(b"/(a u:r:a:s0\n").starts_with("fc: line 1: regex \"/(a\": "));
        assert!(e(b"/(?=a) u:r:a:s0\n").starts_with("fc: line 1: regex"));
        assert!(e(&[0x8a, 0xff, 0x7c, 0xf9, 2, 0, 0, 0]).contains("compiled file_contexts.bin"));
    }

    #[test]
    fn lookup_paths() {
        assert_eq!(lookup_path(b"", b""), b"/");
        assert_eq!(lookup_path(b"", b"a/b"), b"/a/b");
        assert_eq!(lookup_path(b"/system", b""), b"/system/");
        assert_eq!(lookup_path(b"system", b"bin/sh"), b"/system/bin/sh");
        assert_eq!(lookup_path(b"/system", b"bin/sh"), b"/system/bin/sh");
        assert_eq!(mount_point(Path::new("/system/")), Path::new("/system"));
    }
}

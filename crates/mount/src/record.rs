//! `--record-access FILE`: every regular file, by its path relative to the image root,
//! the first time its data is read, one per line, in the order of those first reads —
//! the list `ferofs build --sort FILE` takes.
//!
//! FUSE names files by node id, not by path, so the recorder remembers the first name
//! (parent nid, name) under which every node was handed to the kernel (`lookup`,
//! `readdirplus`), and rebuilds a path from those links when the node is first read.
//! Lines are buffered and flushed when the mount ends. Paths that cannot be written as
//! one line (a name with a newline) are left out with a warning on stderr.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

/// Deepest path rebuilt (the reader's bound on directory depth).
const MAX_DEPTH: usize = ferofs_reader::limits::MAX_DEPTH;

struct Inner {
    /// nid -> (parent nid, name): the first link seen.
    links: HashMap<u64, (u64, Box<[u8]>)>,
    recorded: HashSet<u64>,
    out: BufWriter<File>,
    error: Option<io::Error>,
    lines: u64,
}

pub(crate) struct Recorder {
    root: u64,
    inner: Mutex<Inner>,
}

impl Recorder {
    /// Create (truncate) the list file now, so a bad path fails the mount.
    pub(crate) fn create(path: &Path, root: u64) -> io::Result<Self> {
        let f = File::create(path)?;
        Ok(Recorder {
            root,
            inner: Mutex::new(Inner {
                links: HashMap::new(),
                recorded: HashSet::new(),
                out: BufWriter::new(f),
                error: None,
                lines: 0,
            }),
        })
    }

    /// `nid` is reachable as `name` in directory `parent`.
    pub(crate) fn link(&self, parent: u64, name: &[u8], nid: u64) {
        if name == b"." || name == b".." || nid == self.root {
            return;
        }
        if let Ok(mut g) = self.inner.lock() {
            g.links.entry(nid).or_insert_with(|| (parent, name.into()));
        }
    }

    /// The data of regular file `nid` is being read.
    pub(crate) fn read(&self, nid: u64) {
        let Ok(mut g) = self.inner.lock() else { return };
        if !g.recorded.insert(nid) {
            return;
        }
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = nid;
        let mut ok = false;
        for _ in 0..=MAX_DEPTH {
            if cur == self.root {
                ok = true;
                break;
            }
            let Some((p, name)) = g.links.get(&cur) else {
                break;
            };
            parts.push(name);
            cur = *p;
        }
        if !ok {
            eprintln!("ferofs mount: --record-access: no path known for nid {nid}");
            return;
        }
        let mut line: Vec<u8> = Vec::new();
        for (i, p) in parts.iter().rev().enumerate() {
            if i > 0 {
                line.push(b'/');
            }
            line.extend_from_slice(p);
        }
        if line.contains(&b'\n') || line.ends_with(b"\r") {
            eprintln!(
                "ferofs mount: --record-access: {:?} cannot be listed (newline in the path)",
                String::from_utf8_lossy(&line)
            );
            return;
        }
        line.push(b'\n');
        let inner = &mut *g;
        if let Err(e) = inner.out.write_all(&line) {
            inner.error.get_or_insert(e);
        } else {
            inner.lines += 1;
        }
    }

    /// Write out what is buffered; the first write error, if any.
    pub(crate) fn flush(&self) -> io::Result<u64> {
        let mut g = self
            .inner
            .lock()
            .map_err(|_| io::Error::other("recorder lock poisoned"))?;
        if let Some(e) = g.error.take() {
            return Err(e);
        }
        g.out.flush()?;
        Ok(g.lines)
    }
}

//! I/O amplification through the reader library: open IMAGE over a counting source, read
//! 4 KiB at each offset listed in OFFSETS (one decimal byte offset a line, in order) from
//! the file at PATH, and print what the reader fetched from the source.
//!
//! usage: cargo run --release --example ioamp -- IMAGE PATH OFFSETS [--ctx] [--verify FILE]
//!
//! Prints one line: `requested_bytes calls distinct_bytes data_bytes`, where
//! `requested_bytes` is the sum of every positional read the reader made (after opening
//! the image: the superblock read is left out, as the kernel's mount is; the path lookup
//! is counted), `calls` their number, `distinct_bytes` the distinct 4 KiB blocks those
//! reads touched times 4096 (what a device behind an unbounded page cache would serve,
//! the kernel's situation) and `data_bytes` the file bytes returned.
//!
//! Reads go through [`Image::read_at`], the library's random-access entry point (shared
//! decoded-extent cache, the library's own per-thread context); `--ctx` uses
//! [`Image::read_at_with`] and one caller-owned context instead (the sequential
//! whole-file path of `extract` and `check`). `--verify FILE` compares every read with
//! the same bytes of FILE (the original) and fails on a difference.
use ferofs_reader::{Image, ReadCtx, Source};
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const READ: usize = 4096;

/// A source that counts what is read from it.
struct Counting {
    inner: File,
    bytes: AtomicU64,
    calls: AtomicU64,
    blocks: Mutex<HashSet<u64>>,
}

impl Counting {
    fn reset(&self) {
        self.bytes.store(0, Ordering::Relaxed);
        self.calls.store(0, Ordering::Relaxed);
        self.blocks.lock().expect("lock").clear();
    }
}

impl Source for Counting {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let len = buf.len() as u64;
        self.bytes.fetch_add(len, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        if len > 0 {
            let mut b = self.blocks.lock().expect("lock");
            for blk in offset / 4096..(offset + len).div_ceil(4096) {
                b.insert(blk);
            }
        }
        Source::read_exact_at(&self.inner, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Source::size(&self.inner)
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: ioamp IMAGE PATH OFFSETS [--ctx] [--verify FILE]";
    let (image, path, offsets) = match (args.next(), args.next(), args.next()) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let mut use_ctx = false;
    let mut verify = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ctx" => use_ctx = true,
            "--verify" => {
                verify = Some(File::open(args.next().expect(usage)).expect("verify file"))
            }
            _ => {
                eprintln!("{usage}");
                std::process::exit(2);
            }
        }
    }
    let offsets: Vec<u64> = std::fs::read_to_string(&offsets)
        .expect("offsets file")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse().expect("offset"))
        .collect();

    let src = Arc::new(Counting {
        inner: File::open(&image).expect("image"),
        bytes: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        blocks: Mutex::new(HashSet::new()),
    });
    let img = Image::new(src.clone()).expect("open image");
    src.reset();
    let ino = img.lookup(path.as_bytes()).expect("lookup");
    let mut ctx = ReadCtx::new();
    let mut buf = vec![0u8; READ];
    let mut want = vec![0u8; READ];
    let mut data = 0u64;
    for &off in &offsets {
        let n = if use_ctx {
            img.read_at_with(&mut ctx, &ino, off, &mut buf)
        } else {
            img.read_at(&ino, off, &mut buf)
        }
        .expect("read");
        if let Some(f) = &verify {
            let m = f.read_at(&mut want[..n], off).expect("verify read");
            assert!(
                m == n && buf[..n] == want[..n],
                "data differs at offset {off}"
            );
        }
        data += n as u64;
    }
    let distinct = src.blocks.lock().expect("lock").len() as u64 * 4096;
    println!(
        "{} {} {} {}",
        src.bytes.load(Ordering::Relaxed),
        src.calls.load(Ordering::Relaxed),
        distinct,
        data
    );
}

//! What `ferofs build` shows: a progress bar while it runs (on a terminal) and a
//! summary at the end (aligned lines on stderr, or one JSON object on stdout).

use crate::fmt::hex;
use ferofs_builder::verity::VerityInfo;
use ferofs_builder::{BuildReport, Progress};
use indicatif::{BinaryBytes, HumanCount, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the bar takes the builder's counters.
const POLL: Duration = Duration::from_millis(100);

/// A bar on stderr that a thread of its own redraws every [`POLL`] from counters
/// (the caller checked that stderr is a terminal), until [`BarView::finish`].
pub struct BarView {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

/// The spinner a bar shows until it knows its total.
fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg} {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// Bytes done of a total, rate and ETA.
fn bytes_style(msg: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{msg} [{{wide_bar}}] {{binary_bytes}}/{{binary_total_bytes}} \
         {{binary_bytes_per_sec}} ETA {{eta}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
}

impl BarView {
    /// Start the thread: a spinner with `first` at once, then `draw` updates the bar
    /// from the counters at every poll.
    fn start(first: String, mut draw: impl FnMut(&ProgressBar) + Send + 'static) -> Self {
        let (stop, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(spinner_style());
            bar.set_message(first);
            // Bounded: ends when the sender says stop or is dropped.
            loop {
                draw(&bar);
                match rx.recv_timeout(POLL) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            bar.finish_and_clear();
        });
        BarView { stop, thread }
    }

    /// The builder's [`Progress`]: scanning, then data bytes, then metadata.
    pub fn build(p: Arc<Progress>) -> Self {
        let mut sized = false;
        Self::start("scanning".to_string(), move |bar| {
            let total = p.total();
            if total > 0 {
                if !sized {
                    sized = true;
                    bar.set_length(total);
                    bar.set_message("data");
                    bar.set_style(bytes_style("{msg:9}").progress_chars("=> "));
                }
                let done = p.done();
                bar.set_position(done);
                if done >= total {
                    bar.set_message("metadata");
                }
            } else {
                let s = p.scanned();
                if s > 0 {
                    bar.set_message(format!("scanning {}", BinaryBytes(s)));
                }
                bar.tick();
            }
        })
    }

    /// `ferofs build --oci`'s download: resolving the manifests, then the layers'
    /// bytes done of their total.
    pub fn pull(p: Arc<ferofs_remote::oci::PullProgress>, what: String) -> Self {
        use std::sync::atomic::Ordering;
        let mut sized = false;
        Self::start(format!("resolving {what}"), move |bar| {
            let total = p.total.load(Ordering::Relaxed);
            if total == 0 {
                bar.tick();
                return;
            }
            if !sized {
                sized = true;
                bar.set_length(total);
                bar.set_position(p.done.load(Ordering::Relaxed).min(total));
                bar.set_message(format!("pulling {what}"));
                bar.set_style(bytes_style("{msg}"));
            }
            bar.set_position(p.done.load(Ordering::Relaxed).min(total));
        })
    }

    /// Remove the bar from the terminal (before anything else is printed).
    pub fn finish(self) {
        let _ = self.stop.send(());
        // A panic in the drawing thread only loses the bar.
        let _ = self.thread.join();
    }
}

/// The process's peak resident set size in bytes (`VmHWM` of /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    parse_vmhwm(&std::fs::read_to_string("/proc/self/status").ok()?)
}

fn parse_vmhwm(status: &str) -> Option<u64> {
    let rest = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let mut it = rest.split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// Everything the summary says.
pub struct Summary<'a> {
    pub image: &'a Path,
    pub report: &'a BuildReport,
    pub seconds: f64,
    pub threads: usize,
    pub peak_rss: Option<u64>,
}

impl Summary<'_> {
    /// Image bytes per input byte (None for a tree without file data).
    fn ratio(&self) -> Option<f64> {
        let r = self.report;
        (r.bytes_in > 0 && !r.appended_in_place).then(|| r.image_bytes as f64 / r.bytes_in as f64)
    }

    pub fn json(&self) -> serde_json::Value {
        let r = self.report;
        json!({
            "image": self.image.to_string_lossy(),
            "files": r.files,
            "directories": r.directories,
            "symlinks": r.symlinks,
            "special": r.special,
            "inodes": r.inodes,
            "bytes_in": r.bytes_in,
            "compressor_input": r.compressor_input,
            "image_bytes": r.image_bytes,
            "blocks": r.blocks,
            "ratio": self.ratio(),
            "dedupe_saved": r.dedupe_saved,
            "fragment_bytes": r.fragment_bytes,
            "fragments_saved": r.fragments_saved,
            "seconds": self.seconds,
            "peak_rss_bytes": self.peak_rss,
            "threads": self.threads,
            "uuid": crate::fmt::uuid_string(&r.uuid),
            "build_time": r.build_time,
            "verity": r.verity.as_ref().map(|v| verity_json(self.image, v)),
            "appended_in_place": r.appended_in_place,
            "appended_bytes": r.appended_bytes,
            "reserved_bytes": r.reserved_bytes,
        })
    }

    /// A few aligned lines, each ending in a newline.
    pub fn human(&self) -> String {
        let r = self.report;
        let bytes = |n: u64| match n {
            0..1024 => format!("{n} bytes"),
            _ => format!("{} bytes ({})", HumanCount(n), BinaryBytes(n)),
        };
        let ratio = match self.ratio() {
            _ if r.appended_in_place => format!(", {} appended in place", bytes(r.appended_bytes)),
            Some(x) => format!(", {:.1} % of bytes in", 100.0 * x),
            None => String::new(),
        };
        let mut lines = vec![
            ("image", format!("{}", self.image.display())),
            (
                "inodes",
                format!(
                    "{} ({} files, {} directories, {} symlinks, {} special)",
                    r.inodes, r.files, r.directories, r.symlinks, r.special
                ),
            ),
            ("bytes in", bytes(r.bytes_in)),
            ("image bytes", format!("{}{ratio}", bytes(r.image_bytes))),
            ("dedupe", format!("{} saved", bytes(r.dedupe_saved))),
            (
                "fragments",
                format!(
                    "{} in fragments, {} saved",
                    bytes(r.fragment_bytes),
                    bytes(r.fragments_saved)
                ),
            ),
            (
                "time",
                format!("{:.2} s, {} threads", self.seconds, self.threads),
            ),
            (
                "peak memory",
                self.peak_rss
                    .map_or("unknown".into(), |n| format!("{}", BinaryBytes(n))),
            ),
        ];
        if r.reserved_bytes > 0 {
            lines.insert(
                3,
                (
                    "reserved",
                    format!("{} (not stored)", bytes(r.reserved_bytes)),
                ),
            );
        }
        lines
            .iter()
            .map(|(k, v)| format!("{k:<12} {v}\n"))
            .collect()
    }
}

/// `s` as one shell word (single-quoted when it has anything but safe characters).
fn shell_word(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._+:=,@%-".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A device-mapper name for `image`: its file name without the extension, with
/// anything but letters, digits, `.`, `_` and `-` replaced by `_`.
fn dm_name(image: &Path) -> String {
    let stem = image
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() || n.starts_with('.') {
        format!("erofs{n}")
    } else {
        n
    }
}

/// `veritysetup open` for the image with its tree appended (the superblock gives the
/// rest of the parameters).
pub fn veritysetup_open(image: &Path, v: &VerityInfo) -> String {
    let img = shell_word(&image.to_string_lossy());
    format!(
        "veritysetup open {img} {} {img} {} --hash-offset={}",
        dm_name(image),
        hex(&v.root_hash),
        v.hash_offset
    )
}

/// What `build --verity` prints on stdout: aligned lines like the summary's.
pub fn verity_lines(image: &Path, v: &VerityInfo) -> String {
    let salt = if v.salt.is_empty() {
        "- (none)".to_string()
    } else {
        hex(&v.salt)
    };
    let lines = [
        ("root hash", hex(&v.root_hash)),
        ("salt", salt),
        (
            "verity",
            format!(
                "sha256, format 1, 4096-byte data and hash blocks, {} data blocks; \
                 superblock at byte {} (the hash offset), {} hash blocks after it; {} bytes in all",
                v.data_blocks, v.hash_offset, v.hash_blocks, v.file_bytes
            ),
        ),
        ("open with", veritysetup_open(image, v)),
    ];
    lines
        .iter()
        .map(|(k, v)| format!("{k:<12} {v}\n"))
        .collect()
}

fn verity_json(image: &Path, v: &VerityInfo) -> serde_json::Value {
    json!({
        "root_hash": hex(&v.root_hash),
        "salt": hex(&v.salt),
        "uuid": crate::fmt::uuid_string(&v.uuid),
        "hash_algorithm": "sha256",
        "format": 1,
        "data_block_size": 4096,
        "hash_block_size": 4096,
        "data_blocks": v.data_blocks,
        "hash_offset": v.hash_offset,
        "hash_blocks": v.hash_blocks,
        "file_bytes": v.file_bytes,
        "veritysetup_open": veritysetup_open(image, v),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmhwm() {
        let s = "Name:\tferofs\nVmPeak:\t  20000 kB\nVmHWM:\t    5432 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_vmhwm(s), Some(5432 * 1024));
        assert_eq!(parse_vmhwm("VmRSS:\t 100 kB\n"), None);
        assert_eq!(parse_vmhwm("VmHWM:\t 100 MB\n"), None);
        assert!(peak_rss_bytes().is_some_and(|n| n > 0));
    }

    #[test]
    fn summary_lines() {
        let report = BuildReport {
            inodes: 5,
            directories: 2,
            files: 3,
            bytes_in: 10_000,
            image_bytes: 4096,
            fragment_bytes: 1500,
            ..Default::default()
        };
        let s = Summary {
            image: Path::new("x.erofs"),
            report: &report,
            seconds: 1.234,
            threads: 2,
            peak_rss: Some(3 << 20),
        };
        assert_eq!(
            s.human(),
            "image        x.erofs\n\
             inodes       5 (3 files, 2 directories, 0 symlinks, 0 special)\n\
             bytes in     10,000 bytes (9.77 KiB)\n\
             image bytes  4,096 bytes (4.00 KiB), 41.0 % of bytes in\n\
             dedupe       0 bytes saved\n\
             fragments    1,500 bytes (1.46 KiB) in fragments, 0 bytes saved\n\
             time         1.23 s, 2 threads\n\
             peak memory  3.00 MiB\n"
        );
        let j = s.json();
        assert_eq!(j["ratio"].as_f64(), Some(0.4096));
        assert_eq!(j["peak_rss_bytes"].as_u64(), Some(3 << 20));
        assert_eq!(j["uuid"], "00000000-0000-0000-0000-000000000000");
        let empty = BuildReport::default();
        let s = Summary {
            report: &empty,
            peak_rss: None,
            ..s
        };
        assert!(s.json()["ratio"].is_null());
        assert!(s.human().contains("image bytes  0 bytes\n"));
        assert!(s.human().ends_with("peak memory  unknown\n"));
    }

    #[test]
    fn verity_lines_and_command() {
        let v = VerityInfo {
            root_hash: [0xab; 32],
            salt: vec![1, 2],
            uuid: [0; 16],
            data_blocks: 10,
            hash_offset: 40960,
            hash_blocks: 1,
            file_bytes: 49152,
        };
        let s = verity_lines(Path::new("out/my app.erofs"), &v);
        let root = "ab".repeat(32);
        assert!(
            s.starts_with(&format!("root hash    {root}\nsalt         0102\n")),
            "{s}"
        );
        assert!(s.ends_with(&format!(
            "open with    veritysetup open 'out/my app.erofs' my_app 'out/my app.erofs' {root} --hash-offset=40960\n"
        )), "{s}");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(dm_name(Path::new(".hidden")), "erofs.hidden");
        let j = verity_json(Path::new("x.img"), &v);
        assert_eq!(j["hash_offset"], 40960);
        assert_eq!(j["salt"], "0102");
    }
}

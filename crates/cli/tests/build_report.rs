//! `ferofs build`'s progress bar and summary: `--json` prints one object with the
//! exact counts, a pipe gets no bar, `--quiet` prints nothing, a terminal gets the bar.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Words of a small vocabulary from a fixed generator: text that compresses (with any
/// algorithm, LZ4 too) but is no single repeat.
fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "erofs",
        "block",
        "inode",
        "extent",
        "cluster",
        "tail",
        "fragment",
        "image",
        "kernel",
        "mount",
        "read",
        "only",
        "compressed",
        "data",
        "the",
        "of",
    ];
    let mut x = seed;
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.extend_from_slice(WORDS[(x >> 60) as usize].as_bytes());
        v.push(b' ');
    }
    v.truncate(len);
    v
}

/// 3 files (10,000 + 5,000 + 0 bytes), 2 directories, 1 symlink.
fn small_tree(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("sub")).expect("mkdir");
    std::fs::write(src.join("a.txt"), text(10_000, 1)).expect("write");
    std::fs::write(src.join("sub/b.txt"), text(5_000, 2)).expect("write");
    std::fs::write(src.join("sub/empty"), b"").expect("write");
    std::os::unix::fs::symlink("a.txt", src.join("link")).expect("symlink");
    src
}

fn build_out(args: &[&str], src: &Path, img: &Path) -> (String, String) {
    let out = ferofs()
        .arg("build")
        .args(args)
        .arg(src)
        .arg(img)
        .output()
        .expect("run ferofs build");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "ferofs build {args:?} failed: {se}");
    (so, se)
}

#[test]
fn json_summary_has_the_exact_counts() {
    let dir = ferofs_testkit::scratch("report-json");
    let src = small_tree(dir.path());
    let img = dir.path().join("a.erofs");
    let uuid = "01234567-89ab-cdef-0123-456789abcdef";
    for (z, quiet) in [("lz4hc", false), ("none", true)] {
        let mut args = vec!["--json", "-z", z, "-j", "3", "-U", uuid, "-T", "1000000"];
        if quiet {
            args.push("-q");
        }
        let (stdout, stderr) = build_out(&args, &src, &img);
        assert_eq!(
            stderr, "",
            "-z {z}: --json prints nothing on stderr off a terminal"
        );
        assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
        let j = json(&stdout);
        assert!(j.is_object(), "{j}");
        let len = std::fs::metadata(&img).expect("stat image").len();
        assert_eq!(j["files"], 3, "{j}");
        assert_eq!(j["directories"], 2, "{j}");
        assert_eq!(j["symlinks"], 1, "{j}");
        assert_eq!(j["special"], 0, "{j}");
        assert_eq!(j["inodes"], 6, "{j}");
        assert_eq!(j["bytes_in"], 15_000, "{j}");
        assert_eq!(j["image_bytes"].as_u64(), Some(len), "{j}");
        assert_eq!(j["ratio"].as_f64(), Some(len as f64 / 15_000.0), "{j}");
        assert_eq!(j["dedupe_saved"], 0, "{j}");
        assert_eq!(j["fragment_bytes"], 0, "{j}");
        assert_eq!(j["fragments_saved"], 0, "{j}");
        assert_eq!(j["threads"], 3, "{j}");
        assert_eq!(j["uuid"], uuid, "{j}");
        assert_eq!(j["build_time"], 1_000_000, "{j}");
        assert_eq!(j["image"], img.to_string_lossy().as_ref(), "{j}");
        assert!(j["seconds"].as_f64().is_some_and(|s| s > 0.0), "{j}");
        assert!(j["peak_rss_bytes"].as_u64().is_some_and(|n| n > 0), "{j}");
        let info = json(&ok(&[&"inspect", &"--json", &img]));
        assert_eq!(info["image_bytes"], j["image_bytes"]);
        assert_eq!(info["counts"]["file_bytes"], 15_000);
        let compressed = info["counts"]["compressed_files"].as_u64();
        assert_eq!(compressed, Some(if z == "none" { 0 } else { 2 }), "{info}");
    }
}

#[test]
fn no_bar_off_a_terminal_and_nothing_with_quiet() {
    let dir = ferofs_testkit::scratch("report-pipe");
    let src = small_tree(dir.path());
    let img = dir.path().join("a.erofs");
    // stderr is a pipe here: the summary alone, no bar, no terminal control.
    let (stdout, stderr) = build_out(&["-j", "2"], &src, &img);
    assert_eq!(stdout, "");
    assert!(!stderr.contains(['\r', '\x1b', '=', '[']), "{stderr:?}");
    let labels: Vec<&str> = stderr
        .lines()
        .map(|l| l.split("  ").next().unwrap_or(""))
        .collect();
    assert_eq!(
        labels,
        [
            "image",
            "inodes",
            "bytes in",
            "image bytes",
            "dedupe",
            "fragments",
            "time",
            "peak memory"
        ],
        "{stderr}"
    );
    let len = std::fs::metadata(&img).expect("stat image").len();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines[0], format!("image        {}", img.display()));
    assert_eq!(
        lines[1],
        "inodes       6 (3 files, 2 directories, 1 symlinks, 0 special)"
    );
    assert_eq!(lines[2], "bytes in     15,000 bytes (14.65 KiB)");
    assert!(
        lines[3].starts_with(&format!("image bytes  {} bytes", fmt_count(len))),
        "{}",
        lines[3]
    );
    assert_eq!(lines[4], "dedupe       0 bytes saved");
    assert_eq!(fmt_count(1_234_567), "1,234,567");
    assert_eq!(fmt_count(123), "123");
    assert!(lines[6].ends_with(" s, 2 threads"), "{}", lines[6]);

    // --quiet: nothing at all.
    let (stdout, stderr) = build_out(&["-q"], &src, &img);
    assert_eq!((stdout.as_str(), stderr.as_str()), ("", ""));
}

/// `12,345`-style thousands.
fn fmt_count(n: u64) -> String {
    let digits: Vec<char> = n.to_string().chars().rev().collect();
    let groups: Vec<String> = digits
        .chunks(3)
        .map(|g| g.iter().rev().collect())
        .rev()
        .collect();
    groups.join(",")
}

/// `script` (util-linux) runs the build on a pseudo-terminal: its output is what a
/// person at a terminal sees.
fn on_terminal(args: &str, src: &Path, img: &Path) -> String {
    let cmd = format!(
        "{} build {args} {} {}",
        env!("CARGO_BIN_EXE_ferofs"),
        src.display(),
        img.display()
    );
    let out = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .env("COLUMNS", "100")
        .output()
        .expect("run script (util-linux)");
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{cmd}: {s}");
    s
}

#[test]
fn bar_on_a_terminal_and_not_with_quiet() {
    let dir = ferofs_testkit::scratch("report-tty");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    // Big enough that lzma on one thread takes well over the bar's 100 ms poll.
    std::fs::write(src.join("t.txt"), text(2 << 20, 3)).expect("write");
    let img = dir.path().join("a.erofs");
    let seen = on_terminal("-j 1 -z lzma -C 131072", &src, &img);
    assert!(seen.contains("scanning"), "{seen:?}");
    assert!(seen.contains("data      ["), "{seen:?}");
    assert!(seen.contains("/2.00 MiB"), "{seen:?}");
    // The bar is cleared (carriage return, erase line) before the summary.
    let at = seen.find("image        ").expect("summary");
    assert!(seen[..at].ends_with("\r\x1b[2K"), "{seen:?}");
    assert!(
        seen.contains("bytes in     2,097,152 bytes (2.00 MiB)"),
        "{seen:?}"
    );

    let seen = on_terminal("-q -j 1 -z lzma -C 131072", &src, &img);
    assert_eq!(seen, "");
}

#[test]
fn builder_counts_file_bytes_as_it_goes() {
    use ferofs_builder::{build_from_dir, BuildOptions, Compression, Progress};
    use ferofs_compress::CompressorSpec;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = ferofs_testkit::scratch("report-progress");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    // 48 files of 64 KiB (one compression job each) and 5 of at most one block (never
    // compressed: counted when all data is stored).
    for i in 0..48u64 {
        std::fs::write(src.join(format!("f{i:02}")), text(65_536, i)).expect("write");
    }
    for i in 0..5u64 {
        let n = 100 * (i as usize + 1);
        std::fs::write(src.join(format!("s{i}")), text(n, 100 + i)).expect("write");
    }
    let total = 48 * 65_536 + 1_500;
    for alg in ["lzma", "none"] {
        let p = Arc::new(Progress::new());
        let opts = BuildOptions {
            compression: (alg != "none").then(|| Compression {
                algorithms: vec![CompressorSpec::parse(alg).expect("spec")],
                ..Compression::default()
            }),
            threads: 1,
            progress: Some(p.clone()),
            ..BuildOptions::default()
        };
        let img = dir.path().join(format!("{alg}.erofs"));
        let stop = AtomicBool::new(false);
        let (report, seen) = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let mut seen = vec![(0, 0)];
                while !stop.load(Ordering::SeqCst) {
                    let now = (p.total(), p.done());
                    if seen.last() != Some(&now) {
                        seen.push(now);
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                seen
            });
            let report = build_from_dir(&src, &img, &opts).expect("build");
            stop.store(true, Ordering::SeqCst);
            (report, watcher.join().expect("watcher"))
        });
        assert_eq!(report.bytes_in, total, "{alg}");
        assert_eq!((p.total(), p.done()), (total, total), "{alg}");
        for &(t, d) in &seen {
            assert!(
                t == 0 && d == 0 || t == total && d <= total,
                "{alg}: {seen:?}"
            );
        }
        if alg == "lzma" {
            // Compressed: done grows one 64 KiB job at a time, then jumps to the total.
            let between: Vec<u64> = seen
                .iter()
                .map(|&(_, d)| d)
                .filter(|&d| d > 0 && d < total)
                .collect();
            assert!(between.len() >= 3, "{seen:?}");
            assert!(between.iter().all(|d| d % 65_536 == 0), "{seen:?}");
        }
    }
}

/// `--memory-limit`: LZMA at 1 MiB pclusters keeps about 45 MiB of codec state a
/// compression thread; under a limit that fits two, `-j 8` runs two and says so, with
/// the image of `-j 1`; with no limit, no warning; a bad size is refused.
#[test]
fn memory_limit_caps_compression_threads_with_a_warning() {
    let dir = ferofs_testkit::scratch("report-memlimit");
    let src = small_tree(dir.path());
    let uuid = "01234567-89ab-cdef-0123-456789abcdef";
    let base = ["-z", "lzma", "-C", "1048576", "-U", uuid, "-T", "1000000"];
    let img = |n: &str| dir.path().join(n);
    let with = |extra: &[&str], name: &str| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        build_out(&a, &src, &img(name)).1
    };
    let warn = "2 compression threads, not 8";
    let se = with(&["-j", "8", "--memory-limit", "512m"], "capped.erofs");
    assert!(se.contains(warn), "no warning: {se}");
    assert!(se.contains("--memory-limit"), "{se}");
    let se = with(&["-j", "8", "--memory-limit", "0"], "free.erofs");
    assert!(!se.contains("compression threads"), "{se}");
    let se = with(&["-j", "2"], "two.erofs");
    assert!(!se.contains("compression threads"), "{se}");
    with(&["-j", "1"], "one.erofs");
    let one = std::fs::read(img("one.erofs")).expect("read");
    for n in ["capped.erofs", "free.erofs", "two.erofs"] {
        assert!(
            std::fs::read(img(n)).expect("read") == one,
            "{n} differs from -j 1"
        );
    }
    let out = ferofs()
        .args(["build", "--memory-limit", "12q"])
        .arg(&src)
        .arg(img("bad.erofs"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        se.contains("--memory-limit 12q: unknown size suffix"),
        "{se}"
    );
    assert!(!img("bad.erofs").exists());
}

//! # ferofs-testkit — helpers for tests, never for the product
//!
//! - [`shared_dir`] finds `../shared` (docs, testdata, corpus scripts) beside the checkout.
//! - [`kernel_available`] decides whether kernel-mount tests run: they need root and
//!   loop devices. Missing either is a test FAILURE unless `FEROFS_SKIP_KERNEL=1`, in
//!   which case a loud SKIPPED line is printed.
//! - [`Tmpfs`] and [`Mount`] are RAII guards (unmounted on drop).
//! - [`make_tree`] runs `make-tree.py` (the tree with every hard case) on a tmpfs.
//! - [`digest`] runs `make-tree.py --digest`, [`treecmp`] the detailed comparison.
//! - [`golden`] decompresses a golden image into `target/golden/` once.
//! - [`noise`] makes seeded bytes that repeat nowhere (xorshift).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `shared/` beside the checkout (or `$FEROFS_SHARED`).
pub fn shared_dir() -> PathBuf {
    if let Ok(p) = std::env::var("FEROFS_SHARED") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let cand = root.join("../shared");
    cand.canonicalize().unwrap_or(cand)
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory under `target/test-scratch` (on disk, not tmpfs).
pub fn scratch(name: &str) -> tempfile::TempDir {
    let base = workspace_root().join("target/test-scratch");
    std::fs::create_dir_all(&base).expect("create target/test-scratch");
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .expect("create scratch dir")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// True when kernel tests can run. Panics (fails the test) when they cannot, unless
/// `FEROFS_SKIP_KERNEL=1` is set, in which case it prints SKIPPED and returns false.
pub fn kernel_available(test: &str) -> bool {
    let skip = std::env::var("FEROFS_SKIP_KERNEL")
        .map(|v| v == "1")
        .unwrap_or(false);
    let why = if !is_root() {
        Some("not running as root")
    } else if !Path::new("/dev/loop-control").exists() {
        Some("no /dev/loop-control (loop devices)")
    } else {
        None
    };
    match why {
        None => true,
        Some(w) if skip => {
            eprintln!("\n*** SKIPPED kernel test {test}: {w} (FEROFS_SKIP_KERNEL=1) ***\n");
            false
        }
        Some(w) => panic!(
            "kernel test {test} cannot run: {w}. Run as root with loop devices, \
             or set FEROFS_SKIP_KERNEL=1 to skip kernel tests explicitly."
        ),
    }
}

/// Run a command, panicking with its output on failure; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tmpfs mounted on a fresh directory; unmounted and removed on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new(size: &str) -> Self {
        let dir = scratch("tmpfs");
        run(Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path()));
        Tmpfs { dir }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// An image mounted read-only by the kernel; unmounted on drop.
pub struct Mount {
    dir: tempfile::TempDir,
}

impl Mount {
    /// `mount -t FSTYPE -o loop,ro IMAGE DIR`.
    pub fn new(fstype: &str, image: &Path) -> Self {
        let dir = scratch("mnt");
        run(Command::new("mount")
            .args(["-t", fstype, "-o", "loop,ro"])
            .arg(image)
            .arg(dir.path()));
        Mount { dir }
    }
    /// `mount -t erofs -o loop,ro IMAGE DIR`.
    pub fn erofs(image: &Path) -> Self {
        Self::new("erofs", image)
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A tmpfs holding `make-tree.py`'s tree in `tree/`. Returns (guard, tree path).
pub fn make_tree() -> (Tmpfs, PathBuf) {
    let fs = Tmpfs::new("2G");
    let tree = fs.path().join("tree");
    let script = shared_dir().join("testdata/make-tree.py");
    run(Command::new("python3").arg(&script).arg(&tree));
    (fs, tree)
}

/// `make-tree.py --digest DIR`: equal digests mean equal trees (paths, types, modes,
/// owners, mtimes to the ns, sizes, contents, symlink targets, rdev, xattrs, hardlinks).
pub fn digest(dir: &Path) -> String {
    let script = shared_dir().join("testdata/make-tree.py");
    run(Command::new("python3")
        .arg(&script)
        .arg("--digest")
        .arg(dir))
    .trim()
    .to_string()
}

/// `treecmp.py A B` output (empty when equal), for failure messages.
pub fn treecmp(a: &Path, b: &Path) -> String {
    let script = shared_dir().join("testdata/treecmp.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(a)
        .arg(b)
        .output()
        .expect("run treecmp.py");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    s
}

/// Assert that two trees are identical by digest, showing treecmp's diff when not.
pub fn assert_same_tree(expected: &Path, actual: &Path) {
    let (de, da) = (digest(expected), digest(actual));
    if de != da {
        panic!(
            "trees differ: {} vs {}\n{}",
            expected.display(),
            actual.display(),
            treecmp(expected, actual)
        );
    }
}

/// `n` seeded pseudo-random bytes (xorshift64, state `seed | 1`): no stretch of them
/// repeats, so they neither compress nor dedupe by accident.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    xorshift_bytes(n, seed | 1, 0)
}

/// `n` bytes of xorshift64 (13, 7, 17) from `state`, each the generator's bits
/// `shift..shift + 8`.
fn xorshift_bytes(n: usize, state: u64, shift: u32) -> Vec<u8> {
    let mut x = state;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> shift) as u8
        })
        .collect()
}

/// `lines` lines of text, each starting with 16 hex digits drawn from [`noise`]`(_,
/// seed)`: texts of different seeds share no line start (the builder's similarity
/// sketch looks at line starts).
pub fn text_lines(lines: usize, seed: u64) -> Vec<u8> {
    let r = noise(lines * 8, seed);
    let mut t = Vec::new();
    for (k, w) in r.chunks_exact(8).enumerate() {
        let mut v = [0u8; 8];
        v.copy_from_slice(w);
        let v = u64::from_le_bytes(v);
        t.extend(format!("{v:016x} = line {k} of a text\n").bytes());
    }
    t
}

/// `n` bytes of xorshift64 from `state` as given (non-zero), each the generator's bits
/// 24..32: the fuzz targets' noise, so a test can rebuild a fuzzer's input exactly.
pub fn noise_bits24(n: usize, state: u64) -> Vec<u8> {
    xorshift_bytes(n, state, 24)
}

/// A golden image from `shared/testdata/erofs-utils-1.9.3/NAME.erofs.zst` (or any
/// relative `.zst` path under testdata), decompressed once into `target/golden/`.
pub fn golden(rel: &str) -> PathBuf {
    let src = shared_dir().join("testdata").join(rel);
    let name = rel.replace('/', "_");
    let name = name.strip_suffix(".zst").unwrap_or(&name).to_string();
    let dir = workspace_root().join("target/golden");
    std::fs::create_dir_all(&dir).expect("create target/golden");
    let dst = dir.join(&name);
    if dst.exists() {
        return dst;
    }
    // Unique per call: tests of one process may decompress the same image at once.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.tmp{}.{seq}", std::process::id()));
    {
        let input =
            std::fs::File::open(&src).unwrap_or_else(|e| panic!("open {}: {e}", src.display()));
        let mut dec = zstd::stream::read::Decoder::new(input).expect("zstd decoder");
        dec.window_log_max(31).expect("window");
        let mut out = std::fs::File::create(&tmp).expect("create golden tmp");
        std::io::copy(&mut dec, &mut out)
            .unwrap_or_else(|e| panic!("decompress {}: {e}", src.display()));
    }
    // Another test may have won the race: its rename left the same bytes.
    std::fs::rename(&tmp, &dst).expect("rename golden");
    dst
}

/// Path of a tool from Debian's erofs-utils etc., if installed. `FEROFS_FSCK_EROFS`
/// names another fsck.erofs (e.g. a newer build than the distribution's).
pub fn tool(name: &str) -> Option<PathBuf> {
    if name == "fsck.erofs" {
        if let Some(p) = std::env::var_os("FEROFS_FSCK_EROFS").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Run `fsck.erofs IMAGE`; returns Err(output) on failure. Panics if fsck.erofs is missing.
pub fn fsck_erofs(image: &Path) -> Result<String, String> {
    let fsck = tool("fsck.erofs").expect("fsck.erofs not installed (apt-get install erofs-utils)");
    fsck_erofs_with(&fsck, image)
}

/// The installed fsck.erofs version as (major, minor), from `fsck.erofs -V`.
pub fn fsck_erofs_version() -> Option<(u32, u32)> {
    tool_version(&tool("fsck.erofs")?)
}

/// (major, minor) from `TOOL -V`: "fsck.erofs 1.5", "fsck.erofs (erofs-utils) 1.9.3".
fn tool_version(tool: &Path) -> Option<(u32, u32)> {
    let out = Command::new(tool).arg("-V").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let mut it = v.split(['.', '-']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// An fsck.erofs that knows metabox images (erofs-utils 1.9+): `$FEROFS_FSCK_EROFS`,
/// then the locally built 1.9.3 in `anchors/` beside `shared/`, then the one on PATH
/// if it is new enough. None when there is none (Debian 12's 1.5 is not).
pub fn fsck_erofs_metabox() -> Option<PathBuf> {
    let anchors = shared_dir().join("../anchors/erofs-utils/bin/fsck.erofs");
    std::env::var_os("FEROFS_FSCK_EROFS")
        .map(PathBuf::from)
        .into_iter()
        .chain([anchors])
        .chain(tool("fsck.erofs"))
        .find(|p| p.is_file() && tool_version(p).is_some_and(|v| v >= (1, 9)))
}

/// Run an fsck.erofs that knows metabox images on `image` (panicking with `what` when
/// it fails), or print a loud SKIPPED line when there is none.
pub fn fsck_metabox(image: &Path, what: &str) {
    match fsck_erofs_metabox() {
        Some(fsck) => {
            if let Err(e) = fsck_erofs_with(&fsck, image) {
                panic!("{what}: {} failed:\n{e}", fsck.display());
            }
        }
        None => eprintln!(
            "SKIPPED fsck.erofs for {what}: no fsck.erofs 1.9+ (set FEROFS_FSCK_EROFS); \
             the kernel mount, ferofs check and extract are the checks"
        ),
    }
}

/// Run an fsck.erofs that knows metabox images on `image` with `devices` as its extra
/// devices (`--device=` each, in order), panicking with `what` when it fails; nothing
/// (a loud SKIPPED line) when there is none.
pub fn fsck_metabox_devices(image: &Path, devices: &[&Path], what: &str) {
    let Some(fsck) = fsck_erofs_metabox() else {
        eprintln!("SKIPPED fsck.erofs --device for {what}: no fsck.erofs 1.9+");
        return;
    };
    let out = Command::new(&fsck)
        .args(devices.iter().map(|d| format!("--device={}", d.display())))
        .arg(image)
        .output()
        .expect("run fsck.erofs");
    assert!(
        out.status.success(),
        "{what}: fsck.erofs --device: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run `fsck` (an fsck.erofs) on `image`; Err(output) on failure.
pub fn fsck_erofs_with(fsck: &Path, image: &Path) -> Result<String, String> {
    let out = Command::new(fsck)
        .arg(image)
        .output()
        .expect("run fsck.erofs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Run fsck.erofs when it can read images with this block size: erofs-utils before 1.7
/// only reads 4 KiB blocks (Debian 12 ships 1.5). Prints a note when it cannot.
pub fn fsck_erofs_if_supported(image: &Path, block_size: u32) -> Result<String, String> {
    if block_size != 4096 && fsck_erofs_version().is_some_and(|v| v < (1, 7)) {
        eprintln!(
            "note: fsck.erofs {:?} cannot read {block_size}-byte blocks; the kernel mount is the check",
            fsck_erofs_version()
        );
        return Ok(String::new());
    }
    fsck_erofs(image)
}

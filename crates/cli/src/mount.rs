//! `ferofs mount IMAGE DIR`: flags to [`ferofs_mount::Options`], and daemonising.
//!
//! Background by default without fork(2) (the process may already run threads): the
//! command starts itself again as the daemon (hidden `--daemon-child`), in a new
//! session, with its stdout and stderr on pipes, and waits. The daemon mounts, and
//! either writes "ready" (the mount is up: the command exits 0, the daemon serves on
//! with its output on /dev/null) or exits with its error on stderr, which the command
//! prints and fails with.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(Args)]
pub struct MountArgs {
    /// The image: a file (`--offset` when it starts inside one) or a URL (http://,
    /// https://, s3://bucket/key; see --cache-dir).
    image: PathBuf,
    /// The mount point (an existing directory).
    dir: PathBuf,
    /// Stay in the foreground (serve until unmounted or interrupted).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Mount options, comma-separated: allow_other, cache=SIZE, preload=SIZE (metadata
    /// read into memory at mount, default 16m; for URLs default 0), nopreload (=
    /// preload=0), read_ahead=SIZE (the FUSE device's read-ahead window, set as root;
    /// default 4m, 0: the kernel's 128k), threads=N, ra_threads=N, suid, dev, noexec,
    /// default_permissions (default),
    /// no_default_permissions, ro.
    #[arg(short = 'o', value_name = "OPTS")]
    options: Vec<String>,
    /// Write every regular file, the first time its data is read, to FILE (paths relative
    /// to the image root, one per line: the list `ferofs build --sort FILE` takes);
    /// flushed when the mount ends.
    #[arg(long, value_name = "FILE")]
    record_access: Option<PathBuf>,
    /// Report reader errors (corruption) on stderr as requests meet them (with -f).
    #[arg(short, long)]
    verbose: bool,
    /// Internal: this process is the daemon of a background mount.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

fn options(a: &MountArgs) -> Result<ferofs_mount::Options> {
    let mut o = ferofs_mount::Options::new(&a.image, &a.dir);
    o.offset = crate::source::offset()?;
    o.record_access = a.record_access.clone();
    o.verbose = a.verbose;
    // A URL: a walk at mount would be a round trip per metadata block; the remote
    // source fetches the metadata region ahead instead (`prefetch_metadata`).
    if crate::source::is_url(&a.image) {
        o.preload_bytes = 0;
    }
    for opt in a
        .options
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let num = |v: Option<&str>| -> Result<usize> {
            v.with_context(|| format!("-o {k} needs a value"))?
                .parse()
                .with_context(|| format!("-o {opt}: not a number"))
        };
        match k {
            "allow_other" => o.allow_other = true,
            "cache" => {
                let n = crate::source::parse_size("cache=", v.context("-o cache needs a size")?)?;
                o.cache_bytes = usize::try_from(n).context("cache=: too large")?;
            }
            "preload" => {
                let n =
                    crate::source::parse_size("preload=", v.context("-o preload needs a size")?)?;
                o.preload_bytes = usize::try_from(n).context("preload=: too large")?;
            }
            "nopreload" => o.preload_bytes = 0,
            "read_ahead" => {
                o.read_ahead_bytes = crate::source::parse_size(
                    "read_ahead=",
                    v.context("-o read_ahead needs a size")?,
                )?;
            }
            "threads" => o.threads = num(v)?.clamp(1, 256),
            "ra_threads" => o.prefetch_threads = num(v)?.min(64),
            "suid" => o.suid = true,
            "dev" => o.dev = true,
            "noexec" => o.noexec = true,
            "exec" => o.noexec = false,
            "default_permissions" => o.default_permissions = true,
            "no_default_permissions" => o.default_permissions = false,
            "ro" => {}
            "rw" => bail!("-o rw: EROFS images are read-only"),
            _ => bail!("-o {opt}: unknown mount option"),
        }
    }
    Ok(o)
}

pub fn run(a: MountArgs) -> Result<()> {
    let o = options(&a)?;
    if a.foreground {
        let m = open_and_mount(&o)?;
        let r = m.run();
        crate::source::print_stats();
        return Ok(r?);
    }
    if a.daemon_child {
        return daemon(&o);
    }
    background()
}

/// Mount a file, or open a URL and mount what it serves.
fn open_and_mount(o: &ferofs_mount::Options) -> Result<ferofs_mount::Mounted> {
    if crate::source::is_url(&o.image) {
        anyhow::ensure!(o.offset == 0, "--offset is for image files, not URLs");
        anyhow::ensure!(
            !crate::source::has_devices(),
            "--device is for image files, not URLs"
        );
        let url = o.image.to_string_lossy();
        let r =
            crate::source::open_remote(&url).with_context(|| format!("cannot open image {url}"))?;
        crate::source::prefetch_metadata(&r);
        return Ok(ferofs_mount::mount_source(
            o,
            ferofs_mount::ImageSource::Shared(r),
        )?);
    }
    if crate::source::has_devices() {
        let file = std::fs::File::open(&o.image)
            .with_context(|| format!("cannot open image {}", o.image.display()))?;
        let f = ferofs_mount::OffsetFile::new(file, o.offset)
            .with_context(|| format!("{}: --offset", o.image.display()))?;
        let j = crate::source::joined(f, &o.image)?;
        return Ok(ferofs_mount::mount_source(
            o,
            ferofs_mount::ImageSource::Shared(std::sync::Arc::new(j)),
        )?);
    }
    Ok(ferofs_mount::mount(o)?)
}

/// The daemon: mount, tell the waiting command, serve.
fn daemon(o: &ferofs_mount::Options) -> Result<()> {
    let _ = rustix::process::setsid();
    let m = open_and_mount(o)?;
    // Everything named by a relative path is open now: do not pin the caller's directory.
    let _ = std::env::set_current_dir("/");
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // From here on nobody reads our pipes: stderr first, then "ready" and stdout.
    rustix::stdio::dup2_stderr(&null)?;
    {
        let mut out = std::io::stdout().lock();
        out.write_all(b"ready\n")?;
        out.flush()?;
    }
    rustix::stdio::dup2_stdout(&null)?;
    m.run()?;
    Ok(())
}

/// The command: start the daemon and wait until the mount is up or the daemon failed.
/// The ferofs command line (after the program name) a drop-in translated (erofsfuse's),
/// for the daemon to be started with; unset: this process's own arguments.
static ARGS: std::sync::OnceLock<Vec<OsString>> = std::sync::OnceLock::new();

/// Start background mounts with `args` (a drop-in's translation) in place of this
/// process's arguments.
pub fn set_args(args: Vec<OsString>) {
    let _ = ARGS.set(args);
}

fn background() -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the ferofs executable")?;
    let args: Vec<OsString> = match ARGS.get() {
        Some(a) => a.clone(),
        None => std::env::args_os().skip(1).collect(),
    };
    let mut cmd = Command::new(exe);
    // glibc: every thread that allocates gets its own arena, and the dynamic mmap
    // threshold soon puts the 1 MiB decoded extents in those arenas, where extents freed
    // by other threads (cache eviction) fragment them. Two arenas and a fixed 256 KiB
    // threshold (big buffers go back to the system when freed) keep the daemon's memory
    // at its live size: 8 readers on 1 MiB pclusters with an 8 MiB cache peaked at
    // 63-66 MiB without, 36 MiB with. Unless the caller set them.
    for (k, v) in [
        ("MALLOC_ARENA_MAX", "2"),
        ("MALLOC_MMAP_THRESHOLD_", "262144"),
    ] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    // Right after the subcommand (global options such as --cache-dir may come first).
    let at = args
        .iter()
        .position(|a| a == "mount")
        .map_or(1, |i| i + 1)
        .min(args.len());
    let mut child = cmd
        .args(&args[..at])
        .arg("--daemon-child")
        .args(&args[at..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the mount daemon")?;
    let mut said = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        // Ends at "ready" + EOF (the daemon closes it) or when the daemon exits.
        out.read_to_end(&mut said)?;
    }
    if said.starts_with(b"ready\n") {
        return Ok(());
    }
    let mut err = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_end(&mut err)?;
    }
    let status = child.wait()?;
    let msg = String::from_utf8_lossy(&err);
    let msg = msg.trim();
    let msg = msg.strip_prefix("ferofs: error: ").unwrap_or(msg);
    if msg.is_empty() {
        bail!("the mount daemon failed ({status})");
    }
    bail!("{msg}")
}

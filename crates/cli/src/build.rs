//! `build`: flags -> validated `BuildOptions`, then the builder library.

use anyhow::{bail, Context, Result};
use clap::Args;
use ferofs_builder::{BuildOptions, UuidChoice};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct BuildArgs {
    /// Source directory.
    source: PathBuf,
    /// Output image (written to a temporary file and renamed on success).
    image: PathBuf,
    /// Block size in bytes: 512, 1024, 2048 or 4096.
    #[arg(short = 'b', long, default_value_t = 4096)]
    block_size: u32,
    /// Make every file owned by root (uid 0, gid 0).
    #[arg(long)]
    all_root: bool,
    /// Set every file's uid.
    #[arg(long, value_name = "UID")]
    force_uid: Option<u32>,
    /// Set every file's gid.
    #[arg(long, value_name = "GID")]
    force_gid: Option<u32>,
    /// Leave out this path (relative to the source; repeatable).
    #[arg(long, value_name = "PATH")]
    exclude_path: Vec<PathBuf>,
    /// Leave out paths matching this regex (relative to the source; repeatable).
    #[arg(long, value_name = "REGEX")]
    exclude_regex: Vec<String>,
    /// Volume label (at most 15 bytes).
    #[arg(short = 'L', long)]
    label: Option<String>,
    /// Filesystem UUID, or "random". Default: derived from the content (reproducible).
    #[arg(short = 'U', long)]
    uuid: Option<String>,
    /// Build time and every file's mtime, in seconds since the epoch.
    #[arg(short = 'T', long, allow_negative_numbers = true)]
    timestamp: Option<i64>,
    /// Store the build time instead of each file's mtime (smaller inodes).
    #[arg(long)]
    ignore_mtime: bool,
    /// Extended options, comma-separated: `noinline_data` (or `^inline_data`).
    #[arg(short = 'E', value_name = "OPTS")]
    extended: Vec<String>,
    /// Worker threads (0 = all cores). Output is identical for any value.
    #[arg(short = 'j', long, default_value_t = 0)]
    threads: usize,
    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,
}

fn parse_uuid(s: &str) -> Result<UuidChoice> {
    if s == "random" {
        return Ok(UuidChoice::Random);
    }
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("--uuid: {s:?} is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) or \"random\"");
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(UuidChoice::Fixed(u))
}

pub fn options(a: &BuildArgs) -> Result<BuildOptions> {
    let mut o = BuildOptions::default();
    if !(512..=4096).contains(&a.block_size) || !a.block_size.is_power_of_two() {
        bail!(
            "--block-size must be 512, 1024, 2048 or 4096 (got {})",
            a.block_size
        );
    }
    o.block_size = a.block_size;
    o.all_root = a.all_root;
    o.force_uid = a.force_uid;
    o.force_gid = a.force_gid;
    o.exclude_paths = a.exclude_path.clone();
    for r in &a.exclude_regex {
        o.exclude_regex
            .push(regex::Regex::new(r).with_context(|| format!("--exclude-regex {r:?}"))?);
    }
    if let Some(l) = &a.label {
        if l.len() > 15 {
            bail!("--label: at most 15 bytes (got {})", l.len());
        }
        o.label = Some(l.clone());
    }
    if let Some(u) = &a.uuid {
        o.uuid = parse_uuid(u)?;
    }
    o.timestamp = a.timestamp;
    o.ignore_mtime = a.ignore_mtime;
    if let Ok(s) = std::env::var("SOURCE_DATE_EPOCH") {
        if !s.is_empty() {
            o.source_date_epoch = Some(
                s.trim()
                    .parse()
                    .with_context(|| format!("SOURCE_DATE_EPOCH={s:?} is not a number"))?,
            );
        }
    }
    for opt in a.extended.iter().flat_map(|e| e.split(',')) {
        match opt {
            "noinline_data" | "^inline_data" => o.inline_data = false,
            "inline_data" => o.inline_data = true,
            "" => {}
            other => bail!("-E: unknown extended option {other:?}"),
        }
    }
    o.threads = a.threads;
    Ok(o)
}

pub fn run(a: BuildArgs) -> Result<()> {
    let opts = options(&a)?;
    let t0 = Instant::now();
    let report = ferofs_builder::build_from_dir(&a.source, &a.image, &opts)
        .with_context(|| format!("building {} from {}", a.image.display(), a.source.display()))?;
    if !a.quiet {
        eprintln!(
            "{}: {} bytes, {} inodes, {:.2}s",
            a.image.display(),
            report.image_bytes,
            report.inodes,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

//! `ferofs`: the command-line front end. No format logic lives here: flags are turned
//! into validated options for the builder/reader libraries, and errors are printed once.

mod build;
mod check;
mod compat;
mod diff;
mod export;
mod extract;
mod fmt;
mod inspect;
mod list;
mod mount;
mod report;
mod source;
mod tarw;
mod vmdk;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ferofs",
    version,
    about = "Build, read, extract and check EROFS images",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    remote: source::RemoteArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build an EROFS image from a directory, tar streams (`--tar`), a SquashFS image
    /// (`convert` is an alias) or an EROFS image (re-encoded). Run as `mkfs.erofs`,
    /// `fsck.erofs` or `dump.erofs` (or `ferofs mkfs|fsck|dump`), the binary takes those
    /// tools' command lines. `--verity` appends a dm-verity hash tree and prints the
    /// root hash and the `veritysetup open` command line.
    #[command(alias = "convert")]
    Build(Box<build::BuildArgs>),
    /// List a directory of an image (like `ls -l`).
    Ls {
        /// The image: a file or a URL (http://, https://, s3://bucket/key).
        image: PathBuf,
        /// Path inside the image (default: the root).
        #[arg(default_value = "/")]
        path: String,
        /// The directory (or file) by its inode number instead of a path
        /// (dump.erofs's `--nid`).
        #[arg(long, conflicts_with = "path")]
        nid: Option<u64>,
        /// Print JSON (one array of entries).
        #[arg(long)]
        json: bool,
        /// Include "." and "..".
        #[arg(short = 'a', long)]
        all: bool,
        /// Every entry at and below PATH, by its full path (like `unsquashfs -lls` or
        /// `tar tv`); with `--json` one object per entry with its `path`.
        #[arg(short = 'R', long, conflicts_with = "all")]
        recursive: bool,
    },
    /// Print one file of an image to standard output.
    Cat {
        /// The image: a file or a URL (http://, https://, s3://bucket/key).
        image: PathBuf,
        #[arg(required_unless_present = "nid")]
        path: Option<String>,
        /// The file by its inode number instead of a path (dump.erofs's `--nid`):
        /// also inodes no directory lists, e.g. the packed inode.
        #[arg(long, conflicts_with = "path")]
        nid: Option<u64>,
    },
    /// Show an inode: type, mode, owner, times, xattrs and data layout.
    Stat {
        /// The image: a file or a URL (http://, https://, s3://bucket/key).
        image: PathBuf,
        /// The inode's path in the image.
        #[arg(required_unless_present = "nid")]
        path: Option<String>,
        /// The inode by its number instead of a path: also inodes no directory lists,
        /// e.g. the packed inode (`inspect` shows its nid), as dump.erofs's `--nid`.
        #[arg(long, conflicts_with = "path")]
        nid: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Extract the whole tree (or a subtree) with its metadata.
    Extract(extract::ExtractArgs),
    /// Write the tree (or a subtree) as a PAX tar stream (plain, gzip or zstd).
    Export(export::ExportArgs),
    /// Compare two trees (images or directories): added, removed and changed paths.
    /// Exit status 0 when equal, 1 when they differ, 2 on error.
    Diff(diff::DiffArgs),
    /// Verify every structure of an image, read every byte of every file and report
    /// every problem (`--verity ROOTHASH`: and every block against the dm-verity tree).
    /// Exit status 0 when clean, 1 when problems were found, 2 when the image cannot be
    /// opened.
    Check(check::CheckArgs),
    /// Mount an image through FUSE, read-only (in the background unless -f).
    Mount(mount::MountArgs),
    /// Show the superblock, features, counts and sizes.
    Inspect {
        /// The image: a file or a URL (http://, https://, s3://bucket/key).
        image: PathBuf,
        #[arg(long)]
        json: bool,
        /// Print udev's block device properties only (`ID_FS_TYPE=erofs`,
        /// `ID_FS_UUID`, `ID_FS_LABEL`, ...; as dump.erofs's `--blkid-udev`), for
        /// `IMPORT{program}` in udev rules; reads the superblock alone.
        #[arg(long, conflicts_with = "json")]
        udev: bool,
    },
}

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Build(a) => build::run(*a),
        Cmd::Ls {
            image,
            path,
            nid,
            json,
            all,
            recursive,
        } => list::ls(&image, &path, nid, json, all, recursive),
        Cmd::Cat { image, path, nid } => list::cat(&image, path.as_deref(), nid),
        Cmd::Stat {
            image,
            path,
            nid,
            json,
        } => list::stat(&image, path.as_deref(), nid, json),
        Cmd::Extract(a) => extract::run(a),
        Cmd::Export(a) => export::run(a),
        Cmd::Diff(_) => unreachable_diff(),
        Cmd::Check(_) => unreachable_diff(),
        Cmd::Inspect {
            image, udev: true, ..
        } => inspect::udev(&image),
        Cmd::Inspect { image, json, .. } => inspect::inspect(&image, json),
        Cmd::Mount(a) => mount::run(a),
    }
}

/// `diff` and `check` are dispatched in `main` (they have exit statuses of their own).
fn unreachable_diff() -> Result<()> {
    anyhow::bail!("diff and check are run by main")
}

fn main() -> ExitCode {
    // Drop-in: run as `mkfs.erofs` (a symlink) or as `ferofs mkfs ...`, take
    // mkfs.erofs's command line (see compat.rs).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let prog = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|s| s.to_str())
        .unwrap_or("");
    // fsck.erofs and dump.erofs likewise (`ferofs fsck`, `ferofs dump`).
    // erofsfuse too (`ferofs erofsfuse`).
    let (tool, rest) = match (prog, argv.get(1).and_then(|a| a.to_str())) {
        ("mkfs.erofs" | "fsck.erofs" | "dump.erofs" | "erofsfuse", _) => (
            prog.trim_end_matches(".erofs"),
            argv.get(1..).unwrap_or_default(),
        ),
        (_, Some(t @ ("mkfs" | "fsck" | "dump" | "erofsfuse"))) => {
            (t, argv.get(2..).unwrap_or_default())
        }
        _ => ("", &[][..]),
    };
    let lines = match tool {
        "fsck" => Some(compat::fsck_to_ferofs(rest).map(|v| vec![v])),
        "dump" => Some(compat::dump_to_ferofs(rest)),
        "erofsfuse" => Some(compat::erofsfuse_to_ferofs(rest).map(|v| {
            // A background mount starts its daemon with this command line.
            mount::set_args(v.clone());
            vec![v]
        })),
        _ => None,
    };
    if let Some(lines) = lines {
        let lines = match lines {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e:#}");
                return ExitCode::FAILURE;
            }
        };
        for l in lines {
            let cli = Cli::parse_from(std::iter::once("ferofs".into()).chain(l));
            source::set_args(cli.remote);
            let r = match cli.cmd {
                // fsck.erofs: 1 for any problem found, as for an image that cannot
                // be opened.
                Cmd::Check(a) => check::run(a).and_then(|clean| {
                    if clean {
                        Ok(())
                    } else {
                        Err(anyhow::anyhow!("problems found"))
                    }
                }),
                cmd => run(cmd),
            };
            if let Err(e) = r {
                eprintln!("ferofs: error: {e:#}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    let mkfs_args = (tool == "mkfs").then_some(rest);
    let cli = match mkfs_args {
        Some(rest) => match compat::mkfs_to_build(rest) {
            Ok(b) => Cli::parse_from(["ferofs".into(), "build".into()].into_iter().chain(b)),
            Err(e) => {
                eprintln!("{e:#}");
                return ExitCode::FAILURE;
            }
        },
        None => Cli::parse(),
    };
    source::set_args(cli.remote.clone());
    let code = main_cmd(cli.cmd);
    source::print_stats();
    code
}

fn main_cmd(cmd: Cmd) -> ExitCode {
    if let Cmd::Diff(a) = cmd {
        // Like diff(1): 0 equal, 1 different, 2 trouble.
        return match diff::run(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                if let Some(io) = e.downcast_ref::<std::io::Error>() {
                    if io.kind() == std::io::ErrorKind::BrokenPipe {
                        return ExitCode::from(2);
                    }
                }
                eprintln!("ferofs: error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Cmd::Check(a) = cmd {
        // 0 clean, 1 problems found, 2 cannot open (or cannot write the report).
        return match check::run(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("ferofs: error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    match run(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`ferofs cat img f | head`) is not an error worth shouting about.
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("ferofs: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

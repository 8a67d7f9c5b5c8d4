//! `ferofs`: the command-line front end. No format logic lives here: flags are turned
//! into validated options for the builder/reader libraries, and errors are printed once.

mod build;
mod extract;
mod fmt;
mod inspect;
mod list;
mod mount;
mod report;

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
}

#[derive(Subcommand)]
enum Cmd {
    /// Build an EROFS image from a directory.
    Build(Box<build::BuildArgs>),
    /// List a directory of an image (like `ls -l`).
    Ls {
        image: PathBuf,
        /// Path inside the image (default: the root).
        #[arg(default_value = "/")]
        path: String,
        /// Print JSON (one array of entries).
        #[arg(long)]
        json: bool,
        /// Include "." and "..".
        #[arg(short = 'a', long)]
        all: bool,
    },
    /// Print one file of an image to standard output.
    Cat { image: PathBuf, path: String },
    /// Show an inode: type, mode, owner, times, xattrs and data layout.
    Stat {
        image: PathBuf,
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Extract the whole tree (or a subtree) with its metadata.
    Extract(extract::ExtractArgs),
    /// Verify every structure of an image and read every byte of every file.
    Check {
        image: PathBuf,
        /// Print every path as it is checked.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Mount an image through FUSE, read-only (in the background unless -f).
    Mount(mount::MountArgs),
    /// Show the superblock, features, counts and sizes.
    Inspect {
        image: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Build(a) => build::run(*a),
        Cmd::Ls {
            image,
            path,
            json,
            all,
        } => list::ls(&image, &path, json, all),
        Cmd::Cat { image, path } => list::cat(&image, &path),
        Cmd::Stat { image, path, json } => list::stat(&image, &path, json),
        Cmd::Extract(a) => extract::run(a),
        Cmd::Check { image, verbose } => inspect::check(&image, verbose),
        Cmd::Inspect { image, json } => inspect::inspect(&image, json),
        Cmd::Mount(a) => mount::run(a),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
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

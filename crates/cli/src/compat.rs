//! Drop-in command lines: run as `mkfs.erofs` (a symlink to `ferofs`) or as
//! `ferofs mkfs ...`, the binary takes mkfs.erofs's command line and turns it into the
//! equivalent `ferofs build` command line. What ferofs implements behaves the same; an
//! option it does not implement is an error naming it, never silently ignored.
//!
//! mkfs.erofs parses with getopt: short options take their value attached (`-zlz4hc`)
//! or as the next argument (`-z lz4hc`); long options take `--opt=value` or
//! `--opt value` (for those that need one); positional arguments are `IMAGE SOURCE`
//! (the image first, unlike `ferofs build`).

use anyhow::{bail, Result};
use std::ffi::OsString;

/// mkfs.erofs options ferofs knows but does not implement (a clear error).
const UNSUPPORTED_LONG: [&str; 22] = [
    "uid-offset",
    "gid-offset",
    "chunksize",
    "mount-point",
    "file-contexts",
    "max-extent-bytes",
    "mkfs-time",
    "blobdev",
    "dsunit",
    "fsalignblks",
    "hard-dereference",
    "incremental",
    "clean",
    "offset",
    "root-xattr-isize",
    "async-queue-limit",
    "gzinfo",
    "vmdk-desc",
    "zD",
    "MZ",
    "random-pclusterblks",
    "random-algorithms",
];

/// Long options whose value may be the next argument.
const LONG_WITH_VALUE: [&str; 10] = [
    "force-uid",
    "force-gid",
    "exclude-path",
    "exclude-regex",
    "compress-hints",
    "workers",
    "sort",
    "uid-offset",
    "gid-offset",
    "chunksize",
];

/// The `ferofs build` arguments (after `build`) for mkfs.erofs's `args` (after the
/// program name).
pub fn mkfs_to_build(args: &[OsString]) -> Result<Vec<OsString>> {
    let mut out: Vec<OsString> = Vec::new();
    let mut pos: Vec<OsString> = Vec::new();
    let mut tar: Option<char> = None;
    let mut compress = false;
    let mut sort_none = false;
    let mut i = 0;
    // Bounded: every pass consumes at least one argument.
    while i < args.len() {
        let raw = &args[i];
        i += 1;
        let Some(a) = raw.to_str() else {
            // A non-UTF-8 argument can only be a path.
            pos.push(raw.clone());
            continue;
        };
        if a == "--" {
            pos.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let mut value = || -> Result<String> {
                if let Some(v) = &inline {
                    return Ok(v.clone());
                }
                match args.get(i).and_then(|v| v.to_str()) {
                    Some(v) if LONG_WITH_VALUE.contains(&name) => {
                        i += 1;
                        Ok(v.to_string())
                    }
                    _ => bail!("mkfs.erofs: option --{name} needs a value"),
                }
            };
            match name {
                "quiet" => out.push("--quiet".into()),
                "all-root" => out.push("--all-root".into()),
                "aufs" => out.push("--aufs".into()),
                "ignore-mtime" => out.push("--ignore-mtime".into()),
                // ferofs keeps each file's mtime by default, and -T sets all of them
                // (mkfs.erofs's --all-time, its default).
                "preserve-mtime" | "all-time" => {}
                // Compressed tar streams are detected by their magic.
                "ungzip" | "unxz" if inline.is_none() => {}
                "ungzip" | "unxz" => {
                    bail!("mkfs.erofs: --{name}=FILE (dumping the raw stream) is not implemented by ferofs")
                }
                "force-uid" | "force-gid" | "exclude-path" | "exclude-regex" | "compress-hints" => {
                    let v = value()?;
                    out.push(format!("--{name}").into());
                    out.push(v.into());
                }
                "workers" => {
                    let v = value()?;
                    out.push("-j".into());
                    out.push(v.into());
                }
                "sort" => match value()?.as_str() {
                    "none" => sort_none = true,
                    "path" => {}
                    v => bail!("mkfs.erofs: --sort={v}: expected path or none"),
                },
                "tar" => {
                    let v = inline.clone().unwrap_or_else(|| "f".into());
                    tar = Some(match v.as_str() {
                        "f" => 'f',
                        "i" => 'i',
                        _ => bail!(
                            "mkfs.erofs: --tar={v} is not implemented by ferofs (f and i are)"
                        ),
                    });
                }
                "ovlfs-strip" => {
                    let v = inline.clone().unwrap_or_else(|| "1".into());
                    out.push(format!("--ovlfs-strip={v}").into());
                }
                "help" => {
                    out.push("--help".into());
                    return Ok(out);
                }
                "version" => {
                    out.push("--version".into());
                    return Ok(out);
                }
                n if UNSUPPORTED_LONG.contains(&n) => {
                    bail!("mkfs.erofs: option --{n} is not implemented by ferofs")
                }
                n => bail!("mkfs.erofs: unknown option --{n}"),
            }
            continue;
        }
        if let Some(short) = a.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let Some(opt) = chars.next() else {
                continue;
            };
            let attached: String = chars.collect();
            let mut value = || -> Result<String> {
                if !attached.is_empty() {
                    return Ok(attached.clone());
                }
                match args.get(i).and_then(|v| v.to_str()) {
                    Some(v) => {
                        i += 1;
                        Ok(v.to_string())
                    }
                    None => bail!("mkfs.erofs: option -{opt} needs a value"),
                }
            };
            match opt {
                'z' => {
                    compress = true;
                    out.push("-z".into());
                    out.push(value()?.into());
                }
                'C' | 'E' | 'b' | 'L' | 'U' | 'T' => {
                    out.push(format!("-{opt}").into());
                    out.push(value()?.into());
                }
                'm' => {
                    let v = value()?;
                    if v.contains(':') {
                        bail!("mkfs.erofs: -m{v}: another algorithm for metadata is not implemented by ferofs");
                    }
                    out.push(format!("--metabox={v}").into());
                }
                'd' => {
                    if value()?.trim() == "0" {
                        out.push("--quiet".into());
                    }
                }
                'x' => {
                    let v = value()?;
                    match v.trim().parse::<i64>() {
                        Ok(n) if n >= 0 => {}
                        _ => bail!(
                            "mkfs.erofs: -x{v}: disabling xattrs is not implemented by ferofs"
                        ),
                    }
                }
                'h' => {
                    out.push("--help".into());
                    return Ok(out);
                }
                'V' => {
                    out.push("--version".into());
                    return Ok(out);
                }
                c => bail!("mkfs.erofs: unknown option -{c}"),
            }
            continue;
        }
        pos.push(raw.clone());
    }
    if !compress {
        // mkfs.erofs's default is an uncompressed image.
        out.push("-z".into());
        out.push("none".into());
    }
    if sort_none {
        out.push("--sort".into());
        out.push("none".into());
    }
    let Some(image) = pos.first().cloned() else {
        bail!("mkfs.erofs: missing IMAGE (usage: mkfs.erofs [OPTIONS] IMAGE SOURCE)");
    };
    let sources = &pos[1..];
    match tar {
        Some(mode) => {
            if mode == 'i' {
                out.push("--tar-index".into());
            }
            if sources.len() > 1 {
                bail!("mkfs.erofs: one tar SOURCE at most (stdin without one)");
            }
            out.push("--tar".into());
            out.push(sources.first().cloned().unwrap_or_else(|| "-".into()));
            out.push(image);
        }
        None => {
            let [src] = sources else {
                bail!("mkfs.erofs: expected IMAGE SOURCE (one source directory)");
            };
            out.push(src.clone());
            out.push(image);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Vec<String>> {
        let a: Vec<OsString> = args.iter().map(OsString::from).collect();
        Ok(mkfs_to_build(&a)?
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect())
    }

    #[test]
    fn containerd_command_line() {
        assert_eq!(
            t(&[
                "--tar=f",
                "--aufs",
                "--quiet",
                "-Enoinline_data",
                "--sort=none",
                "-U",
                "c0ffee00-0000-4000-8000-000000000001",
                "-zlz4hc",
                "layer.erofs"
            ])
            .expect("translate"),
            [
                "--aufs",
                "--quiet",
                "-E",
                "noinline_data",
                "-U",
                "c0ffee00-0000-4000-8000-000000000001",
                "-z",
                "lz4hc",
                "--sort",
                "none",
                "--tar",
                "-",
                "layer.erofs"
            ]
        );
    }

    #[test]
    fn directory_build_and_defaults() {
        assert_eq!(
            t(&[
                "-zlz4hc,level=12",
                "-C",
                "65536",
                "-T0",
                "--workers=2",
                "out.img",
                "src"
            ])
            .expect("translate"),
            [
                "-z",
                "lz4hc,level=12",
                "-C",
                "65536",
                "-T",
                "0",
                "-j",
                "2",
                "src",
                "out.img"
            ]
        );
        // No -z: uncompressed, as mkfs.erofs.
        assert_eq!(
            t(&["out.img", "src"]).expect("translate"),
            ["-z", "none", "src", "out.img"]
        );
        assert_eq!(
            t(&["--tar=i", "-b4096", "meta.erofs", "layer.tar"]).expect("translate"),
            [
                "-b",
                "4096",
                "-z",
                "none",
                "--tar-index",
                "--tar",
                "layer.tar",
                "meta.erofs"
            ]
        );
    }

    #[test]
    fn unimplemented_options_are_named() {
        for (args, what) in [
            (&["--file-contexts=x", "o", "s"][..], "--file-contexts"),
            (&["--chunksize", "4096", "o", "s"][..], "--chunksize"),
            (&["-x-1", "o", "s"][..], "-x-1"),
            (&["--tar=headerball", "o"][..], "--tar=headerball"),
            (&["--bogus", "o", "s"][..], "--bogus"),
            (&["-Q", "o", "s"][..], "-Q"),
        ] {
            let e = t(args).expect_err("must fail").to_string();
            assert!(e.contains(what), "{args:?}: {e}");
        }
        assert!(t(&["o"]).is_err());
        assert!(t(&["o", "a", "b"]).is_err());
    }
}

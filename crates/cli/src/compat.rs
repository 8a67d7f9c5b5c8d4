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
const UNSUPPORTED_LONG: [&str; 3] = ["gzinfo", "random-pclusterblks", "random-algorithms"];

/// Long options whose value may be the next argument.
const LONG_WITH_VALUE: [&str; 25] = [
    "root-xattr-isize",
    "zfeature-bits",
    "max-extent-bytes",
    "file-contexts",
    "mount-point",
    "async-queue-limit",
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
    "offset",
    "fsalignblks",
    "dsunit",
    "blobdev",
    "xattr-prefix",
    "fs-config-file",
    "product-out",
    "vmdk-desc",
    "s3",
];

/// mkfs.erofs 1.9.3's compression features in the order of `--zfeature-bits`.
const ZFEATURES: [&str; 8] = [
    "legacy-compress",
    "ztailpacking",
    "fragments",
    "all-fragments",
    "dedupe",
    "fragdedupe",
    "48bit",
    "dot-omitted",
];

/// `--zfeature-bits=N` as an `-E` list: every feature up to N's highest bit set, on
/// where its bit is 1 and off (`^`) where it is 0, as mkfs.erofs applies them. N as
/// C's `strtol` base 0 reads it (`0x` hexadecimal, a leading `0` octal).
fn zfeature_bits(v: &str) -> Result<String> {
    let t = v.trim();
    let n = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if t.len() > 1 && t.starts_with('0') {
        u64::from_str_radix(&t[1..], 8)
    } else {
        t.parse::<u64>()
    };
    let Ok(n) = n else {
        bail!("mkfs.erofs: invalid zfeature bits {v}");
    };
    let used = 64 - n.leading_zeros() as usize;
    if used > ZFEATURES.len() {
        bail!("mkfs.erofs: unsupported zfeature bit {}", used - 1);
    }
    let list: Vec<String> = ZFEATURES[..used]
        .iter()
        .enumerate()
        .map(|(k, f)| {
            if n >> k & 1 == 1 {
                (*f).to_string()
            } else {
                format!("^{f}")
            }
        })
        .collect();
    Ok(list.join(","))
}

/// The `ferofs build` arguments (after `build`) for mkfs.erofs's `args` (after the
/// program name).
pub fn mkfs_to_build(args: &[OsString]) -> Result<Vec<OsString>> {
    let mut out: Vec<OsString> = Vec::new();
    let mut pos: Vec<OsString> = Vec::new();
    let mut tar: Option<char> = None;
    let mut clean_data = false;
    let mut incremental = false;
    // `--clean=rvsp` / `--incremental=rvsp`: reserve space for file data.
    let mut rvsp = false;
    // `--clean=0` / `--incremental=0`: zero-filled file data (no source ferofs
    // reads takes it: mkfs.erofs ignores it for directories and tars).
    let mut zero_fill = false;
    // `--tar=MODE,MAPFILE`.
    let mut tar_map: Option<String> = None;
    // `-b` given.
    let mut sized = false;
    let mut oci: Option<Vec<OsString>> = None;
    let mut s3: Option<Vec<OsString>> = None;
    let mut compress = false;
    let mut sort_none = false;
    let mut pcluster: Option<String> = None;
    let mut extended: Vec<String> = Vec::new();
    let mut metabox: Option<String> = None;
    let mut mkfs_time = false;
    let mut chunksize: Option<String> = None;
    let mut mount_point: Option<String> = None;
    let mut product_out: Option<String> = None;
    let mut zd = false;
    let mut max_extent: Option<String> = None;
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
                "hard-dereference" => out.push("--hard-dereference".into()),
                // A tuning knob of mkfs.erofs's job queue: ferofs bounds its own.
                "async-queue-limit" => {
                    value()?;
                }
                // A separate metadata zone (inodes and directory blocks together):
                // ferofs always lays every inode and directory block out in one
                // region behind the data; it has no other layout to turn off.
                "MZ" if matches!(
                    inline.as_deref(),
                    None | Some("0" | "i" | "d" | "id" | "di")
                ) => {}
                "MZ" => bail!(
                    "mkfs.erofs: --MZ={}: the flags are 0, i and d",
                    inline.as_deref().unwrap_or("")
                ),
                // Compressed directories: ferofs stores directories uncompressed (on
                // a Debian rootfs mkfs.erofs 1.9.3 saves 0.06 % with them). A
                // warning, not an error: build scripts that pass it keep working. (In
                // mkfs.erofs 1.9.3 `--zD=1` turns it off and any other value on.)
                "zD" => zd = inline.as_deref() != Some("1"),
                // `--clean`: a full build, all ferofs does (mkfs.erofs's default);
                // image sources have their data copied, not referred to.
                // `--incremental`: on top of the image IMAGE already holds, a new image
                // of the stack (`--base IMAGE`), written over it.
                // Either with `rvsp`: space reserved for the file data, which is not
                // stored (`--reserve-data`); with `0`: zero-filled data.
                "clean" | "incremental" => {
                    match inline.as_deref() {
                        None | Some("data") => {}
                        Some("rvsp") => rvsp = true,
                        Some("0") => zero_fill = true,
                        Some(v) => bail!("mkfs.erofs: --{name}={v}: expected data, rvsp or 0"),
                    }
                    if name == "clean" {
                        clean_data = true;
                    } else {
                        incremental = true;
                    }
                }
                "aufs" => out.push("--aufs".into()),
                "ignore-mtime" => out.push("--ignore-mtime".into()),
                // ferofs keeps each file's mtime by default, and -T sets all of them
                // (mkfs.erofs's --all-time, its default).
                "preserve-mtime" => {}
                // Whether -T sets the build time only or every mtime too: the later
                // of the two wins, as in mkfs.erofs.
                "all-time" => mkfs_time = false,
                "mkfs-time" => mkfs_time = true,
                // Compressed tar streams are detected by their magic (`--gzip` and
                // `--unlzma` are mkfs.erofs's other names of the two).
                "ungzip" | "unxz" | "gzip" | "unlzma" if inline.is_none() => {}
                "ungzip" | "unxz" | "unlzma" => {
                    bail!("mkfs.erofs: --{name}=FILE (dumping the raw stream) is not implemented by ferofs")
                }
                "force-uid" | "force-gid" | "uid-offset" | "gid-offset" | "exclude-path"
                | "exclude-regex" | "compress-hints" | "offset" | "fsalignblks" | "dsunit"
                | "blobdev" | "file-contexts" | "root-xattr-isize" | "xattr-prefix"
                | "fs-config-file" | "vmdk-desc" => {
                    let v = value()?;
                    out.push(format!("--{name}").into());
                    out.push(v.into());
                }
                // Kept until the end: it applies to uncompressed images only.
                "chunksize" => chunksize = Some(value()?),
                // Only the file contexts' and the fs_config's paths use it.
                "mount-point" => mount_point = Some(value()?),
                // Where Android's build put the partitions: only libcutils's built-in
                // fs_config table reads it, never a canned file (--fs-config-file).
                "product-out" => product_out = Some(value()?),
                // Kept until the end: without -z, mkfs.erofs ignores it.
                "max-extent-bytes" => max_extent = Some(value()?),
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
                    let (v, map) = v.split_once(',').unwrap_or((&v, ""));
                    tar_map = (!map.is_empty()).then(|| map.into());
                    tar = Some(match v {
                        "f" => 'f',
                        "i" => 'i',
                        "headerball" => 'h',
                        _ => bail!(
                            "mkfs.erofs: --tar={v} is not implemented by ferofs (f, i and headerball are)"
                        ),
                    });
                }
                // An image from an OCI registry, SOURCE its reference: `--oci[=f|i]`
                // then `,platform=X`, `,layer=N`, `,blob=D`, `,username=U`,
                // `,password=P`, `,insecure` (mkfs.erofs 1.9.3's spelling; its
                // platform default is linux/amd64).
                "oci" => oci = Some(oci_options(inline.as_deref().unwrap_or(""))?),
                // The objects under BUCKET[/PREFIX] (SOURCE) of an S3-compatible store:
                // `--s3=ENDPOINT[,passwd_file=F][,urlstyle=vhost|path][,sig=2|4][,region=R]`.
                "s3" => s3 = Some(s3_options(&value()?)?),
                // An optional value, given with `=` only (getopt's optional argument).
                "xattr-inode-digest" => out.push(match &inline {
                    Some(v) => format!("--xattr-inode-digest={v}").into(),
                    None => "--xattr-inode-digest".into(),
                }),
                "ovlfs-strip" => {
                    let v = inline.clone().unwrap_or_else(|| "1".into());
                    out.push(format!("--ovlfs-strip={v}").into());
                }
                // Bit K of the number turns mkfs.erofs's K-th compression feature on
                // or off, up to the highest bit set.
                "zfeature-bits" => extended.push(zfeature_bits(&value()?)?),
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
                // Kept until the end: without -z, mkfs.erofs ignores them.
                'C' => pcluster = Some(value()?),
                'E' => extended.push(value()?),
                'b' | 'L' | 'U' | 'T' => {
                    sized |= opt == 'b';
                    out.push(format!("-{opt}").into());
                    out.push(value()?.into());
                }
                'm' => metabox = Some(value()?),
                'd' => {
                    if value()?.trim() == "0" {
                        out.push("--quiet".into());
                    }
                }
                'x' => {
                    let v = value()?;
                    // -x# >= 0 is mkfs.erofs's xattr sharing tolerance (ferofs shares
                    // an xattr more than two inodes carry); < 0 leaves xattrs out.
                    match v.trim().parse::<i64>() {
                        Ok(n) if n >= 0 => {}
                        Ok(_) => out.push("--no-xattrs".into()),
                        Err(_) => bail!("mkfs.erofs: -x{v}: not a number"),
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
    if zd && !out.iter().any(|a| a == "--quiet") {
        eprintln!(
            "mkfs.erofs: --zD ignored: ferofs stores directories uncompressed (mkfs.erofs 1.9.3 saves about 0.06 % with it on a Debian rootfs)"
        );
    }
    let fs_config = out.iter().any(|a| a == "--fs-config-file");
    if product_out.is_some() && !fs_config {
        bail!(
            "mkfs.erofs: --product-out without --fs-config-file (libcutils's built-in Android fs_config table) is not implemented by ferofs: give the canned fs_config"
        );
    }
    if let Some(m) = mount_point.filter(|_| fs_config || out.iter().any(|a| a == "--file-contexts"))
    {
        out.push("--mount-point".into());
        out.push(m.into());
    }
    if let Some(cs) = chunksize {
        if compress {
            // mkfs.erofs cuts the files it stores uncompressed into chunks; ferofs
            // shares their data with -E dedupe instead.
            if !out.iter().any(|a| a == "--quiet") {
                eprintln!(
                    "mkfs.erofs: --chunksize={cs} ignored: ferofs cuts files into chunks in \
                     uncompressed images only (-E dedupe shares identical data here)"
                );
            }
        } else {
            out.push("--chunksize".into());
            out.push(cs.into());
        }
    }
    if compress {
        if let Some(c) = pcluster {
            out.push("-C".into());
            out.push(c.into());
        }
        if let Some(m) = max_extent {
            out.push("--max-extent-bytes".into());
            out.push(m.into());
        }
        if let Some(m) = metabox {
            out.push(format!("--metabox={m}").into());
        }
    } else {
        // mkfs.erofs's default is an uncompressed image, where it ignores -C and the
        // compression-only -E features without a word; so does this (with a warning).
        out.push("-z".into());
        out.push("none".into());
        let mut ignored: Vec<String> = pcluster.iter().map(|c| format!("-C{c}")).collect();
        ignored.extend(max_extent.iter().map(|m| format!("--max-extent-bytes={m}")));
        // An uncompressed metabox has no pcluster size.
        if let Some(m) = metabox {
            if m.contains(':') {
                bail!(
                    "mkfs.erofs: -m{m} without -z: ferofs compresses a metabox with another \
                     algorithm only in a compressed image (add -z)"
                );
            }
            if m.trim() != "0" {
                ignored.push(format!("the pcluster size of -m{m}"));
            }
            out.push("--metabox=0".into());
        }
        for e in &mut extended {
            let (keep, drop): (Vec<&str>, Vec<&str>) = e.split(',').partition(|f| {
                let name = f.split('=').next().unwrap_or("");
                !matches!(
                    name,
                    "ztailpacking" | "fragments" | "all-fragments" | "legacy-compress"
                )
            });
            ignored.extend(drop.iter().map(|f| format!("-E{f}")));
            *e = keep.join(",");
        }
        extended.retain(|e| !e.is_empty());
        if !ignored.is_empty() && !out.iter().any(|a| a == "--quiet") {
            eprintln!(
                "mkfs.erofs: {} ignored: the image is not compressed (no -z)",
                ignored.join(" ")
            );
        }
    }
    for e in extended {
        // Accepted and left to ferofs: it always writes the xattr name filter and
        // dedupes fragments as -E dedupe says (mkfs.erofs's fragdedupe modes only trade
        // its build time for size).
        let kept: Vec<&str> = e
            .split(',')
            .filter(|f| {
                let name = f.trim_start_matches('^').split('=').next().unwrap_or("");
                !matches!(name, "fragdedupe" | "xattr-name-filter")
            })
            .collect();
        if kept.iter().any(|f| !f.is_empty()) {
            out.push("-E".into());
            out.push(kept.join(",").into());
        }
    }
    // Without -T files keep their mtimes whatever --mkfs-time says.
    if mkfs_time && out.iter().any(|a| a == "-T") {
        out.push("--mkfs-time".into());
    }
    if sort_none {
        out.push("--sort".into());
        out.push("none".into());
    }
    let Some(image) = pos.first().cloned() else {
        bail!("mkfs.erofs: missing IMAGE (usage: mkfs.erofs [OPTIONS] IMAGE SOURCE)");
    };
    let sources = &pos[1..];
    if incremental {
        out.push("--base".into());
        out.push(image.clone());
    }
    for (name, opts, what) in [
        ("--oci", oci, "the image reference"),
        ("--s3", s3, "BUCKET[/PREFIX]"),
    ] {
        let Some(o) = opts else { continue };
        if tar.is_some() {
            bail!("mkfs.erofs: {name} and --tar cannot be given together");
        }
        let [src] = sources else {
            bail!("mkfs.erofs: {name}: expected IMAGE SOURCE (SOURCE: {what})");
        };
        out.push(name.into());
        out.push(src.clone());
        out.extend(o);
        out.push(image);
        return Ok(out);
    }
    match tar {
        Some(mode) => {
            // mkfs.erofs's rvsp wins over index mode; a headerball has no data. Index
            // mode with a map file reserves too: mkfs.erofs's files are chunk-based
            // there, pointing at blocks of the image left as holes, where ferofs's are
            // flat (the same map, the same blocks to fill).
            let reserve = (rvsp || mode == 'i' && tar_map.is_some()) && mode != 'h';
            if mode == 'i' && !reserve {
                out.push("--tar-index".into());
            }
            if mode == 'h' {
                out.push("--tar-headerball".into());
            }
            if reserve {
                out.push("--reserve-data".into());
                // Index mode without a map file: mkfs.erofs's 512-byte blocks.
                if mode == 'i' && tar_map.is_none() && !sized {
                    out.extend(["-b".into(), "512".into()]);
                }
            }
            if let Some(m) = tar_map {
                // Lists the reserved files (none without rvsp: an empty file, as
                // mkfs.erofs's).
                out.extend(["--block-map".into(), m.into()]);
            }
            if sources.len() > 1 {
                bail!("mkfs.erofs: one tar SOURCE at most (stdin without one)");
            }
            out.push("--tar".into());
            out.push(sources.first().cloned().unwrap_or_else(|| "-".into()));
            out.push(image);
        }
        // EROFS images as sources (mkfs.erofs's rebuild mode): merged, the later ones
        // on top; referred to in place (the images become extra devices) unless
        // `--clean[=data]` asks their data copied.
        None if !incremental && sources.len() > 1
            || sources
                .first()
                .is_some_and(|s| crate::source::is_erofs_file(std::path::Path::new(s))) =>
        {
            // --aufs changes tar input only: mkfs.erofs takes it here and does nothing
            // with it (containerd's layer merge passes it).
            out.retain(|a| a != "--aufs");
            if zero_fill {
                bail!("mkfs.erofs: --clean=0 / --incremental=0 with image sources: zero-filled data is for S3 sources (mkfs.erofs 1.9.3 refuses it here too)");
            }
            if rvsp {
                out.push("--reserve-data".into());
            } else if !clean_data {
                out.push("--by-reference".into());
            }
            out.extend(sources.iter().cloned());
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

/// `ferofs build` options for mkfs.erofs's `--s3=` value: the endpoint, then
/// `passwd_file=`, `urlstyle=vhost|path` (mkfs.erofs's default vhost), `sig=2|4`
/// (ferofs signs every request with AWS's version 4, which every S3-compatible store
/// takes: both accepted), `region=`.
fn s3_options(v: &str) -> Result<Vec<OsString>> {
    let mut parts = v.split(',');
    let endpoint = parts.next().unwrap_or("");
    if endpoint.is_empty() {
        bail!("mkfs.erofs: --s3 needs an endpoint (--s3=ENDPOINT[,...])");
    }
    let mut out: Vec<OsString> = vec!["--s3-endpoint".into(), endpoint.into()];
    let mut vhost = true;
    for o in parts {
        match o.split_once('=') {
            Some(("passwd_file", f)) => out.extend(["--s3-passwd-file".into(), f.into()]),
            Some(("urlstyle", "vhost")) => vhost = true,
            Some(("urlstyle", "path")) => vhost = false,
            Some(("sig", "2" | "4")) => {}
            Some(("region", r)) => out.extend(["--s3-region".into(), r.into()]),
            _ => bail!("mkfs.erofs: --s3: option {o:?} is not implemented by ferofs"),
        }
    }
    if vhost {
        out.push("--s3-virtual-hosted".into());
    }
    Ok(out)
}

/// `ferofs build` options for mkfs.erofs's `--oci=` value.
fn oci_options(v: &str) -> Result<Vec<OsString>> {
    let mut out: Vec<OsString> = Vec::new();
    let mut platform = "linux/amd64".to_string();
    for (i, o) in v.split(',').enumerate() {
        let (k, val) = match o.split_once('=') {
            Some((k, val)) => (k, Some(val)),
            None => (o, None),
        };
        match (k, val) {
            ("f", None) if i == 0 => {}
            ("i", None) if i == 0 => bail!(
                "mkfs.erofs: --oci=i (an index of the layers' tars) is not implemented by ferofs (--oci=f is)"
            ),
            ("", None) => {}
            ("platform", Some(p)) => platform = p.to_string(),
            ("layer", Some(n)) => out.extend(["--oci-layer".into(), n.into()]),
            ("blob", Some(d)) => out.extend(["--oci-blob".into(), d.into()]),
            ("username", Some(u)) => out.extend(["--oci-username".into(), u.into()]),
            ("password", Some(p)) => out.extend(["--oci-password".into(), p.into()]),
            ("insecure", None) => out.push("--oci-insecure".into()),
            _ => bail!("mkfs.erofs: --oci: option {o:?} is not implemented by ferofs"),
        }
    }
    out.extend(["--oci-platform".into(), platform.into()]);
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
    fn s3_command_lines() {
        assert_eq!(
            t(&["--s3", "s3.amazonaws.com", "a.erofs", "bucket/pre"]).expect("--s3"),
            [
                "-z",
                "none",
                "--s3",
                "bucket/pre",
                "--s3-endpoint",
                "s3.amazonaws.com",
                "--s3-virtual-hosted",
                "a.erofs"
            ]
        );
        assert_eq!(
            t(&[
                "-zlz4",
                "--s3=http://h:9000,passwd_file=/p,urlstyle=path,sig=4,region=eu-west-1",
                "a.erofs",
                "b"
            ])
            .expect("--s3=..."),
            [
                "-z",
                "lz4",
                "--s3",
                "b",
                "--s3-endpoint",
                "http://h:9000",
                "--s3-passwd-file",
                "/p",
                "--s3-region",
                "eu-west-1",
                "a.erofs"
            ]
        );
        for (bad, name) in [
            (&["--s3=h,sig=3", "a", "b"][..], "sig=3"),
            (&["--s3=", "a", "b"][..], "endpoint"),
            (&["--s3=h", "a"][..], "BUCKET"),
        ] {
            let e = t(bad).expect_err("must fail").to_string();
            assert!(e.contains(name), "{bad:?}: {e}");
        }
    }

    #[test]
    fn oci_command_lines() {
        assert_eq!(
            t(&["-zlz4hc", "--oci", "app.erofs", "debian:stable"]).expect("--oci"),
            [
                "-z",
                "lz4hc",
                "--oci",
                "debian:stable",
                "--oci-platform",
                "linux/amd64",
                "app.erofs"
            ]
        );
        assert_eq!(
            t(&[
                "--oci=f,platform=linux/arm64,layer=2,username=u,password=p,insecure",
                "a.erofs",
                "localhost:5000/x:1"
            ])
            .expect("--oci=f,..."),
            [
                "-z",
                "none",
                "--oci",
                "localhost:5000/x:1",
                "--oci-layer",
                "2",
                "--oci-username",
                "u",
                "--oci-password",
                "p",
                "--oci-insecure",
                "--oci-platform",
                "linux/arm64",
                "a.erofs"
            ]
        );
        for (bad, name) in [
            (&["--oci=i", "a", "r"][..], "--oci=i"),
            (&["--oci=f,bogus", "a", "r"][..], "bogus"),
            (&["--oci", "a"][..], "SOURCE"),
            (&["--oci", "--tar=f", "a", "r"][..], "--tar"),
        ] {
            let e = t(bad).expect_err("must fail").to_string();
            assert!(e.contains(name), "{bad:?}: {e}");
        }
    }

    #[test]
    fn erofsfuse_command_lines() {
        let t = |args: &[&str]| -> Result<Vec<String>> {
            let a: Vec<OsString> = args.iter().map(OsString::from).collect();
            Ok(erofsfuse_to_ferofs(&a)?
                .into_iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect())
        };
        assert_eq!(t(&["img", "mnt"]).expect("plain"), ["mount", "img", "mnt"]);
        assert_eq!(
            t(&[
                "--offset=4096",
                "--device=blob",
                "--dbglevel=7",
                "-fs",
                "-o",
                "allow_other,max_threads=4,fsname=x",
                "-onodev,debug,rw,noatime,noexec",
                "img",
                "mnt"
            ])
            .expect("options"),
            [
                "mount",
                "--offset",
                "4096",
                "--device",
                "blob",
                "-f",
                "-v",
                "-o",
                "allow_other,threads=4,noexec,threads=1",
                "img",
                "mnt"
            ]
        );
        assert_eq!(t(&["-V"]).expect("-V"), ["--version"]);
        assert_eq!(t(&["--help"]).expect("--help"), ["mount", "--help"]);
        for (bad, name) in [
            (&["-o", "allow_root", "i", "m"][..], "allow_root"),
            (&["-o"][..], "-o needs"),
            (&["-x", "i", "m"][..], "-x"),
            (&["--aux", "i", "m"][..], "--aux"),
            (&["i"][..], "IMAGE MOUNTPOINT"),
            (&["i", "m", "n"][..], "IMAGE MOUNTPOINT"),
        ] {
            let e = t(bad).expect_err("must fail").to_string();
            assert!(e.contains(name), "{bad:?}: {e}");
        }
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
                "-U",
                "c0ffee00-0000-4000-8000-000000000001",
                "-z",
                "lz4hc",
                "-E",
                "noinline_data",
                "--sort",
                "none",
                "--tar",
                "-",
                "layer.erofs"
            ]
        );
    }

    #[test]
    fn compression_options_without_z_are_ignored_as_mkfs_erofs_does() {
        // mkfs.erofs 1.9.3 builds an uncompressed image from this command line, with
        // neither an error nor a warning: -C and the compression-only features are
        // dropped, dedupe and the rest stay.
        assert_eq!(
            t(&[
                "-C65536",
                "-Eztailpacking,dedupe,fragments=131072",
                "-Eall-fragments",
                "-E^ztailpacking,48bit",
                "out.img",
                "src"
            ])
            .expect("translate"),
            [
                "-z",
                "none",
                "-E",
                "dedupe",
                "-E",
                "^ztailpacking,48bit",
                "src",
                "out.img"
            ]
        );
        // An uncompressed metabox (mkfs.erofs builds one from -m65536 without -z).
        assert_eq!(
            t(&["-m65536", "out.img", "src"]).expect("translate"),
            ["-z", "none", "--metabox=0", "src", "out.img"]
        );
        // With -z they all stay, in their order.
        assert_eq!(
            t(&[
                "-C65536",
                "-Eztailpacking",
                "-zlz4",
                "-Efragments",
                "out.img",
                "src"
            ])
            .expect("translate"),
            [
                "-z",
                "lz4",
                "-C",
                "65536",
                "-E",
                "ztailpacking",
                "-E",
                "fragments",
                "src",
                "out.img"
            ]
        );
    }

    #[test]
    fn fragdedupe_and_xattr_name_filter_are_accepted_and_left_to_ferofs() {
        assert_eq!(
            t(&[
                "-zlz4hc",
                "-Eall-fragments,fragdedupe=inode",
                "-E^fragdedupe",
                "-Exattr-name-filter,dedupe",
                "-E^xattr-name-filter",
                "out.img",
                "src"
            ])
            .expect("translate"),
            [
                "-z",
                "lz4hc",
                "-E",
                "all-fragments",
                "-E",
                "dedupe",
                "src",
                "out.img"
            ]
        );
    }

    #[test]
    fn negative_xattr_tolerance_leaves_xattrs_out() {
        assert_eq!(
            t(&["-x-1", "o", "s"]).expect("translate"),
            ["--no-xattrs", "-z", "none", "s", "o"]
        );
        assert_eq!(
            t(&["-x", "2", "o", "s"]).expect("translate"),
            ["-z", "none", "s", "o"]
        );
        assert!(t(&["-xq", "o", "s"]).is_err());
    }

    #[test]
    fn queue_limit_and_full_clean_builds_are_accepted() {
        for args in [
            &["--async-queue-limit=8", "o", "s"][..],
            &["--async-queue-limit", "8", "o", "s"],
            &["--clean", "o", "s"],
            &["--clean=data", "o", "s"],
            // A directory source ignores rvsp and 0, as mkfs.erofs's does.
            &["--clean=rvsp", "o", "s"],
            &["--clean=0", "o", "s"],
        ] {
            assert_eq!(
                t(args).expect("translate"),
                ["-z", "none", "s", "o"],
                "{args:?}"
            );
        }
        for v in ["--clean=x", "--clean=1", "--incremental=rvspx"] {
            let e = t(&[v, "o", "s"]).expect_err("refused").to_string();
            assert!(e.contains("expected data, rvsp or 0"), "{v}: {e}");
        }
    }

    #[test]
    fn rvsp_reserves_the_data_of_tars_and_images() {
        assert_eq!(
            t(&["--tar=f,m.map", "--clean=rvsp", "o", "l.tar"]).expect("translate"),
            [
                "-z",
                "none",
                "--reserve-data",
                "--block-map",
                "m.map",
                "--tar",
                "l.tar",
                "o"
            ]
        );
        // rvsp wins over index mode (its 512-byte blocks kept without a map file),
        assert_eq!(
            t(&["--tar=i", "--clean=rvsp", "o", "l.tar"]).expect("translate"),
            [
                "-z",
                "none",
                "--reserve-data",
                "-b",
                "512",
                "--tar",
                "l.tar",
                "o"
            ]
        );
        assert_eq!(
            t(&["-b4096", "--tar=i", "--clean=rvsp", "o", "l.tar"]).expect("translate"),
            [
                "-b",
                "4096",
                "-z",
                "none",
                "--reserve-data",
                "--tar",
                "l.tar",
                "o"
            ]
        );
        // a headerball has no data to reserve; without rvsp the map is empty;
        assert_eq!(
            t(&["--tar=headerball,m", "--clean=rvsp", "o", "l.tar"]).expect("translate"),
            [
                "-z",
                "none",
                "--tar-headerball",
                "--block-map",
                "m",
                "--tar",
                "l.tar",
                "o"
            ]
        );
        assert_eq!(
            t(&["--tar=f,m", "o", "l.tar"]).expect("translate"),
            ["-z", "none", "--block-map", "m", "--tar", "l.tar", "o"]
        );
        assert_eq!(
            t(&["--tar=f", "--incremental=rvsp", "-zlz4", "o", "l.tar"]).expect("translate"),
            [
                "-z",
                "lz4",
                "--base",
                "o",
                "--reserve-data",
                "--tar",
                "l.tar",
                "o"
            ]
        );
        // image sources: copied with rvsp, never referred to.
        assert_eq!(
            t(&["--clean=rvsp", "o", "a.erofs", "b.erofs"]).expect("translate"),
            ["-z", "none", "--reserve-data", "a.erofs", "b.erofs", "o"]
        );
        // index mode with a map file: blocks of the image mapped from the tar.
        assert_eq!(
            t(&["--tar=i,m", "o", "l.tar"]).expect("translate"),
            [
                "-z",
                "none",
                "--reserve-data",
                "--block-map",
                "m",
                "--tar",
                "l.tar",
                "o"
            ]
        );
        assert!(t(&["--clean=0", "o", "a.erofs", "b.erofs"]).is_err());
        // --tar=0 (zero-filled tar data) is not taken.
        assert!(t(&["--tar=0", "o", "l.tar"]).is_err());
    }

    #[test]
    fn incremental_builds_go_onto_the_image_as_base() {
        assert_eq!(
            t(&["--incremental=data", "o", "s"]).expect("translate"),
            ["-z", "none", "--base", "o", "s", "o"]
        );
        assert_eq!(
            t(&["--tar=f", "--incremental", "o", "l.tar"]).expect("translate"),
            ["-z", "none", "--base", "o", "--tar", "l.tar", "o"]
        );
        // A directory layer ignores rvsp and 0 (mkfs.erofs's).
        for v in ["rvsp", "0"] {
            assert_eq!(
                t(&[&format!("--incremental={v}"), "o", "s"]).expect("translate"),
                ["-z", "none", "--base", "o", "s", "o"]
            );
        }
    }

    #[test]
    fn image_sources_merge_by_reference_unless_clean_data() {
        assert_eq!(
            t(&["o", "a.erofs", "b.erofs"]).expect("translate"),
            ["-z", "none", "--by-reference", "a.erofs", "b.erofs", "o"]
        );
        // containerd's layer merge; --aufs means nothing for image sources.
        assert_eq!(
            t(&["--aufs", "--ovlfs-strip=1", "--quiet", "o", "a", "b", "c"]).expect("translate"),
            [
                "--ovlfs-strip=1",
                "--quiet",
                "-z",
                "none",
                "--by-reference",
                "a",
                "b",
                "c",
                "o"
            ]
        );
        for clean in ["--clean", "--clean=data"] {
            assert_eq!(
                t(&[clean, "o", "a", "b"]).expect("translate"),
                ["-z", "none", "a", "b", "o"]
            );
        }
        // One source: an image file is merged (by reference), a directory built.
        let d = tempfile::tempdir().expect("tmp");
        let img = d.path().join("one.erofs");
        let mut b = vec![0u8; 4096];
        b[1024..1028].copy_from_slice(&ferofs_format::sb::MAGIC.to_le_bytes());
        std::fs::write(&img, b).expect("write");
        let i = img.to_str().expect("utf-8");
        assert_eq!(
            t(&["o", i]).expect("translate"),
            ["-z", "none", "--by-reference", i, "o"]
        );
        let dir = d.path().to_str().expect("utf-8");
        assert_eq!(t(&["o", dir]).expect("translate"), ["-z", "none", dir, "o"]);
    }

    #[test]
    fn mkfs_time_goes_with_t_and_the_later_time_option_wins() {
        let has = |args: &[&str]| {
            t(args)
                .expect("translate")
                .iter()
                .any(|a| a == "--mkfs-time")
        };
        assert!(has(&["-T0", "--mkfs-time", "o", "s"]));
        assert!(has(&["--all-time", "--mkfs-time", "-T", "5", "o", "s"]));
        assert!(!has(&["--mkfs-time", "-T0", "--all-time", "o", "s"]));
        assert!(!has(&["--mkfs-time", "o", "s"]));
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
                "-T",
                "0",
                "-j",
                "2",
                "-C",
                "65536",
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
    fn chunksize_and_inode_options_pass_through() {
        assert_eq!(
            t(&[
                "--chunksize=8192",
                "-Eforce-chunk-indexes,force-inode-extended",
                "-E",
                "nosbcrc",
                "o",
                "s"
            ])
            .expect("translate"),
            [
                "--chunksize",
                "8192",
                "-z",
                "none",
                "-E",
                "force-chunk-indexes,force-inode-extended",
                "-E",
                "nosbcrc",
                "s",
                "o"
            ]
        );
        assert_eq!(
            t(&["--fsalignblks=256", "--offset", "4096", "o", "s"]).expect("translate"),
            [
                "--fsalignblks",
                "256",
                "--offset",
                "4096",
                "-z",
                "none",
                "s",
                "o"
            ]
        );
        // With -z it is left out (with a warning).
        assert_eq!(
            t(&["--chunksize", "8192", "-zlz4", "o", "s"]).expect("translate"),
            ["-z", "lz4", "s", "o"]
        );
    }

    #[test]
    fn metadata_zone_is_what_ferofs_always_does() {
        for mz in ["--MZ", "--MZ=id", "--MZ=0", "--MZ=d"] {
            assert_eq!(
                t(&["-zlz4", mz, "o", "s"]).expect("translate"),
                ["-z", "lz4", "s", "o"],
                "{mz}"
            );
        }
        assert!(t(&["--MZ=x", "o", "s"]).is_err());
    }

    #[test]
    fn zfeature_bits_are_e_features() {
        assert_eq!(
            t(&["-zlz4hc", "--zfeature-bits=6", "o", "s"]).expect("translate"),
            [
                "-z",
                "lz4hc",
                "-E",
                "^legacy-compress,ztailpacking,fragments",
                "s",
                "o"
            ]
        );
        // fragdedupe is left to ferofs; octal and hexadecimal as strtol reads them;
        // a later -E wins as in mkfs.erofs.
        assert_eq!(
            t(&["-zlz4", "--zfeature-bits", "0x30", "-E^dedupe", "o", "s"]).expect("translate"),
            [
                "-z",
                "lz4",
                "-E",
                "^legacy-compress,^ztailpacking,^fragments,^all-fragments,dedupe",
                "-E",
                "^dedupe",
                "s",
                "o"
            ]
        );
        assert_eq!(
            t(&["-zlz4", "--zfeature-bits=0200", "o", "s"]).expect("translate")[3],
            "^legacy-compress,^ztailpacking,^fragments,^all-fragments,^dedupe,^48bit,dot-omitted"
        );
        assert_eq!(
            t(&["-zlz4", "--zfeature-bits=0", "o", "s"]).expect("translate"),
            ["-z", "lz4", "s", "o"]
        );
        for bad in [
            "--zfeature-bits=256",
            "--zfeature-bits=x",
            "--zfeature-bits=-1",
        ] {
            assert!(t(&["-zlz4", bad, "o", "s"]).is_err(), "{bad}");
        }
        // mkfs.erofs's other names of --ungzip and --unxz.
        for o in ["--gzip", "--unlzma"] {
            assert_eq!(
                t(&[o, "--tar=f", "o", "s.tar"]).expect("translate"),
                ["-z", "none", "--tar", "s.tar", "o"]
            );
        }
        assert!(t(&["--unlzma=raw.tar", "o", "s"]).is_err());
    }

    #[test]
    fn legacy_compress_passes_with_z_and_is_dropped_without() {
        assert_eq!(
            t(&["-zlz4hc", "-Elegacy-compress,ztailpacking", "o", "s"]).expect("translate"),
            [
                "-z",
                "lz4hc",
                "-E",
                "legacy-compress,ztailpacking",
                "s",
                "o"
            ]
        );
        assert_eq!(
            t(&["-Elegacy-compress,nosbcrc", "o", "s"]).expect("translate"),
            ["-z", "none", "-E", "nosbcrc", "s", "o"]
        );
    }

    #[test]
    fn max_extent_bytes_passes_through_with_compression() {
        assert_eq!(
            t(&["-zlz4hc", "-C65536", "--max-extent-bytes=16384", "o", "s"]).expect("translate"),
            [
                "-z",
                "lz4hc",
                "-C",
                "65536",
                "--max-extent-bytes",
                "16384",
                "s",
                "o"
            ]
        );
        // Without -z mkfs.erofs ignores it, as -C.
        assert_eq!(
            t(&["--max-extent-bytes", "16384", "o", "s"]).expect("translate"),
            ["-z", "none", "s", "o"]
        );
    }

    #[test]
    fn metabox_algorithm_passes_through() {
        assert_eq!(
            t(&["-zlzma:lz4", "-m4096:lz4", "o", "s"]).expect("translate"),
            ["-z", "lzma:lz4", "--metabox=4096:lz4", "s", "o"]
        );
        let e = t(&["-m4096:1", "o", "s"]).expect_err("accepted");
        assert!(e.to_string().contains("without -z"), "{e}");
    }

    #[test]
    fn file_contexts_and_mount_point_pass_through() {
        assert_eq!(
            t(&["--mount-point=/system", "--file-contexts", "fc", "o", "s"]).expect("translate"),
            [
                "--file-contexts",
                "fc",
                "--mount-point",
                "/system",
                "-z",
                "none",
                "s",
                "o"
            ]
        );
        // Without file contexts the mount point changes nothing (outside Android).
        assert_eq!(
            t(&["--mount-point", "/system", "o", "s"]).expect("translate"),
            ["-z", "none", "s", "o"]
        );
    }

    #[test]
    fn xattr_prefixes_pass_through() {
        assert_eq!(
            t(&[
                "--xattr-prefix=trusted.overlay.",
                "--xattr-prefix",
                "user.x.",
                "-Eplain-xattr-prefixes",
                "--xattr-inode-digest",
                "o",
                "s"
            ])
            .expect("translate"),
            [
                "--xattr-prefix",
                "trusted.overlay.",
                "--xattr-prefix",
                "user.x.",
                "--xattr-inode-digest",
                "-z",
                "none",
                "-E",
                "plain-xattr-prefixes",
                "s",
                "o"
            ]
        );
    }

    #[test]
    fn xattr_inode_digest_takes_its_name_with_equals() {
        assert_eq!(
            t(&["--xattr-inode-digest=trusted.fp", "o", "s"]).expect("translate"),
            ["--xattr-inode-digest=trusted.fp", "-z", "none", "s", "o"]
        );
    }

    #[test]
    fn android_fs_config_passes_through() {
        assert_eq!(
            t(&[
                "-zlz4hc",
                "--mount-point=system",
                "--fs-config-file",
                "fsc",
                "--product-out=out",
                "o",
                "s"
            ])
            .expect("translate"),
            [
                "-z",
                "lz4hc",
                "--fs-config-file",
                "fsc",
                "--mount-point",
                "system",
                "s",
                "o"
            ]
        );
        // libcutils's built-in table (no canned file) is not there to be read.
        let e = t(&["--product-out=out", "o", "s"]).expect_err("accepted");
        assert!(e.to_string().contains("--product-out"), "{e}");
    }

    #[test]
    fn compressed_directories_are_ignored_with_a_warning() {
        for zd in ["--zD", "--zD=0", "--zD=1"] {
            assert_eq!(
                t(&["-zlz4", zd, "--quiet", "o", "s"]).expect("translate"),
                ["-z", "lz4", "--quiet", "s", "o"]
            );
        }
    }

    #[test]
    fn unimplemented_options_are_named() {
        for (args, what) in [
            (&["--gzinfo", "o", "s"][..], "--gzinfo"),
            (&["--tar=x", "o"][..], "--tar=x"),
            (&["--bogus", "o", "s"][..], "--bogus"),
            (&["-Q", "o", "s"][..], "-Q"),
        ] {
            let e = t(args).expect_err("must fail").to_string();
            assert!(e.contains(what), "{args:?}: {e}");
        }
        assert_eq!(
            t(&["--tar=headerball", "-zlz4", "o"]).expect("translate"),
            ["-z", "lz4", "--tar-headerball", "--tar", "-", "o"]
        );
        assert!(t(&["o"]).is_err());
        // Several sources are image sources (merged): `ferofs build` checks them.
        assert!(t(&["--tar=f", "o", "a", "b"]).is_err());
    }
}

/// One parsed getopt-style argument: a long option (name, inline value), a short
/// option with what follows it in the same argument, or a positional argument.
enum Arg {
    Long(String, Option<String>),
    /// A short option and, for one that takes a value, the rest of its argument.
    #[allow(dead_code)] // the value is read by no option ferofs implements yet (-d#)
    Short(char, String),
    Pos(OsString),
}

/// `with_value`: short options that take the rest of their argument as a value; the
/// others may be grouped (`-sS`).
fn split_args(args: &[OsString], with_value: &[char]) -> Vec<Arg> {
    let mut v = Vec::new();
    let mut rest = false;
    for raw in args {
        match raw.to_str() {
            Some("--") if !rest => rest = true,
            Some(a) if !rest && a.starts_with("--") => {
                let long = &a[2..];
                match long.split_once('=') {
                    Some((n, val)) => v.push(Arg::Long(n.to_string(), Some(val.to_string()))),
                    None => v.push(Arg::Long(long.to_string(), None)),
                }
            }
            Some(a) if !rest && a.len() > 1 && a.starts_with('-') => {
                let mut c = a[1..].chars();
                // Bounded by the argument's length.
                while let Some(opt) = c.next() {
                    if with_value.contains(&opt) {
                        v.push(Arg::Short(opt, c.collect()));
                        break;
                    }
                    v.push(Arg::Short(opt, String::new()));
                }
            }
            _ => v.push(Arg::Pos(raw.clone())),
        }
    }
    v
}

fn one_image(prog: &str, pos: Vec<OsString>) -> Result<OsString> {
    match <[OsString; 1]>::try_from(pos) {
        Ok([img]) => Ok(img),
        Err(_) => bail!("{prog}: expected one IMAGE"),
    }
}

/// The `ferofs` command line (after the program name) for fsck.erofs's `args`:
/// `check IMAGE`, or with `--extract=DIR`, `extract IMAGE DIR` (which reads and
/// verifies every byte it writes).
pub fn fsck_to_ferofs(args: &[OsString]) -> Result<Vec<OsString>> {
    let mut pos = Vec::new();
    let (mut extract, mut path) = (None::<String>, None::<String>);
    let mut nid = None::<String>;
    // fsck.erofs restores owners and exact modes for root only, by default.
    let root = rustix::process::geteuid().is_root();
    let (mut overwrite, mut owner, mut perms, mut xattrs) = (false, root, root, false);
    let mut offset = None::<String>;
    let mut devices: Vec<String> = Vec::new();
    let mut no_sbcrc = false;
    let mut ratio = false;
    for a in split_args(args, &['d']) {
        match a {
            Arg::Pos(p) => pos.push(p),
            Arg::Short('d', _) | Arg::Short('a', _) | Arg::Short('A', _) | Arg::Short('y', _) => {}
            Arg::Short('p', _) => ratio = true,
            Arg::Short('V', _) => return Ok(vec!["--version".into()]),
            Arg::Short('h', _) => return Ok(vec!["check".into(), "--help".into()]),
            Arg::Short(c, _) => bail!("fsck.erofs: option -{c} is not implemented by ferofs"),
            Arg::Long(n, v) => match (n.as_str(), v) {
                ("extract", v) => extract = Some(v.unwrap_or_default()),
                ("path", Some(p)) => path = Some(p),
                ("nid", Some(n)) => nid = Some(n),
                ("offset", Some(o)) => offset = Some(o),
                ("device", Some(d)) => devices.push(d),
                ("force", None) => {}
                ("preserve", None) => (owner, perms) = (true, true),
                ("preserve-perms", None) => perms = true,
                ("no-preserve-perms", None) => perms = false,
                // ferofs check verifies every content fingerprint an image records
                // (`--xattr-inode-digest` images) whenever it has them.
                ("xattr-inode-digest", None) => {}
                ("no-sbcrc", None) => no_sbcrc = true,
                ("overwrite", None) => overwrite = true,
                ("preserve-owner", None) => owner = true,
                ("no-preserve", None) => (owner, perms) = (false, false),
                ("no-preserve-owner", None) => owner = false,
                ("xattrs", None) => xattrs = true,
                ("no-xattrs", None) => xattrs = false,
                ("version", None) => return Ok(vec!["--version".into()]),
                ("help", None) => return Ok(vec!["check".into(), "--help".into()]),
                (n, _) => bail!("fsck.erofs: option --{n} is not implemented by ferofs"),
            },
        }
    }
    let image = one_image("fsck.erofs", pos)?;
    // fsck.erofs takes the path when given both.
    let what = match (path, nid) {
        (Some(p), _) => Some(("--path", p)),
        (None, Some(n)) => Some(("--nid", n)),
        (None, None) => None,
    };
    let mut v = fsck_command(image, extract, what, overwrite, owner, xattrs);
    if !perms && v.first().is_some_and(|c| c == "extract") {
        v.push("--no-same-permissions".into());
    }
    if no_sbcrc {
        v.push("--no-sb-checksum".into());
    }
    // fsck.erofs prints the ratio after checking; an extraction checks too.
    if ratio && v.first().is_some_and(|c| c == "check") {
        v.push("--ratio".into());
    }
    if let Some(o) = offset {
        v.extend(["--offset".into(), o.into()]);
    }
    for d in devices {
        v.extend(["--device".into(), d.into()]);
    }
    Ok(v)
}

/// `what`: the `--path` or `--nid` option and its value, when one was given.
fn fsck_command(
    image: OsString,
    extract: Option<String>,
    what: Option<(&str, String)>,
    overwrite: bool,
    owner: bool,
    xattrs: bool,
) -> Vec<OsString> {
    match extract.filter(|d| !d.is_empty()) {
        Some(dir) => {
            let mut v: Vec<OsString> = vec!["extract".into(), image, dir.into()];
            if let Some((opt, val)) = what {
                v.extend([opt.into(), val.into()]);
            }
            if overwrite {
                v.push("--force".into());
            }
            if !owner {
                v.push("--no-owner".into());
            }
            if !xattrs {
                // fsck.erofs restores no xattrs unless asked.
                v.push("--no-xattrs".into());
            }
            v
        }
        None => {
            let mut v: Vec<OsString> = vec!["check".into(), image];
            if let Some((opt, val)) = what {
                v.extend([opt.into(), val.into()]);
            }
            v
        }
    }
}

/// The `ferofs mount` command line (after the program name) for erofsfuse's `args`
/// (erofs-utils 1.9.3: `[options] IMAGE MOUNTPOINT`, in the background unless `-f` or
/// `-d`). Its own options: `--offset=N`, `--device=FILE` (repeatable), `--dbglevel=N`
/// (ferofs has no levels: ignored). libfuse's: `-f`, `-d` and `-o debug` (foreground,
/// reader errors reported), `-s` (one thread: `-o threads=1`), `-o OPTS` (attached or
/// as the next argument) where ferofs has the option (`allow_other`, `ro`, `suid`,
/// `dev`, `noexec`, `exec`, `nosuid`, `nodev`, `default_permissions`, `max_threads=N`
/// as `threads=N`) or where it changes nothing here (`rw`, which mount(8) hands
/// helpers from fstab; access-time and sync options; `clone_fd`, `max_idle_threads=N`,
/// `fsname=`, `subtype=`); any other option is an error naming it. One difference stays:
/// ferofs checks permissions in the kernel (`default_permissions`) unless told
/// `no_default_permissions`.
pub fn erofsfuse_to_ferofs(args: &[OsString]) -> Result<Vec<OsString>> {
    let mut pos: Vec<OsString> = Vec::new();
    let mut opts: Vec<String> = Vec::new();
    let mut out: Vec<OsString> = vec!["mount".into()];
    let (mut fg, mut verbose, mut single) = (false, false, false);
    let mut it = args.iter();
    let mut rest = false;
    // Bounded by the argument list: each turn takes one or two arguments.
    while let Some(raw) = it.next() {
        let Some(a) = raw
            .to_str()
            .filter(|a| !rest && a.starts_with('-') && a.len() > 1)
        else {
            pos.push(raw.clone());
            continue;
        };
        if a == "--" {
            rest = true;
            continue;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (n, v) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            match (n, v) {
                ("offset", Some(o)) => out.extend(["--offset".into(), o.into()]),
                ("device", Some(d)) => out.extend(["--device".into(), d.into()]),
                ("dbglevel", Some(_)) => {}
                ("help", None) => return Ok(vec!["mount".into(), "--help".into()]),
                ("version", None) => return Ok(vec!["--version".into()]),
                _ => bail!("erofsfuse: option {a} is not implemented by ferofs"),
            }
            continue;
        }
        let c = a[1..].char_indices();
        // Bounded by the argument's length.
        for (i, opt) in c {
            match opt {
                'f' => fg = true,
                'd' => (fg, verbose) = (true, true),
                's' => single = true,
                'h' => return Ok(vec!["mount".into(), "--help".into()]),
                'V' => return Ok(vec!["--version".into()]),
                'o' => {
                    let v = &a[1 + i + 1..];
                    let v = if v.is_empty() {
                        it.next()
                            .and_then(|n| n.to_str())
                            .ok_or_else(|| anyhow::anyhow!("erofsfuse: -o needs options"))?
                    } else {
                        v
                    };
                    opts.extend(v.split(',').filter(|o| !o.is_empty()).map(String::from));
                    break;
                }
                _ => bail!("erofsfuse: option -{opt} is not implemented by ferofs"),
            }
        }
    }
    let mut keep: Vec<String> = Vec::new();
    for o in opts {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        match (k, v) {
            ("debug", None) => (fg, verbose) = (true, true),
            (
                "allow_other" | "ro" | "suid" | "dev" | "noexec" | "exec" | "default_permissions",
                None,
            ) => keep.push(o.clone()),
            ("max_threads", Some(n)) => keep.push(format!("threads={n}")),
            // Off already (ferofs's defaults), or nothing to do for a read-only daemon
            // that serves every request on its own threads.
            // `rw`: what mount(8) hands a helper by default (fstab), which libfuse
            // takes; the mount is read-only whatever it says (writes fail with EROFS).
            // Access times and write modes: a read-only mount has none to keep.
            ("nosuid" | "nodev" | "clone_fd" | "rw", None)
            | (
                "atime" | "noatime" | "relatime" | "norelatime" | "strictatime" | "nostrictatime"
                | "lazytime" | "nolazytime" | "diratime" | "nodiratime" | "sync" | "async"
                | "dirsync",
                None,
            )
            | ("max_idle_threads" | "fsname" | "subtype", Some(_)) => {}
            _ => bail!("erofsfuse: -o {o} is not implemented by ferofs"),
        }
    }
    if single {
        // libfuse's single-threaded loop, whatever max_threads says.
        keep.push("threads=1".into());
    }
    let [image, dir] = <[OsString; 2]>::try_from(pos)
        .map_err(|_| anyhow::anyhow!("erofsfuse: expected IMAGE MOUNTPOINT"))?;
    if fg {
        out.push("-f".into());
    }
    if verbose {
        out.push("-v".into());
    }
    if !keep.is_empty() {
        out.extend(["-o".into(), keep.join(",").into()]);
    }
    out.extend([image, dir]);
    Ok(out)
}

/// The `ferofs` command lines for dump.erofs's `args`: `-s`/`-S` show the superblock
/// and counts (`inspect`), `--path=X` the inode (`stat`, with its extents), `--ls` its
/// directory, `--cat` its contents; `--nid=N` the inode by number (`stat --nid`).
pub fn dump_to_ferofs(args: &[OsString]) -> Result<Vec<Vec<OsString>>> {
    let mut pos = Vec::new();
    let (mut sb, mut ls, mut cat, mut ext) = (false, false, false, false);
    let mut path = None::<String>;
    let mut nid = None::<String>;
    let mut offset = None::<String>;
    let mut devices: Vec<String> = Vec::new();
    let mut udev = false;
    for a in split_args(args, &[]) {
        match a {
            Arg::Pos(p) => pos.push(p),
            Arg::Short('s', _) | Arg::Short('S', _) => sb = true,
            Arg::Short('e', _) => ext = true,
            Arg::Short('V', _) => return Ok(vec![vec!["--version".into()]]),
            Arg::Short('h', _) => return Ok(vec![vec!["inspect".into(), "--help".into()]]),
            Arg::Short(c, _) => bail!("dump.erofs: option -{c} is not implemented by ferofs"),
            Arg::Long(n, v) => match (n.as_str(), v) {
                ("ls", None) => ls = true,
                ("cat", None) => cat = true,
                ("path", Some(p)) => path = Some(p),
                ("nid", Some(n)) => nid = Some(n),
                ("offset", Some(o)) => offset = Some(o),
                ("device", Some(d)) => devices.push(d),
                ("blkid-udev", None) => udev = true,
                ("version", None) => return Ok(vec![vec!["--version".into()]]),
                ("help", None) => return Ok(vec![vec!["inspect".into(), "--help".into()]]),
                (n, _) => bail!("dump.erofs: option --{n} is not implemented by ferofs"),
            },
        }
    }
    let image = one_image("dump.erofs", pos)?;
    if udev {
        // dump.erofs prints these and nothing else.
        let mut c: Vec<OsString> = vec!["inspect".into(), "--udev".into(), image];
        if let Some(o) = offset {
            c.extend(["--offset".into(), o.into()]);
        }
        return Ok(vec![c]);
    }
    let mut cmds: Vec<Vec<OsString>> = Vec::new();
    if sb || (path.is_none() && nid.is_none()) {
        cmds.push(vec!["inspect".into(), image.clone()]);
    }
    let verb = if ls {
        "ls"
    } else if cat {
        "cat"
    } else {
        "stat" // which always shows the extents (-e)
    };
    match (path, nid) {
        (Some(p), _) => cmds.push(vec![verb.into(), image, p.into()]),
        (None, Some(n)) => cmds.push(vec![verb.into(), image, "--nid".into(), n.into()]),
        (None, None) if ls || cat || ext => {
            bail!("dump.erofs: --ls, --cat and -e need --path=X or --nid=N")
        }
        (None, None) => {}
    }
    for c in &mut cmds {
        if let Some(o) = &offset {
            c.extend(["--offset".into(), o.clone().into()]);
        }
        for d in &devices {
            c.extend(["--device".into(), d.clone().into()]);
        }
    }
    Ok(cmds)
}

#[cfg(test)]
mod fsck_dump_tests {
    use super::*;

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn fsck_lines() {
        assert_eq!(
            fsck_to_ferofs(&os(&["-d0", "img"])).expect("f"),
            os(&["check", "img"])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--extract=out", "--overwrite", "--xattrs", "img"])).expect("f"),
            os(&["extract", "img", "out", "--force"])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--extract=o", "--no-preserve-owner", "img"])).expect("f"),
            os(&["extract", "img", "o", "--no-owner", "--no-xattrs"])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--extract=o", "--no-preserve-perms", "img"])).expect("f"),
            os(&[
                "extract",
                "img",
                "o",
                "--no-xattrs",
                "--no-same-permissions"
            ])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--extract=o", "--no-preserve", "img"])).expect("f"),
            os(&[
                "extract",
                "img",
                "o",
                "--no-owner",
                "--no-xattrs",
                "--no-same-permissions"
            ])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--offset=4096", "img"])).expect("f"),
            os(&["check", "img", "--offset", "4096"])
        );
        assert_eq!(
            dump_to_ferofs(&os(&["--offset=512", "--path=/a", "img"])).expect("d"),
            [os(&["stat", "img", "/a", "--offset", "512"])]
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--path=/etc", "-p", "img"])).expect("f"),
            os(&["check", "img", "--path", "/etc", "--ratio"])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--nid=36", "img"])).expect("f"),
            os(&["check", "img", "--nid", "36"])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--extract=o", "--nid=36", "--xattrs", "img"])).expect("f"),
            os(&["extract", "img", "o", "--nid", "36"])
        );
        assert_eq!(
            fsck_to_ferofs(&os(&["--device=blob", "img"])).expect("device"),
            os(&["check", "img", "--device", "blob"])
        );
    }

    #[test]
    fn dump_lines() {
        assert_eq!(
            dump_to_ferofs(&os(&["-s", "img"])).expect("d"),
            [os(&["inspect", "img"])]
        );
        assert_eq!(
            dump_to_ferofs(&os(&["--path=/etc", "--ls", "img"])).expect("d"),
            [os(&["ls", "img", "/etc"])]
        );
        assert_eq!(
            dump_to_ferofs(&os(&["-e", "--path=/a", "img"])).expect("d"),
            [os(&["stat", "img", "/a"])]
        );
        assert_eq!(
            dump_to_ferofs(&os(&["--nid=36", "-e", "img"])).expect("d"),
            [os(&["stat", "img", "--nid", "36"])]
        );
        assert_eq!(
            dump_to_ferofs(&os(&["--device=blob", "--path=/a", "--cat", "img"])).expect("d"),
            [os(&["cat", "img", "/a", "--device", "blob"])]
        );
        assert!(dump_to_ferofs(&os(&["--ls", "img"])).is_err());
        assert_eq!(
            dump_to_ferofs(&os(&["--nid=36", "--ls", "img"])).expect("d"),
            [os(&["ls", "img", "--nid", "36"])]
        );
        assert_eq!(
            dump_to_ferofs(&os(&["--nid=40", "--cat", "--offset=512", "img"])).expect("d"),
            [os(&["cat", "img", "--nid", "40", "--offset", "512"])]
        );
    }
}

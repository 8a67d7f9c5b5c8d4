//! Container images on disk, as skopeo names them: `oci:DIR[:REF]` (an OCI image
//! layout: `index.json` and content-addressed `blobs/`), `oci-archive:FILE[:REF]` (a tar
//! of one) and `docker-archive:FILE` (`docker save`: a tar with `manifest.json`; since
//! Docker 25 also an OCI layout). The layers of the image (of the platform asked for,
//! through an index) are checked against their digests where the format has them and
//! handed to the tar stack as files: in place in a layout directory, copied out of an
//! archive into a temporary directory.

use crate::oci::{
    bad, fail, is_digest, json, layers_of, pick_platform, select_layers, BlobCheck, Layer,
    OciOptions, Pulled, MAX_JSON, MAX_LAYERS,
};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The annotation that names a manifest of an OCI layout (`:REF`).
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The annotation Docker and containerd put the full image name in.
const IMAGE_NAME: &str = "io.containerd.image.name";

/// `Some(pulled)` when `reference` names an image on disk, `None` for a registry.
pub(crate) fn pull_local(
    reference: &str,
    o: &OciOptions,
    blob: Option<&str>,
    tmp: &Path,
) -> io::Result<Option<Pulled>> {
    if let Some(rest) = reference.strip_prefix("oci:") {
        let (dir, r) = split_ref(rest);
        return layout(Path::new(dir), r, o, blob, None).map(Some);
    }
    if let Some(rest) = reference.strip_prefix("oci-archive:") {
        let (file, r) = split_ref(rest);
        let t = tempdir(tmp)?;
        unpack_layout(Path::new(file), t.path())?;
        let d = t.path().to_path_buf();
        return layout(&d, r, o, blob, Some(t)).map(Some);
    }
    if let Some(file) = reference.strip_prefix("docker-archive:") {
        return docker_archive(Path::new(file), o, blob, tmp).map(Some);
    }
    Ok(None)
}

/// `PATH[:REF]`: a `:REF` tail when the path with it does not exist and the tail has no
/// `/` (a path may hold colons).
fn split_ref(s: &str) -> (&str, Option<&str>) {
    match s.rsplit_once(':') {
        Some((p, r)) if !r.contains('/') && !Path::new(s).exists() && !r.is_empty() => (p, Some(r)),
        _ => (s, None),
    }
}

/// A temporary directory under `tmp` for an image's layers (removed when dropped).
pub(crate) fn tempdir(tmp: &Path) -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(".ferofs-oci-")
        .tempdir_in(tmp)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("a temporary directory in {}: {e}", tmp.display()),
            )
        })
}

/// The bytes of `path`, at most [`MAX_JSON`].
fn read_small(path: &Path) -> io::Result<Vec<u8>> {
    let what = path.display();
    let f =
        std::fs::File::open(path).map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
    let mut body = Vec::new();
    f.take(MAX_JSON as u64 + 1).read_to_end(&mut body)?;
    if body.len() > MAX_JSON {
        return Err(fail(format!("{what}: larger than {MAX_JSON} bytes")));
    }
    Ok(body)
}

/// The path of blob `digest` in layout `dir`.
fn blob_path(dir: &Path, digest: &str) -> io::Result<PathBuf> {
    if !is_digest(digest) {
        return Err(fail(format!("{}: blob digest {digest:?}", dir.display())));
    }
    Ok(dir.join("blobs/sha256").join(&digest["sha256:".len()..]))
}

/// A JSON blob (manifest, index) of layout `dir`, read once and checked against its
/// size (when known) and digest.
fn json_blob(dir: &Path, digest: &str, size: Option<u64>) -> io::Result<serde_json::Value> {
    let p = blob_path(dir, digest)?;
    let what = p.display().to_string();
    let body = read_small(&p)?;
    let mut check = BlobCheck::new(digest, size, &what);
    check.update(&body)?;
    check.finish()?;
    json(&body, &what)
}

/// Copy `r` to `w` while checking it: exactly `size` bytes (when given) whose SHA-256
/// is `digest` (when it is one), else an error naming `what`.
fn hash_copy(
    mut r: impl Read,
    w: &mut dyn Write,
    digest: &str,
    size: Option<u64>,
    what: &str,
) -> io::Result<u64> {
    let mut check = BlobCheck::new(digest, size, what);
    let mut buf = vec![0u8; 1 << 20];
    // Bounded by the input's length (and by `size` when given).
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        check.update(&buf[..k])?;
        w.write_all(&buf[..k])?;
    }
    check.finish()
}

/// An OCI image layout at `dir`: `index.json` -> (the entry named `r`, or the only one,
/// or the platform's) -> manifest -> layers, in place.
fn layout(
    dir: &Path,
    r: Option<&str>,
    o: &OciOptions,
    blob: Option<&str>,
    keep: Option<tempfile::TempDir>,
) -> io::Result<Pulled> {
    let what = dir.display().to_string();
    let index_path = dir.join("index.json");
    let index = json(&read_small(&index_path)?, &index_path.display().to_string())?;
    let entries = index
        .get("manifests")
        .and_then(|m| m.as_array())
        .ok_or_else(|| fail(format!("{what}/index.json: no manifests")))?;
    let name = |e: &serde_json::Value, k: &str| {
        e.get("annotations")
            .and_then(|a| a.get(k))
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    let chosen: serde_json::Value = match r {
        Some(r) => entries
            .iter()
            .take(MAX_LAYERS)
            .find(|e| {
                name(e, REF_NAME).as_deref() == Some(r) || name(e, IMAGE_NAME).as_deref() == Some(r)
            })
            .cloned()
            .ok_or_else(|| {
                let refs: Vec<String> = entries
                    .iter()
                    .take(MAX_LAYERS)
                    .filter_map(|e| name(e, REF_NAME))
                    .collect();
                bad(format!(
                    "{what}: no image named {r:?} (it has: {})",
                    refs.join(", ")
                ))
            })?,
        None if entries.len() == 1 => entries[0].clone(),
        // Several platforms of one image: the index itself is the choice.
        None if entries.iter().all(|e| e.get("platform").is_some()) => index.clone(),
        None => {
            let refs: Vec<String> = entries
                .iter()
                .take(MAX_LAYERS)
                .filter_map(|e| name(e, REF_NAME))
                .collect();
            return Err(bad(format!(
                "{what}: {} images; name one as oci:DIR:REF (it has: {})",
                entries.len(),
                refs.join(", ")
            )));
        }
    };
    // Bounded: descriptor -> index -> (nested index ->) manifest, at most four steps.
    let mut v = chosen;
    let mut digest = String::new();
    for _ in 0..4 {
        if v.get("layers").is_some() {
            break;
        }
        let (d, size) = if v.get("manifests").is_some() {
            (pick_platform(&v, &o.platform, &what)?, None)
        } else {
            let d = v.get("digest").and_then(|d| d.as_str()).ok_or_else(|| {
                fail(format!(
                    "{what}: neither a manifest, an index nor a descriptor"
                ))
            })?;
            (d.to_string(), v.get("size").and_then(|s| s.as_u64()))
        };
        v = json_blob(dir, &d, size)?;
        digest = d;
    }
    let layers = select_layers(layers_of(&v, &what)?, o.layer, blob, &what)?;
    let mut paths = Vec::with_capacity(layers.len());
    let mut bytes = 0u64;
    for Layer { digest: d, size } in &layers {
        // The layer read once to check it; the build reads it again in place.
        let p = blob_path(dir, d)?;
        let f = std::fs::File::open(&p)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
        bytes += hash_copy(f, &mut io::sink(), d, Some(*size), &p.display().to_string())?;
        paths.push(p);
    }
    Ok(Pulled {
        layers: paths,
        manifest_digest: digest,
        bytes,
        _dir: keep,
    })
}

/// Open `file` as a tar archive (a plain tar: `docker save` and OCI archives are).
fn archive(file: &Path) -> io::Result<tar::Archive<std::fs::File>> {
    let f = std::fs::File::open(file)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    Ok(tar::Archive::new(f))
}

/// Unpack the layout parts (`index.json`, `oci-layout`, `blobs/...`) of archive `file`
/// into `dir`; entries whose paths leave `dir` are refused by `unpack_in`.
fn unpack_layout(file: &Path, dir: &Path) -> io::Result<()> {
    let what = file.display().to_string();
    let mut a = archive(file)?;
    // Bounded by the archive's length.
    for e in a.entries().map_err(|e| fail(format!("{what}: {e}")))? {
        let mut e = e.map_err(|e| fail(format!("{what}: {e}")))?;
        let p = e
            .path()
            .map_err(|e| fail(format!("{what}: {e}")))?
            .into_owned();
        let p = p.strip_prefix("./").unwrap_or(&p).to_path_buf();
        let wanted = p == Path::new("index.json") || p.starts_with("blobs");
        let kind = e.header().entry_type();
        if wanted && (kind.is_file() || kind.is_dir()) {
            let ok = e
                .unpack_in(dir)
                .map_err(|err| fail(format!("{what}: {}: {err}", p.display())))?;
            if !ok {
                return Err(fail(format!(
                    "{what}: entry {} leaves the archive",
                    p.display()
                )));
            }
        }
    }
    Ok(())
}

/// `docker save`'s archive: its `manifest.json` (one image) lists the layers by their
/// paths in the archive; those are copied out (checked against their digest when the
/// path is a content address, `blobs/sha256/HEX`, as Docker 25 and later write them).
fn docker_archive(
    file: &Path,
    o: &OciOptions,
    blob: Option<&str>,
    tmp: &Path,
) -> io::Result<Pulled> {
    let what = file.display().to_string();
    // First pass: the manifest.
    let mut manifest = None;
    for e in archive(file)?
        .entries()
        .map_err(|e| fail(format!("{what}: {e}")))?
    {
        let mut e = e.map_err(|e| fail(format!("{what}: {e}")))?;
        let p = e
            .path()
            .map_err(|e| fail(format!("{what}: {e}")))?
            .into_owned();
        if p == Path::new("manifest.json") || p == Path::new("./manifest.json") {
            let mut body = Vec::new();
            (&mut e).take(MAX_JSON as u64 + 1).read_to_end(&mut body)?;
            if body.len() > MAX_JSON {
                return Err(fail(format!(
                    "{what}: manifest.json larger than {MAX_JSON} bytes"
                )));
            }
            manifest = Some(json(&body, &format!("{what}: manifest.json"))?);
            break;
        }
    }
    let m = manifest.ok_or_else(|| {
        fail(format!(
            "{what}: no manifest.json (not a docker save archive)"
        ))
    })?;
    let images = m
        .as_array()
        .ok_or_else(|| fail(format!("{what}: manifest.json is not a list")))?;
    let [image] = images.as_slice() else {
        return Err(bad(format!(
            "{what}: {} images in one archive; save one image per archive",
            images.len()
        )));
    };
    let names: Vec<String> = image
        .get("Layers")
        .and_then(|l| l.as_array())
        .ok_or_else(|| fail(format!("{what}: manifest.json without Layers")))?
        .iter()
        .take(MAX_LAYERS + 1)
        .map(|l| {
            l.as_str()
                .map(String::from)
                .ok_or_else(|| fail(format!("{what}: a layer path is not a string")))
        })
        .collect::<io::Result<_>>()?;
    if names.len() > MAX_LAYERS {
        return Err(fail(format!("{what}: more than {MAX_LAYERS} layers")));
    }
    // A path `blobs/sha256/HEX` is its content's address.
    let digest_of = |n: &str| {
        n.strip_prefix("blobs/sha256/")
            .map(|h| format!("sha256:{h}"))
            .filter(|d| is_digest(d))
            .unwrap_or_default()
    };
    let layers: Vec<Layer> = names
        .iter()
        .map(|n| Layer {
            digest: {
                let d = digest_of(n);
                if d.is_empty() {
                    n.clone()
                } else {
                    d
                }
            },
            size: 0,
        })
        .collect();
    let chosen = select_layers(layers, o.layer, blob, &what)?;
    let t = tempdir(tmp)?;
    let mut out: Vec<Option<PathBuf>> = vec![None; chosen.len()];
    let mut bytes = 0u64;
    // Second pass: copy the chosen layers out (a layer may be listed twice).
    for e in archive(file)?
        .entries()
        .map_err(|e| fail(format!("{what}: {e}")))?
    {
        let e = e.map_err(|e| fail(format!("{what}: {e}")))?;
        let p = e
            .path()
            .map_err(|e| fail(format!("{what}: {e}")))?
            .into_owned();
        let p = p
            .strip_prefix("./")
            .unwrap_or(&p)
            .to_string_lossy()
            .into_owned();
        let key = {
            let d = digest_of(&p);
            if d.is_empty() {
                p.clone()
            } else {
                d
            }
        };
        let hits: Vec<usize> = chosen
            .iter()
            .enumerate()
            .filter(|(i, l)| l.digest == key && out[*i].is_none())
            .map(|(i, _)| i)
            .collect();
        let Some(&first) = hits.first() else { continue };
        let dst = t.path().join(format!("layer-{first:04}"));
        let mut f = std::fs::File::create(&dst)?;
        bytes += hash_copy(e, &mut f, &key, None, &format!("{what}: {p}"))?;
        for i in hits {
            out[i] = Some(dst.clone());
        }
    }
    let layers = out
        .into_iter()
        .zip(&chosen)
        .map(|(p, l)| {
            p.ok_or_else(|| fail(format!("{what}: layer {} is not in the archive", l.digest)))
        })
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Pulled {
        layers,
        manifest_digest: String::new(),
        bytes,
        _dir: Some(t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_ref() {
        assert_eq!(split_ref("/no/such/dir:v1"), ("/no/such/dir", Some("v1")));
        assert_eq!(split_ref("/no/such/dir"), ("/no/such/dir", None));
        assert_eq!(split_ref("rel:dir/x"), ("rel:dir/x", None));
        let d = tempfile::tempdir().expect("tempdir");
        let odd = d.path().join("a:b");
        std::fs::create_dir(&odd).expect("mkdir");
        let s = odd.to_string_lossy().into_owned();
        assert_eq!(split_ref(&s), (s.as_str(), None));
    }
}

//! Pull an image's layers from an OCI registry (the distribution API, v2): resolve
//! `[REGISTRY/]NAME[:TAG|@DIGEST]` to a manifest (through an index or a Docker manifest
//! list for the platform asked for), then fetch each layer blob into a file, checking
//! its size and SHA-256 digest as it arrives. The layers are then built as a tar stack
//! (`ferofs build --oci`, mkfs.erofs's `--oci`).
//!
//! Registries ask for a token first (Docker Hub even for public images): a 401 with
//! `WWW-Authenticate: Bearer realm=...,service=...,scope=...` is answered by asking the
//! realm for a token (with the user name and password, when given) and retrying; a
//! `Basic` challenge takes the user name and password directly. Without a user name,
//! the credentials `docker login` or `podman login` stored for the registry are used
//! ([`stored_credentials`]). Redirects (blobs on a
//! CDN) are followed; the client drops the credentials when a redirect leaves the host.
//!
//! Bounds: manifests, indexes and token answers at most [`MAX_JSON`] bytes; a blob
//! exactly the size its descriptor gives; at most [`MAX_LAYERS`] layers.

use crate::disk::hex;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest manifest, index or token answer read.
pub const MAX_JSON: usize = 4 << 20;
/// Most layers one image may have (Docker's limit is 127).
pub const MAX_LAYERS: usize = 1024;
/// Layer downloads at once.
const PARALLEL: usize = 3;
/// Tries of one blob download.
const TRIES: u32 = 3;

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// What to pull and how.
#[derive(Debug, Clone)]
pub struct OciOptions {
    /// `OS/ARCH[/VARIANT]`, e.g. `linux/amd64`, `linux/arm64/v8`.
    pub platform: String,
    /// Only this layer (0-based, in the manifest's order).
    pub layer: Option<usize>,
    /// Only the layer with this digest (`sha256:HEX` or `HEX`).
    pub blob: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Plain HTTP instead of HTTPS.
    pub insecure: bool,
    /// Time limit of a manifest or token request as a whole, and of each read of a
    /// blob (a layer of gigabytes may take longer than this in all).
    pub timeout: Duration,
    /// Counters a progress display reads while the layers download.
    pub progress: Option<Arc<PullProgress>>,
}

/// Bytes of the layers to download and downloaded so far (a try that fails takes its
/// bytes back out).
#[derive(Debug, Default)]
pub struct PullProgress {
    pub total: AtomicU64,
    pub done: AtomicU64,
}

impl Default for OciOptions {
    fn default() -> Self {
        OciOptions {
            platform: host_platform(),
            layer: None,
            blob: None,
            username: None,
            password: None,
            insecure: false,
            timeout: Duration::from_secs(60),
            progress: None,
        }
    }
}

/// This machine's platform in OCI's names (`linux/amd64`, `linux/arm64`, ...).
pub fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        a => a,
    };
    format!("linux/{arch}")
}

/// The container tools' credential files, in the order they are asked:
/// `REGISTRY_AUTH_FILE`, `$DOCKER_CONFIG/config.json`, `~/.docker/config.json` (docker
/// login), `$XDG_RUNTIME_DIR/containers/auth.json` (podman login).
fn auth_files() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut v = Vec::new();
    v.extend(env("REGISTRY_AUTH_FILE"));
    v.extend(env("DOCKER_CONFIG").map(|d| d.join("config.json")));
    v.extend(env("HOME").map(|h| h.join(".docker/config.json")));
    v.extend(env("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
    v
}

/// The registry a credential file's key names: `https://index.docker.io/v1/` and
/// `docker.io` are Docker Hub, whose API host is `registry-1.docker.io`.
fn auth_key_host(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let k = k.split('/').next().unwrap_or("");
    match k {
        "index.docker.io" | "docker.io" => "registry-1.docker.io".to_string(),
        _ => k.to_string(),
    }
}

/// The user name and password stored for `host` (the API host of [`ImageRef`]) by
/// `docker login` or `podman login`: the first file of [`auth_files`] with an entry for
/// it (an `auth` field, base64 of `USER:PASSWORD`). Credential helpers (`credsStore`,
/// `credHelpers`) are not run.
pub fn stored_credentials(host: &str) -> Option<(String, String)> {
    use base64::Engine;
    for f in auth_files() {
        let Ok(meta) = std::fs::metadata(&f) else {
            continue;
        };
        if !meta.is_file() || meta.len() > MAX_JSON as u64 {
            continue;
        }
        let Ok(text) = std::fs::read(&f) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(auths) = v.get("auths").and_then(|a| a.as_object()) else {
            continue;
        };
        for (key, entry) in auths {
            if auth_key_host(key) != host {
                continue;
            }
            let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) else {
                continue;
            };
            let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(auth.trim()) else {
                continue;
            };
            let Ok(pair) = String::from_utf8(raw) else {
                continue;
            };
            if let Some((u, p)) = pair.split_once(':') {
                return Some((u.to_string(), p.to_string()));
            }
        }
    }
    None
}

/// A pulled image: its layers, in order, as files (in a temporary directory removed
/// when this is dropped, or in place in an OCI layout directory).
#[derive(Debug)]
pub struct Pulled {
    pub layers: Vec<PathBuf>,
    /// Digest of the manifest the layers come from (empty for a legacy `docker save`
    /// archive, which has none).
    pub manifest_digest: String,
    /// Bytes fetched or read (the layers, compressed as they are stored).
    pub bytes: u64,
    pub(crate) _dir: Option<tempfile::TempDir>,
}

/// An image reference, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// Host (and port) the API is asked at.
    pub host: String,
    /// Repository name, e.g. `library/alpine`.
    pub name: String,
    /// Tag or `sha256:` digest.
    pub reference: String,
}

pub(crate) fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

pub(crate) fn fail(msg: String) -> io::Error {
    io::Error::other(msg)
}

pub(crate) fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Parse `[REGISTRY/]NAME[:TAG][@DIGEST]` as Docker does: the first component names a
/// registry when it has a `.` or a `:` or is `localhost`; otherwise the image is on
/// Docker Hub (`library/` added to a one-component name); the tag defaults to `latest`.
pub fn parse_ref(s: &str) -> io::Result<ImageRef> {
    let s = s.strip_prefix("docker://").unwrap_or(s);
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => {
            if !is_digest(d) {
                return Err(bad(format!(
                    "{s}: digest {d:?} is not sha256:<64 hex digits>"
                )));
            }
            (r, Some(d.to_ascii_lowercase()))
        }
        None => (s, None),
    };
    let (host, path) = match rest.split_once('/') {
        Some((first, p)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            (first.to_string(), p)
        }
        _ => ("docker.io".to_string(), rest),
    };
    let (path, tag) = match path.rsplit_once(':') {
        Some((p, t)) => (p, Some(t)),
        None => (path, None),
    };
    if path.is_empty()
        || path.len() > 255
        || !path
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        || path.split('/').any(str::is_empty)
    {
        return Err(bad(format!("{s}: {path:?} is not a repository name")));
    }
    if let Some(t) = tag {
        if t.is_empty()
            || t.len() > 128
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(bad(format!("{s}: {t:?} is not a tag")));
        }
    }
    let (host, name) = if host == "docker.io" || host == "index.docker.io" {
        let name = if path.contains('/') {
            path.to_string()
        } else {
            format!("library/{path}")
        };
        ("registry-1.docker.io".to_string(), name)
    } else {
        (host, path.to_string())
    };
    let reference = match (digest, tag) {
        (Some(d), _) => d,
        (None, Some(t)) => t.to_string(),
        (None, None) => "latest".to_string(),
    };
    Ok(ImageRef {
        host,
        name,
        reference,
    })
}

/// The `key="value"` parameters of a `WWW-Authenticate` challenge, after its scheme.
fn challenge_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    // Bounded: each turn consumes at least one character.
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq]
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        rest = &rest[eq + 1..];
        let value;
        if let Some(q) = rest.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            value = q[..end].to_string();
            rest = q.get(end + 1..).unwrap_or("");
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest[..end].trim().to_string();
            rest = &rest[end..];
        }
        rest = rest.trim_start().trim_start_matches(',');
        out.push((key, value));
    }
    out
}

struct Client {
    http: reqwest::Client,
    base: String,
    r: ImageRef,
    o: OciOptions,
    /// Bearer token, or Basic (the options' credentials) once asked for.
    token: Option<String>,
    basic: bool,
}

impl Client {
    fn url(&self, kind: &str, what: &str) -> String {
        format!("{}/v2/{}/{kind}/{what}", self.base, self.r.name)
    }

    fn creds(&self) -> Option<(&str, Option<&str>)> {
        self.o
            .username
            .as_deref()
            .map(|u| (u, self.o.password.as_deref()))
    }

    /// GET `url`; a manifest or token (`accept` given) within the time limit as a
    /// whole, a blob (`accept` empty) with the limit between its reads.
    async fn send(&self, url: &str, accept: &str) -> io::Result<reqwest::Response> {
        let mut req = self.http.get(url);
        if !accept.is_empty() {
            req = req
                .header(reqwest::header::ACCEPT, accept)
                .timeout(self.o.timeout);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        } else if let (true, Some((u, p))) = (self.basic, self.creds()) {
            req = req.basic_auth(u, p);
        }
        req.send()
            .await
            .map_err(|e| fail(format!("GET {url}: {}", error_chain(&e))))
    }

    /// GET `url`, answering one authentication challenge.
    /// [`Client::send`], tried again while the connection fails or the answer is
    /// [`transient`] (see [`with_tries`]); the last answer or error is returned.
    async fn send_retried(&self, url: &str, accept: &str) -> io::Result<reqwest::Response> {
        with_tries(
            || self.send(url, accept),
            |r| r.as_ref().map_or(true, |resp| transient(resp.status())),
        )
        .await
    }

    async fn get(&mut self, url: &str, accept: &str) -> io::Result<reqwest::Response> {
        let mut resp = self.send_retried(url, accept).await?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED && self.token.is_none() && !self.basic
        {
            let challenge = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            self.authenticate(&challenge).await?;
            resp = self.send_retried(url, accept).await?;
        }
        let st = resp.status();
        if !st.is_success() {
            let hint = match st.as_u16() {
                401 | 403 => " (credentials: --oci-username / --oci-password)",
                404 => " (no such image, tag or blob)",
                _ => "",
            };
            return Err(fail(format!("GET {url}: {st}{hint}")));
        }
        Ok(resp)
    }

    async fn authenticate(&mut self, challenge: &str) -> io::Result<()> {
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            if self.creds().is_none() {
                return Err(fail(format!(
                    "{}: the registry asks for a user name and password (--oci-username, --oci-password)",
                    self.r.host
                )));
            }
            self.basic = true;
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(fail(format!(
                "{}: unsupported authentication challenge {challenge:?}",
                self.r.host
            )));
        }
        let p = challenge_params(params);
        let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let realm = get("realm")
            .ok_or_else(|| fail(format!("{}: Bearer challenge without a realm", self.r.host)))?;
        let scope = get("scope")
            .map(String::from)
            .unwrap_or_else(|| format!("repository:{}:pull", self.r.name));
        let mut q: Vec<(&str, &str)> = vec![("scope", &scope)];
        if let Some(s) = get("service") {
            q.push(("service", s));
        }
        let token_url = url::Url::parse_with_params(realm, &q)
            .map_err(|e| fail(format!("{}: token realm {realm:?}: {e}", self.r.host)))?;
        let mut req = self.http.get(token_url).timeout(self.o.timeout);
        if let Some((u, pw)) = self.creds() {
            req = req.basic_auth(u, pw);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| fail(format!("token from {realm}: {}", error_chain(&e))))?;
        let st = resp.status();
        if !st.is_success() {
            return Err(fail(format!(
                "token from {realm}: {st} (credentials: --oci-username / --oci-password)"
            )));
        }
        let body = read_limited(resp, MAX_JSON, realm).await?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| fail(format!("token from {realm}: not JSON: {e}")))?;
        let token = v
            .get("token")
            .or_else(|| v.get("access_token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| fail(format!("token from {realm}: no token in the answer")))?;
        self.token = Some(token.to_string());
        Ok(())
    }

    /// A manifest or index by tag or digest: (media type, body, digest).
    async fn manifest(&mut self, reference: &str) -> io::Result<(String, Vec<u8>, String)> {
        let url = self.url("manifests", reference);
        let accept = [INDEX_TYPES, MANIFEST_TYPES].concat().join(", ");
        let resp = self.get(&url, &accept).await?;
        let ctype = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let body = read_limited(resp, MAX_JSON, &url).await?;
        let digest = format!("sha256:{}", hex(&Sha256::digest(&body)));
        if is_digest(reference) && digest != reference {
            return Err(fail(format!(
                "{url}: the manifest's digest is {digest}, not the one asked for"
            )));
        }
        Ok((ctype, body, digest))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    // Bounded by the error chain's length (a handful).
    for _ in 0..8 {
        let Some(c) = src else { break };
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

async fn read_limited(mut resp: reqwest::Response, max: usize, what: &str) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    // Bounded: the body is read up to `max` bytes.
    while let Some(c) = resp
        .chunk()
        .await
        .map_err(|e| fail(format!("{what}: {}", error_chain(&e))))?
    {
        if out.len() + c.len() > max {
            return Err(fail(format!("{what}: answer larger than {max} bytes")));
        }
        out.extend_from_slice(&c);
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub(crate) digest: String,
    pub(crate) size: u64,
}

pub(crate) fn json(body: &[u8], what: &str) -> io::Result<serde_json::Value> {
    serde_json::from_slice(body).map_err(|e| fail(format!("{what}: not JSON: {e}")))
}

/// The platform entry of an index matching `want` (`os/arch[/variant]`).
pub(crate) fn pick_platform(
    index: &serde_json::Value,
    want: &str,
    what: &str,
) -> io::Result<String> {
    let mut w = want.split('/');
    let (os, arch, variant) = (w.next().unwrap_or(""), w.next().unwrap_or(""), w.next());
    let list = index
        .get("manifests")
        .and_then(|m| m.as_array())
        .ok_or_else(|| fail(format!("{what}: index without manifests")))?;
    let mut seen = Vec::new();
    for m in list.iter().take(MAX_LAYERS) {
        let p = m.get("platform");
        let field = |k: &str| {
            p.and_then(|p| p.get(k))
                .and_then(|v| v.as_str())
                .unwrap_or("")
        };
        let (mos, march, mvar) = (field("os"), field("architecture"), field("variant"));
        if mos.is_empty() || mos == "unknown" {
            continue; // attestations and other non-images
        }
        seen.push(if mvar.is_empty() {
            format!("{mos}/{march}")
        } else {
            format!("{mos}/{march}/{mvar}")
        });
        let var_ok = match variant {
            None => true,
            Some(v) => v == mvar || (mvar.is_empty() && march == "arm64" && v == "v8"),
        };
        if mos == os && march == arch && var_ok {
            let d = m.get("digest").and_then(|d| d.as_str()).unwrap_or("");
            if !is_digest(d) {
                return Err(fail(format!("{what}: entry for {want} has digest {d:?}")));
            }
            return Ok(d.to_string());
        }
    }
    Err(fail(format!(
        "{what}: no image for platform {want} (the index has: {})",
        if seen.is_empty() {
            "none".to_string()
        } else {
            seen.join(", ")
        }
    )))
}

pub(crate) fn layers_of(manifest: &serde_json::Value, what: &str) -> io::Result<Vec<Layer>> {
    let list = manifest
        .get("layers")
        .and_then(|l| l.as_array())
        .ok_or_else(|| fail(format!("{what}: manifest without layers")))?;
    if list.len() > MAX_LAYERS {
        return Err(fail(format!(
            "{what}: {} layers (at most {MAX_LAYERS})",
            list.len()
        )));
    }
    list.iter()
        .enumerate()
        .map(|(i, l)| {
            let digest = l.get("digest").and_then(|d| d.as_str()).unwrap_or("");
            let size = l.get("size").and_then(|s| s.as_u64());
            let mt = l.get("mediaType").and_then(|m| m.as_str()).unwrap_or("");
            if !is_digest(digest) {
                return Err(fail(format!("{what}: layer {i} has digest {digest:?}")));
            }
            if !mt.is_empty() && !mt.contains("tar") {
                return Err(fail(format!("{what}: layer {i} is {mt}, not a tar")));
            }
            let size = size.ok_or_else(|| fail(format!("{what}: layer {i} has no size")))?;
            Ok(Layer {
                digest: digest.to_ascii_lowercase(),
                size,
            })
        })
        .collect()
}

/// A failed blob fetch: worth another try (the connection, the server's 5xx or 429,
/// a body cut short) or not (a wrong status, size or digest; the local file).
enum Fetch {
    Again(io::Error),
    Stop(io::Error),
}

/// Fetch one blob into `path`: exactly `l.size` bytes whose SHA-256 is `l.digest`.
async fn fetch_blob(c: &Client, l: &Layer, path: &Path) -> Result<u64, Fetch> {
    let url = c.url("blobs", &l.digest);
    let resp = c.send(&url, "").await.map_err(Fetch::Again)?;
    let st = resp.status();
    if transient(st) {
        return Err(Fetch::Again(fail(format!("GET {url}: {st}"))));
    }
    if !st.is_success() {
        return Err(Fetch::Stop(fail(format!("GET {url}: {st}"))));
    }
    let file = std::fs::File::create(path).map_err(Fetch::Stop)?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut check = BlobCheck::new(&l.digest, Some(l.size), &url);
    let mut counted = Counted {
        p: c.o.progress.as_deref(),
        n: 0,
        keep: false,
    };
    let mut s = resp.bytes_stream();
    // Bounded: the stream is cut off once it passes the descriptor's size.
    while let Some(chunk) = s.next().await {
        let chunk = chunk.map_err(|e| Fetch::Again(fail(format!("{url}: {}", error_chain(&e)))))?;
        check.update(&chunk).map_err(Fetch::Stop)?;
        f.write_all(&chunk).map_err(Fetch::Stop)?;
        counted.add(chunk.len() as u64);
    }
    // A body cut short may come whole next time; a wrong digest will not.
    let short = check.got < l.size;
    let got = check.finish().map_err(|e| {
        if short {
            Fetch::Again(e)
        } else {
            Fetch::Stop(e)
        }
    })?;
    f.flush().map_err(Fetch::Stop)?;
    counted.keep = true;
    Ok(got)
}

/// Bytes one download try added to the progress counter; taken back out unless the
/// try succeeded.
struct Counted<'a> {
    p: Option<&'a PullProgress>,
    n: u64,
    keep: bool,
}

impl Counted<'_> {
    fn add(&mut self, k: u64) {
        if let Some(p) = self.p {
            p.done.fetch_add(k, Ordering::Relaxed);
            self.n += k;
        }
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if let (false, Some(p)) = (self.keep, self.p) {
            p.done.fetch_sub(self.n, Ordering::Relaxed);
        }
    }
}

/// [`fetch_blob`], tried again while it fails in a way another try may mend.
async fn fetch_blob_retried(c: &Client, l: &Layer, path: &Path) -> io::Result<u64> {
    with_tries(
        || fetch_blob(c, l, path),
        |r| matches!(r, Err(Fetch::Again(_))),
    )
    .await
    .map_err(|e| match e {
        Fetch::Again(e) | Fetch::Stop(e) => e,
    })
}

/// An answer another try may mend: a server error or 429 (a registry's rate limit).
fn transient(st: reqwest::StatusCode) -> bool {
    st.is_server_error() || st == reqwest::StatusCode::TOO_MANY_REQUESTS
}

/// `attempt`, up to [`TRIES`] times (1 s, then 2 s apart) while `again` says its
/// result may mend; the last result.
async fn with_tries<T, E, Fut>(
    mut attempt: impl FnMut() -> Fut,
    again: impl Fn(&Result<T, E>) -> bool,
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut wait = Duration::from_secs(1);
    let mut t = 1;
    // Bounded: TRIES turns.
    loop {
        let r = attempt().await;
        if t >= TRIES || !again(&r) {
            return r;
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
        t += 1;
    }
}

/// A blob checked as it streams by: at most `size` bytes (when known), then (at
/// [`BlobCheck::finish`]) exactly that many, with SHA-256 `digest` (when it is one).
/// Errors name `what`.
pub(crate) struct BlobCheck<'a> {
    h: Sha256,
    pub(crate) got: u64,
    size: Option<u64>,
    digest: &'a str,
    what: &'a str,
}

impl<'a> BlobCheck<'a> {
    pub(crate) fn new(digest: &'a str, size: Option<u64>, what: &'a str) -> Self {
        BlobCheck {
            h: Sha256::new(),
            got: 0,
            size,
            digest,
            what,
        }
    }

    pub(crate) fn update(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.got = self.got.saturating_add(chunk.len() as u64);
        if let Some(s) = self.size.filter(|&s| self.got > s) {
            return Err(fail(format!(
                "{}: more than the {s} bytes the manifest gives",
                self.what
            )));
        }
        self.h.update(chunk);
        Ok(())
    }

    /// The bytes seen, once they are all the blob should be.
    pub(crate) fn finish(self) -> io::Result<u64> {
        if let Some(s) = self.size.filter(|&s| s != self.got) {
            return Err(fail(format!(
                "{}: {} bytes, the manifest gives {s}",
                self.what, self.got
            )));
        }
        if is_digest(self.digest) {
            let d = format!("sha256:{}", hex(&self.h.finalize()));
            if d != self.digest {
                return Err(fail(format!(
                    "{}: content digest {d}, expected {}",
                    self.what, self.digest
                )));
            }
        }
        Ok(self.got)
    }
}

/// The layers `layer` (an index) or `blob` (a digest) select, else all.
pub(crate) fn select_layers(
    layers: Vec<Layer>,
    layer: Option<usize>,
    blob: Option<&str>,
    what: &str,
) -> io::Result<Vec<Layer>> {
    if let Some(i) = layer {
        let n = layers.len();
        let l = layers
            .get(i)
            .cloned()
            .ok_or_else(|| bad(format!("{what}: layer {i} asked for, the image has {n}")))?;
        return Ok(vec![l]);
    }
    if let Some(full) = blob {
        let l = layers
            .iter()
            .find(|l| l.digest == full)
            .cloned()
            .ok_or_else(|| bad(format!("{what}: no layer {full}")))?;
        return Ok(vec![l]);
    }
    Ok(layers)
}

/// The blob digest `o` asks for, as `sha256:` and lower-case hex.
fn wanted_blob(o: &OciOptions) -> io::Result<Option<String>> {
    let blob = match &o.blob {
        Some(b) => {
            let b = b.to_ascii_lowercase();
            let full = if b.starts_with("sha256:") {
                b
            } else {
                format!("sha256:{b}")
            };
            if !is_digest(&full) {
                return Err(bad(format!("blob {full:?} is not a sha256 digest")));
            }
            Some(full)
        }
        None => None,
    };
    if blob.is_some() && o.layer.is_some() {
        return Err(bad(
            "a layer index and a blob digest cannot be given together".into(),
        ));
    }
    Ok(blob)
}

/// Pull `reference`'s layers (those `o` selects) into a temporary directory under `tmp`.
/// Besides a registry's `[REGISTRY/]NAME[:TAG|@DIGEST]`, the reference may name an
/// image on disk, as skopeo spells them: `oci:DIR[:REF]` (an OCI image layout
/// directory, its layers read in place), `oci-archive:FILE[:REF]` (a tar of one) and
/// `docker-archive:FILE` (`docker save`'s output).
pub fn pull(reference: &str, o: &OciOptions, tmp: &Path) -> io::Result<Pulled> {
    let blob = wanted_blob(o)?;
    if let Some(p) = crate::oci_local::pull_local(reference, o, blob.as_deref(), tmp)? {
        return Ok(p);
    }
    let r = parse_ref(reference)?;
    let rt = crate::runtime("ferofs-oci")?;
    let http = reqwest::Client::builder()
        .user_agent(concat!("ferofs/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(o.timeout)
        .read_timeout(o.timeout)
        .build()
        .map_err(|e| fail(format!("HTTP client: {}", error_chain(&e))))?;
    let scheme = if o.insecure { "http" } else { "https" };
    let mut o = o.clone();
    if o.username.is_none() {
        if let Some((u, p)) = stored_credentials(&r.host) {
            (o.username, o.password) = (Some(u), Some(p));
        }
    }
    let mut c = Client {
        http,
        base: format!("{scheme}://{}", r.host),
        r: r.clone(),
        o: o.clone(),
        token: None,
        basic: false,
    };
    rt.block_on(async move {
        let what = format!("{}/{}:{}", r.host, r.name, r.reference);
        let (mut ctype, mut body, mut digest) = c.manifest(&r.reference).await?;
        let mut v = json(&body, &what)?;
        let is_index = |ct: &str, v: &serde_json::Value| {
            INDEX_TYPES.contains(&ct)
                || v.get("mediaType")
                    .and_then(|m| m.as_str())
                    .is_some_and(|m| INDEX_TYPES.contains(&m))
                || (v.get("manifests").is_some() && v.get("layers").is_none())
        };
        if is_index(&ctype, &v) {
            let d = pick_platform(&v, &o.platform, &what)?;
            (ctype, body, digest) = c.manifest(&d).await?;
            v = json(&body, &what)?;
            if is_index(&ctype, &v) {
                return Err(fail(format!("{what}: an index inside an index")));
            }
        }
        let layers = select_layers(layers_of(&v, &what)?, o.layer, blob.as_deref(), &what)?;
        if let Some(p) = &o.progress {
            let total = layers.iter().fold(0u64, |t, l| t.saturating_add(l.size));
            p.total.store(total, Ordering::Relaxed);
        }
        let dir = crate::oci_local::tempdir(tmp)?;
        let paths: Vec<PathBuf> = (0..layers.len())
            .map(|i| dir.path().join(format!("layer-{i:04}")))
            .collect();
        // One token for all (the first GET asked for it); fetches share the client.
        let c = &c;
        let jobs = layers
            .iter()
            .zip(&paths)
            .map(|(l, p)| fetch_blob_retried(c, l, p));
        let got: Vec<io::Result<u64>> = futures::stream::iter(jobs)
            .buffered(PARALLEL)
            .collect()
            .await;
        let mut bytes = 0u64;
        for g in got {
            bytes = bytes.saturating_add(g?);
        }
        Ok(Pulled {
            layers: paths,
            manifest_digest: digest,
            bytes,
            _dir: Some(dir),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = |s: &str| parse_ref(s).map(|r| (r.host, r.name, r.reference));
        let s = |a: &str, b: &str, c: &str| Some((a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(
            r("alpine").ok(),
            s("registry-1.docker.io", "library/alpine", "latest")
        );
        assert_eq!(
            r("docker.io/library/debian:stable").ok(),
            s("registry-1.docker.io", "library/debian", "stable")
        );
        assert_eq!(
            r("user/app:1.0").ok(),
            s("registry-1.docker.io", "user/app", "1.0")
        );
        assert_eq!(
            r("localhost:5000/a/b:v1").ok(),
            s("localhost:5000", "a/b", "v1")
        );
        assert_eq!(r("ghcr.io/o/p").ok(), s("ghcr.io", "o/p", "latest"));
        let d = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(
            r(&format!("quay.io/x/y:tag@{d}")).ok(),
            s("quay.io", "x/y", &d)
        );
        for bad in [
            "",
            "UPPER/case",
            "a//b",
            "x@sha256:12",
            "x:bad tag",
            "host.io/",
        ] {
            assert!(parse_ref(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn credential_keys() {
        assert_eq!(
            auth_key_host("https://index.docker.io/v1/"),
            "registry-1.docker.io"
        );
        assert_eq!(auth_key_host("docker.io"), "registry-1.docker.io");
        assert_eq!(auth_key_host("ghcr.io"), "ghcr.io");
        assert_eq!(auth_key_host("http://localhost:5000/v2/"), "localhost:5000");
    }

    #[test]
    fn challenges() {
        let p = challenge_params(
            r#"realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            p,
            [
                (
                    "realm".to_string(),
                    "https://auth.docker.io/token".to_string()
                ),
                ("service".to_string(), "registry.docker.io".to_string()),
                ("scope".to_string(), "repository:a/b:pull,push".to_string()),
            ]
        );
        assert_eq!(challenge_params("realm=x, error=y").len(), 2);
        assert!(challenge_params("").is_empty());
        assert_eq!(challenge_params("broken=\"unterminated").len(), 1);
    }

    #[test]
    fn platforms() {
        let idx: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"manifests":[
              {{"digest":"sha256:{a}","platform":{{"os":"linux","architecture":"amd64"}}}},
              {{"digest":"sha256:{b}","platform":{{"os":"linux","architecture":"arm","variant":"v7"}}}},
              {{"digest":"sha256:{c}","platform":{{"os":"unknown","architecture":"unknown"}}}}]}}"#,
            a = "a".repeat(64),
            b = "b".repeat(64),
            c = "c".repeat(64)
        ))
        .expect("json");
        assert_eq!(
            pick_platform(&idx, "linux/amd64", "t").ok(),
            Some(format!("sha256:{}", "a".repeat(64)))
        );
        assert_eq!(
            pick_platform(&idx, "linux/arm/v7", "t").ok(),
            Some(format!("sha256:{}", "b".repeat(64)))
        );
        let e = pick_platform(&idx, "linux/s390x", "t").expect_err("no s390x");
        assert!(e.to_string().contains("linux/amd64, linux/arm/v7"), "{e}");
    }
}

//! # ferofs-remote — EROFS images over the network
//!
//! [`Remote`] is a [`ferofs_reader::Source`] over an object fetched with range requests:
//! `http://` and `https://` URLs (any server that honours `Range`), and `s3://bucket/key`
//! on AWS S3 or an S3-compatible store (MinIO, Ceph RGW, ...). The HTTP work is
//! `object_store`'s (Apache Arrow): TLS with rustls and the system's roots, S3 signing
//! and the standard `AWS_*` environment (`AWS_ENDPOINT_URL` for another store,
//! `AWS_ALLOW_HTTP`, `AWS_SKIP_SIGNATURE` for a public bucket), retries with backoff.
//!
//! How a read is served:
//!
//! - The object is cut into blocks ([`RemoteOptions::block_size`]). A read takes the
//!   blocks it covers from memory (a bounded map, CLOCK eviction), then from the disk
//!   cache ([`RemoteOptions::cache_dir`]), and fetches the rest: adjacent missing
//!   blocks are one request, requests run in parallel (at most
//!   [`RemoteOptions::parallel`] at a time for the whole source), and a block another
//!   thread is fetching is waited for, not fetched twice.
//! - A read that continues the previous one (a file read in order) also fetches the
//!   next blocks in the same request ([`RemoteOptions::readahead`]).
//! - The object's size and ETag are taken at open. Every request carries `If-Match`
//!   with that ETag, and the size, ETag and range of every answer are checked: an
//!   object replaced while it is read is an I/O error ("changed since it was opened"),
//!   never bytes of two versions.
//! - Each request has a timeout; transient failures are retried with backoff within
//!   [`RemoteOptions::timeout`]; a server that is gone is an error within about twice
//!   that, never a hang.

#![forbid(unsafe_code)]

pub mod bucket;
mod disk;
pub mod oci;
mod oci_local;
mod verity;

use bytes::Bytes;
use ferofs_reader::Source;
use futures::stream::{self, StreamExt};
use object_store::{
    aws::AmazonS3Builder, http::HttpBuilder, path::Path as ObjPath, BackoffConfig, ClientOptions,
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Is `s` a URL this crate opens (`http://`, `https://`, `s3://`)?
pub fn is_url(s: &str) -> bool {
    ["http://", "https://", "s3://"]
        .iter()
        .any(|p| s.len() > p.len() && s[..p.len()].eq_ignore_ascii_case(p))
}

/// How a [`Remote`] fetches and caches.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Fetch and cache granularity in bytes (a power of two, 4 KiB to 16 MiB).
    pub block_size: u64,
    /// Budget of fetched blocks kept in memory.
    pub memory_bytes: u64,
    /// Requests in flight at once (for the whole source).
    pub parallel: usize,
    /// Time limit of one request; failed requests are retried until this much time
    /// has passed since the first attempt.
    pub timeout: Duration,
    /// Retries of a failed request (within `timeout`).
    pub retries: usize,
    /// Bytes fetched ahead of a read that continues the previous one.
    pub readahead: u64,
    /// Most bytes one request asks for (adjacent misses are coalesced up to this).
    pub max_request: u64,
    /// On-disk block cache shared between runs (None: memory only).
    pub cache_dir: Option<PathBuf>,
    /// Size limit of the on-disk cache.
    pub cache_size: u64,
    /// S3 endpoint (MinIO, Ceph RGW, ...): overrides `AWS_ENDPOINT_URL`.
    pub s3_endpoint: Option<String>,
    /// dm-verity root hash (`ferofs build --verity`): every fetched block is checked
    /// against the hash tree, itself checked against this, before it is used.
    pub verity: Option<Vec<u8>>,
    /// Byte offset of the verity superblock (default: the end of the EROFS image as its
    /// superblock gives it, rounded up to 4096).
    pub verity_hash_offset: Option<u64>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            block_size: 128 << 10,
            memory_bytes: 64 << 20,
            parallel: 8,
            timeout: Duration::from_secs(30),
            retries: 4,
            readahead: 2 << 20,
            max_request: 8 << 20,
            cache_dir: None,
            cache_size: 1 << 30,
            s3_endpoint: None,
            verity: None,
            verity_hash_offset: None,
        }
    }
}

/// What a [`Remote`] has fetched so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Range requests sent (answered or not), not counting the HEAD at open.
    pub requests: u64,
    /// Bytes received from the server.
    pub bytes_fetched: u64,
    /// Blocks served from the on-disk cache.
    pub disk_hits: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fetched {} bytes in {} requests; {} blocks from the disk cache",
            self.bytes_fetched, self.requests, self.disk_hits
        )
    }
}

/// The blocks in memory and the ones being fetched.
#[derive(Default)]
struct State {
    blocks: HashMap<u64, (Bytes, bool)>,
    /// CLOCK order of `blocks`.
    order: VecDeque<u64>,
    bytes: u64,
    inflight: HashSet<u64>,
    /// End of the last read (read-ahead when the next one starts there).
    last_end: u64,
}

/// An object read with range requests. See the crate documentation.
pub struct Remote {
    url: String,
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    path: ObjPath,
    size: u64,
    etag: Option<String>,
    /// The modification time at open (RFC 3339), checked when there is no ETag.
    last_modified: String,
    o: RemoteOptions,
    state: Mutex<State>,
    arrived: Condvar,
    permits: Arc<tokio::sync::Semaphore>,
    disk: Option<disk::DiskCache>,
    verity: Option<verity::Verity>,
    requests: AtomicU64,
    fetched: AtomicU64,
    disk_hits: AtomicU64,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("size", &self.size)
            .field("etag", &self.etag)
            .finish_non_exhaustive()
    }
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// An object_store error as an io::Error with the URL in it.
/// An S3 store's builder for `bucket`: the standard `AWS_*` environment, `client` and
/// `retry`, and the endpoint given, else the `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`
/// or `AWS_ENDPOINT` environment variable (given as `http://`, plain HTTP on purpose:
/// a local MinIO).
fn s3_builder(
    bucket: &str,
    endpoint: Option<String>,
    client: ClientOptions,
    retry: RetryConfig,
) -> AmazonS3Builder {
    let endpoint = endpoint.or_else(|| {
        ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|k| std::env::var(k).ok())
    });
    let plain = endpoint
        .as_deref()
        .is_some_and(|e| e.to_ascii_lowercase().starts_with("http://"));
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry)
        .with_client_options(if plain {
            client.with_allow_http(true)
        } else {
            client
        });
    if let Some(e) = endpoint {
        b = b.with_endpoint(e);
    }
    b
}

/// Request and connection time limits of the object stores' HTTP client.
fn client_options(timeout: Duration) -> ClientOptions {
    ClientOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout.min(Duration::from_secs(10)))
}

/// Retries with backoff (100 ms doubling to 2 s), within `timeout` in all.
fn retry_config(max_retries: usize, timeout: Duration) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries,
        retry_timeout: timeout,
    }
}

/// The two-thread runtime a blocking API of this crate runs its requests on.
fn runtime(name: &str) -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
}

fn store_err(url: &str, e: object_store::Error) -> io::Error {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, format!("{url}: not found")),
        E::Precondition { .. } => other(format!(
            "{url}: the object changed since it was opened (ETag no longer matches)"
        )),
        E::NotModified { .. } => other(format!("{url}: unexpected 304 Not Modified")),
        e => other(format!("{url}: {e}")),
    }
}

fn check_block_size(b: u64) -> io::Result<()> {
    if b.is_power_of_two() && (4096..=16 << 20).contains(&b) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("block size {b}: a power of two from 4 KiB to 16 MiB"),
    ))
}

impl Remote {
    /// Open `url` (`http(s)://host/path`, `s3://bucket/key`): one HEAD request for the
    /// size and ETag.
    pub fn open(url: &str, o: &RemoteOptions) -> io::Result<Remote> {
        let mut o = o.clone();
        check_block_size(o.block_size)?;
        o.parallel = o.parallel.clamp(1, 64);
        o.max_request = o.max_request.max(o.block_size);
        let parsed = url::Url::parse(url)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))?;
        let timeout = o.timeout.max(Duration::from_millis(100));
        let client = client_options(timeout).with_pool_max_idle_per_host(o.parallel);
        let retry = retry_config(o.retries, timeout);
        let bad =
            |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {what}"));
        let (store, path): (Arc<dyn ObjectStore>, ObjPath) = match parsed.scheme() {
            "http" | "https" => {
                let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
                let base = match parsed.port() {
                    Some(p) => format!("{}://{host}:{p}", parsed.scheme()),
                    None => format!("{}://{host}", parsed.scheme()),
                };
                let path = ObjPath::from_url_path(parsed.path())
                    .map_err(|e| bad(&format!("bad path: {e}")))?;
                let store = HttpBuilder::new()
                    .with_url(base)
                    .with_client_options(client.with_allow_http(parsed.scheme() == "http"))
                    .with_retry(retry)
                    .build()
                    .map_err(|e| store_err(url, e))?;
                (Arc::new(store), path)
            }
            "s3" => {
                let bucket = parsed.host_str().ok_or_else(|| bad("no bucket"))?;
                let path = ObjPath::from_url_path(parsed.path())
                    .map_err(|e| bad(&format!("bad key: {e}")))?;
                let store = s3_builder(bucket, o.s3_endpoint.clone(), client, retry)
                    .build()
                    .map_err(|e| store_err(url, e))?;
                (Arc::new(store), path)
            }
            s => return Err(bad(&format!("unknown scheme {s}: (http, https or s3)"))),
        };
        if path.as_ref().is_empty() {
            return Err(bad("no object path"));
        }
        Self::with_store(url, store, path, &o)
    }

    /// A [`Remote`] over any object store (`name` is the URL errors show).
    pub fn with_store(
        name: &str,
        store: Arc<dyn ObjectStore>,
        path: ObjPath,
        o: &RemoteOptions,
    ) -> io::Result<Remote> {
        let url = name;
        let mut o = o.clone();
        check_block_size(o.block_size)?;
        o.parallel = o.parallel.clamp(1, 64);
        o.max_request = o.max_request.max(o.block_size);
        let timeout = o.timeout.max(Duration::from_millis(100));
        let rt = runtime("ferofs-remote")?;
        // The whole call is bounded too (the store's own retries stop at `timeout`).
        let limit = 2 * timeout + Duration::from_secs(1);
        let meta = rt
            .block_on(async { tokio::time::timeout(limit, store.head(&path)).await })
            .map_err(|_| other(format!("{url}: no answer within {limit:?}")))?
            .map_err(|e| store_err(url, e))?;
        let size = meta.size;
        let etag = meta.e_tag.clone();
        let last_modified = meta.last_modified.to_rfc3339();
        let disk = match &o.cache_dir {
            Some(dir) => {
                let identity = format!(
                    "{url}\nsize={size}\netag={}\nmtime={last_modified}\nblock={}",
                    etag.as_deref().unwrap_or(""),
                    o.block_size
                );
                Some(
                    disk::DiskCache::open(dir, &identity, o.cache_size).map_err(|e| {
                        io::Error::new(e.kind(), format!("cache directory {}: {e}", dir.display()))
                    })?,
                )
            }
            None => None,
        };
        let mut r = Remote {
            url: url.to_string(),
            rt,
            store,
            path,
            size,
            etag,
            last_modified,
            permits: Arc::new(tokio::sync::Semaphore::new(o.parallel)),
            o,
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            disk,
            verity: None,
            requests: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
        };
        if let Some(root) = r.o.verity.clone() {
            let v = r.rt.block_on(r.load_verity(&root))?;
            r.verity = Some(v);
        }
        Ok(r)
    }

    /// Fetch and check the hash tree (see the `verity` module).
    async fn load_verity(&self, root: &[u8]) -> io::Result<verity::Verity> {
        use ferofs_format::sb::{Superblock, MAGIC, SB_MAX_SIZE, SB_OFFSET};
        let hash_offset = match self.o.verity_hash_offset {
            Some(o) => o,
            None => {
                let at = SB_OFFSET as usize;
                let head = self.fetch_range(0, (at + SB_MAX_SIZE) as u64).await?;
                let raw: &[u8; SB_MAX_SIZE] = head
                    .get(at..at + SB_MAX_SIZE)
                    .and_then(|s| s.try_into().ok())
                    .ok_or_else(|| other(format!("{}: short superblock", self.url)))?;
                let sb = Superblock::parse(raw);
                if sb.magic != MAGIC || !(9..=12).contains(&sb.blkszbits) {
                    return Err(other(format!(
                        "{}: no EROFS superblock to find the verity tree by",
                        self.url
                    )));
                }
                let (_, blocks) = sb.root_nid_and_blocks();
                blocks
                    .checked_mul(1u64 << sb.blkszbits)
                    .map(|e| e.div_ceil(4096) * 4096)
                    .ok_or_else(|| other(format!("{}: bad block count", self.url)))?
            }
        };
        let sb_end = hash_offset
            .checked_add(ferofs_format::verity::SB_SIZE as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                other(format!(
                    "{}: no verity superblock at byte {hash_offset}",
                    self.url
                ))
            })?;
        let raw = self.fetch_range(hash_offset, sb_end).await?;
        let sb = verity::parse_sb(&raw, hash_offset)?;
        let (t, at, len) = verity::tree_span(&sb, hash_offset)?;
        let end = at
            .checked_add(len)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| other(format!("{}: the verity tree is cut short", self.url)))?;
        let tree = if len > 0 {
            self.fetch_range(at, end).await?
        } else {
            Bytes::new()
        };
        verity::Verity::new(&sb, &t, &tree, root)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The ETag pinned at open (None: the server gave none; then the size and the
    /// modification time are checked).
    pub fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes_fetched: self.fetched.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
        }
    }

    /// Fetch bytes `start..end` ahead of need (into memory and the disk cache, where
    /// they count as the metadata of the object and are evicted last), in
    /// requests of at most [`RemoteOptions::max_request`], in parallel; at most a
    /// quarter of the memory budget. Readers of these blocks meanwhile wait for them
    /// instead of fetching them again.
    pub fn prefetch(&self, start: u64, end: u64) -> io::Result<()> {
        let end = end.min(self.size).min(
            self.verity
                .as_ref()
                .map_or(u64::MAX, verity::Verity::data_end),
        );
        let end = end.min(start.saturating_add(self.o.memory_bytes / 4));
        if start >= end {
            return Ok(());
        }
        let bs = self.o.block_size;
        if let Some(d) = &self.disk {
            // What is fetched ahead is metadata: kept longest in the disk cache.
            d.set_meta(start / bs, (end - 1) / bs + 1);
        }
        self.blocks(start / bs..=(end - 1) / bs, 0).map(drop)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn block_len(&self, index: u64) -> usize {
        let start = index * self.o.block_size;
        (self.size.saturating_sub(start)).min(self.o.block_size) as usize
    }

    fn insert(&self, st: &mut State, index: u64, data: Bytes) {
        let len = data.len() as u64;
        match st.blocks.insert(index, (data, false)) {
            Some((old, _)) => st.bytes -= old.len() as u64,
            None => st.order.push_back(index),
        }
        st.bytes += len;
        // CLOCK: a block used since it was last passed gets another round.
        let mut turns = 2 * st.order.len();
        while st.bytes > self.o.memory_bytes && turns > 0 {
            turns -= 1;
            let Some(i) = st.order.pop_front() else { break };
            if i == index {
                st.order.push_back(i);
                continue;
            }
            match st.blocks.get_mut(&i) {
                Some((_, used)) if *used => {
                    *used = false;
                    st.order.push_back(i);
                }
                Some(_) => {
                    if let Some((b, _)) = st.blocks.remove(&i) {
                        st.bytes -= b.len() as u64;
                    }
                }
                None => {}
            }
        }
    }

    /// Fetch blocks `first..first + count` in one request.
    async fn fetch_run(&self, first: u64, count: u64) -> io::Result<Bytes> {
        let start = first * self.o.block_size;
        let end = ((first + count) * self.o.block_size).min(self.size);
        let b = self.fetch_range(start, end).await?;
        if let Some(v) = &self.verity {
            v.check(start, &b)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.url)))?;
        }
        Ok(b)
    }

    /// Bytes `start..end` of the object in one request (If-Match the pinned ETag).
    async fn fetch_range(&self, start: u64, end: u64) -> io::Result<Bytes> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| other("request limiter closed".into()))?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let opts = GetOptions {
            if_match: self.etag.clone(),
            range: Some(GetRange::Bounded(start..end)),
            ..Default::default()
        };
        let url = &self.url;
        let get = async {
            let r = self
                .store
                .get_opts(&self.path, opts)
                .await
                .map_err(|e| store_err(url, e))?;
            let changed = r.meta.size != self.size
                || (self.etag.is_some() && r.meta.e_tag != self.etag)
                || (self.etag.is_none() && r.meta.last_modified.to_rfc3339() != self.last_modified);
            if changed {
                return Err(other(format!(
                    "{url}: the object changed since it was opened (size {} ETag {:?}, was {} {:?})",
                    r.meta.size, r.meta.e_tag, self.size, self.etag
                )));
            }
            if r.range != (start..end) {
                return Err(other(format!(
                    "{url}: asked for bytes {start}..{end}, the server sent {:?}",
                    r.range
                )));
            }
            let b = r.bytes().await.map_err(|e| store_err(url, e))?;
            self.fetched.fetch_add(b.len() as u64, Ordering::Relaxed);
            if b.len() as u64 != end - start {
                return Err(other(format!(
                    "{url}: asked for {} bytes at {start}, got {}",
                    end - start,
                    b.len()
                )));
            }
            Ok(b)
        };
        let limit = 2 * self.o.timeout + Duration::from_secs(1);
        tokio::time::timeout(limit, get).await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{url}: bytes {start}..{end}: no answer within {limit:?}"),
            )
        })?
    }

    /// Blocks `want` (all needed) and `ahead` (fetched if missing and free, never
    /// waited for), returned as a map of the wanted ones.
    fn blocks(
        &self,
        want: std::ops::RangeInclusive<u64>,
        ahead: u64,
    ) -> io::Result<HashMap<u64, Bytes>> {
        let mut have: HashMap<u64, Bytes> = HashMap::new();
        let deadline = Instant::now() + 3 * self.o.timeout + Duration::from_secs(2);
        let last_block = self.size.saturating_sub(1) / self.o.block_size;
        let ahead_end = want.end().saturating_add(ahead).min(last_block);
        // Rounds: each claims what nobody fetches, fetches it, then waits for the rest.
        // A block whose fetcher failed is claimed in the next round; bounded.
        for round in 0..4 {
            let mut claimed: Vec<u64> = Vec::new();
            let mut waiting = false;
            {
                let mut st = self.lock();
                for i in want.clone() {
                    if have.contains_key(&i) {
                        continue;
                    }
                    if let Some((b, used)) = st.blocks.get_mut(&i) {
                        *used = true;
                        have.insert(i, b.clone());
                    } else if st.inflight.contains(&i) {
                        waiting = true;
                    } else {
                        st.inflight.insert(i);
                        claimed.push(i);
                    }
                }
                // Read-ahead rides on a request this read makes anyway: the free blocks
                // right after the wanted ones, up to the first one present or in flight.
                if round == 0 && claimed.last() == Some(want.end()) {
                    for i in want.end() + 1..=ahead_end {
                        if st.blocks.contains_key(&i) || st.inflight.contains(&i) {
                            break;
                        }
                        st.inflight.insert(i);
                        claimed.push(i);
                    }
                }
            }
            if !claimed.is_empty() {
                let r = self.fetch_claimed(&claimed, &mut have, *want.end());
                {
                    let mut st = self.lock();
                    for i in &claimed {
                        st.inflight.remove(i);
                    }
                }
                self.arrived.notify_all();
                r?;
            }
            if waiting {
                let mut st = self.lock();
                while want.clone().any(|i| st.inflight.contains(&i)) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("{}: waiting for another reader's fetch timed out", self.url),
                        ));
                    }
                    st = self
                        .arrived
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            if want.clone().all(|i| have.contains_key(&i)) {
                return Ok(have);
            }
        }
        Err(other(format!(
            "{}: blocks {want:?} could not be fetched",
            self.url
        )))
    }

    /// Fill `have` with the claimed blocks: disk cache first, then requests for the
    /// runs of adjacent misses, in parallel.
    fn fetch_claimed(
        &self,
        claimed: &[u64],
        have: &mut HashMap<u64, Bytes>,
        last_wanted: u64,
    ) -> io::Result<()> {
        let mut miss: Vec<u64> = Vec::new();
        for &i in claimed {
            let hit = self
                .disk
                .as_ref()
                .and_then(|d| d.get(i, self.block_len(i)))
                .filter(|b| {
                    self.verity
                        .as_ref()
                        .is_none_or(|v| v.check(i * self.o.block_size, b).is_ok())
                });
            match hit {
                Some(v) => {
                    self.disk_hits.fetch_add(1, Ordering::Relaxed);
                    let b = Bytes::from(v);
                    self.insert(&mut self.lock(), i, b.clone());
                    if i <= last_wanted {
                        have.insert(i, b);
                    }
                }
                None => miss.push(i),
            }
        }
        let per = (self.o.max_request / self.o.block_size).max(1);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for i in miss {
            match runs.last_mut() {
                Some((first, n)) if *first + *n == i && *n < per => *n += 1,
                _ => runs.push((i, 1)),
            }
        }
        if runs.is_empty() {
            return Ok(());
        }
        let results: Vec<(u64, u64, io::Result<Bytes>)> = self.rt.block_on(async {
            stream::iter(runs.iter().copied())
                .map(|(first, n)| async move { (first, n, self.fetch_run(first, n).await) })
                .buffer_unordered(self.o.parallel)
                .collect()
                .await
        });
        let mut err = None;
        for (first, n, r) in results {
            match r {
                Ok(data) => {
                    for k in 0..n {
                        let i = first + k;
                        let at = (k * self.o.block_size) as usize;
                        let len = self.block_len(i);
                        let b = Bytes::copy_from_slice(data.get(at..at + len).unwrap_or_default());
                        if b.len() != len {
                            continue;
                        }
                        if let Some(d) = &self.disk {
                            d.put(i, &b);
                        }
                        self.insert(&mut self.lock(), i, b.clone());
                        if i <= last_wanted {
                            have.insert(i, b);
                        }
                    }
                }
                Err(e) => err = err.or(Some(e)),
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Source for Remote {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(v) = &self.verity {
            if end > v.data_end() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: bytes {offset}..{end} are past the {} bytes the verity tree covers",
                        self.url,
                        v.data_end()
                    ),
                ));
            }
        }
        let bs = self.o.block_size;
        let first = offset / bs;
        let last = (end - 1) / bs;
        let ahead = {
            let mut st = self.lock();
            let seq = st.last_end == offset && offset != 0;
            st.last_end = end;
            if seq {
                self.o.readahead / bs
            } else {
                0
            }
        };
        let have = self.blocks(first..=last, ahead)?;
        let mut pos = 0usize;
        for i in first..=last {
            let b = have
                .get(&i)
                .ok_or_else(|| other(format!("{}: block {i} missing", self.url)))?;
            let from = if i == first {
                (offset - first * bs) as usize
            } else {
                0
            };
            let n = (b.len().saturating_sub(from)).min(buf.len() - pos);
            let src = b
                .get(from..from + n)
                .ok_or_else(|| other(format!("{}: block {i} short", self.url)))?;
            buf[pos..pos + n].copy_from_slice(src);
            pos += n;
        }
        if pos != buf.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(is_url("http://h/x"));
        assert!(is_url("HTTPS://h/x"));
        assert!(is_url("s3://b/k"));
        assert!(!is_url("s3://"));
        assert!(!is_url("/tmp/s3"));
        assert!(!is_url("image.erofs"));
    }

    #[test]
    fn bad_options_and_urls() {
        let o = RemoteOptions {
            block_size: 1000,
            ..Default::default()
        };
        let e = Remote::open("http://127.0.0.1:1/x", &o).err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
        let e = Remote::open("ftp://h/x", &RemoteOptions::default()).err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
        let e = Remote::open("http://h/", &RemoteOptions::default()).err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    }

    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn pseudo(n: usize, seed: u64) -> Vec<u8> {
        ferofs_testkit::noise(n, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn store_with(data: &[u8]) -> (Arc<InMemory>, ObjPath) {
        let s = Arc::new(InMemory::new());
        let p = ObjPath::from("img.erofs");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(s.put(&p, PutPayload::from(data.to_vec())))
            .expect("put");
        (s, p)
    }

    fn small() -> RemoteOptions {
        RemoteOptions {
            block_size: 4096,
            memory_bytes: 64 << 10,
            readahead: 16 << 10,
            max_request: 32 << 10,
            ..Default::default()
        }
    }

    #[test]
    fn reads_coalesce_and_memory_is_bounded() -> io::Result<()> {
        let data = pseudo(1 << 20, 1);
        let (s, p) = store_with(&data);
        let r = Remote::with_store("mem", s, p, &small())?;
        // 10 blocks in one read: one request for them (max_request 8 blocks: two).
        let mut b = vec![0u8; 10 * 4096];
        r.read_exact_at(&mut b, 8192)?;
        assert_eq!(b, data[8192..8192 + 10 * 4096]);
        assert_eq!(r.stats().requests, 2);
        assert_eq!(r.stats().bytes_fetched, 10 * 4096);
        // Again: from memory.
        r.read_exact_at(&mut b, 8192)?;
        assert_eq!(r.stats().requests, 2);
        // Past the end: UnexpectedEof, no request.
        let e = r.read_exact_at(&mut b, (1 << 20) - 100).err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::UnexpectedEof));
        // Random reads from 4 threads: right bytes, memory within the budget.
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (r, data) = (&r, &data);
                sc.spawn(move || {
                    let mut x = t + 7;
                    for _ in 0..300 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let len = (x >> 40) as usize % 20000 + 1;
                        let off = (x >> 8) as usize % (data.len() - len);
                        let mut b = vec![0u8; len];
                        r.read_exact_at(&mut b, off as u64).expect("read");
                        assert_eq!(b, data[off..off + len]);
                    }
                });
            }
        });
        let st = r.lock();
        assert!(st.bytes <= 64 << 10, "{}", st.bytes);
        assert_eq!(
            st.bytes,
            st.blocks.values().map(|b| b.0.len() as u64).sum::<u64>()
        );
        assert!(st.inflight.is_empty());
        Ok(())
    }

    #[test]
    fn sequential_reads_fetch_ahead() -> io::Result<()> {
        let data = pseudo(256 << 10, 2);
        let (s, p) = store_with(&data);
        let r = Remote::with_store("mem", s, p, &small())?;
        let mut b = vec![0u8; 4096];
        for i in 0..32u64 {
            r.read_exact_at(&mut b, i * 4096)?;
            assert_eq!(b, data[(i * 4096) as usize..][..4096]);
        }
        // 32 blocks: the first alone (not a continuation), then each miss brings 4
        // read-ahead blocks with it: blocks 1-5, 6-10, ..., 31-35.
        assert_eq!(r.stats().requests, 8);
        assert_eq!(r.stats().bytes_fetched, 36 * 4096);
        Ok(())
    }

    #[test]
    fn replaced_object_is_an_error_not_new_bytes() -> io::Result<()> {
        let data = pseudo(64 << 10, 3);
        let (s, p) = store_with(&data);
        let r = Remote::with_store("mem", s.clone(), p.clone(), &small())?;
        let mut b = vec![0u8; 4096];
        r.read_exact_at(&mut b, 0)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(s.put(&p, PutPayload::from(pseudo(64 << 10, 4))))
            .expect("put");
        // Fetched before: still the old bytes. Not fetched yet: an error.
        r.read_exact_at(&mut b, 0)?;
        assert_eq!(b, data[..4096]);
        let e = r
            .read_exact_at(&mut b, 32 << 10)
            .expect_err("changed object");
        assert!(e.to_string().contains("changed since it was opened"), "{e}");
        Ok(())
    }

    #[test]
    fn disk_cache_serves_a_second_open() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let data = pseudo(100_000, 5);
        let (s, p) = store_with(&data);
        let o = RemoteOptions {
            cache_dir: Some(dir.path().to_path_buf()),
            ..small()
        };
        let mut b = vec![0u8; 100_000];
        let r = Remote::with_store("mem", s.clone(), p.clone(), &o)?;
        r.read_exact_at(&mut b, 0)?;
        assert!(r.stats().requests > 0);
        let r2 = Remote::with_store("mem", s.clone(), p.clone(), &o)?;
        r2.read_exact_at(&mut b, 0)?;
        assert_eq!(b, data);
        assert_eq!(r2.stats().requests, 0);
        assert_eq!(r2.stats().disk_hits, 25);
        // Another version of the object: another key, fetched anew.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let new = pseudo(100_000, 6);
        rt.block_on(s.put(&p, PutPayload::from(new.clone())))
            .expect("put");
        let r3 = Remote::with_store("mem", s, p, &o)?;
        r3.read_exact_at(&mut b, 0)?;
        assert_eq!(b, new);
        assert_eq!(r3.stats().disk_hits, 0);
        Ok(())
    }

    #[test]
    fn refused_connection_is_a_prompt_error() {
        // Port 1 on loopback: nothing listens; retries end within the timeout.
        let o = RemoteOptions {
            timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let t = Instant::now();
        let e = Remote::open("http://127.0.0.1:1/img", &o).err();
        assert!(e.is_some());
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    }
}

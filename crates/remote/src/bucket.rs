//! The objects under a prefix of an S3 bucket, as files of a tree (`ferofs build --s3`,
//! mkfs.erofs's `--s3`): list them (key, size, last-modified time), then fetch each in
//! full. The store is `object_store`'s AmazonS3 with the standard `AWS_*` environment;
//! [`S3Options`] overrides the endpoint, credentials, region and addressing style.

use crate::{other, store_err};
use futures::StreamExt;
use object_store::{path::Path as ObjPath, ObjectStore, ObjectStoreExt};
use std::io::{self, Write};
use std::time::Duration;

/// Most objects one listing may return (each costs a few dozen bytes of memory).
pub const MAX_OBJECTS: usize = 50_000_000;
/// Objects fetched at once by [`S3Bucket::fetch_many`].
pub const PARALLEL: usize = 8;

/// Where and how to reach the bucket (unset fields come from the `AWS_*` environment).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// e.g. `http://127.0.0.1:9000` (plain HTTP allowed when given as `http://`).
    pub endpoint: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub region: Option<String>,
    /// `https://BUCKET.ENDPOINT/KEY` (AWS's virtual-hosted style) instead of
    /// `https://ENDPOINT/BUCKET/KEY`.
    pub virtual_hosted: bool,
    /// Time limit of one request (0: 60 s).
    pub timeout: Duration,
}

/// One object: its key and what a file made of it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Object {
    /// The key, without the `/` a directory marker ends with.
    pub key: String,
    /// A directory marker (an empty object whose key ends with `/`, as consoles and
    /// s3fs make them).
    pub dir: bool,
    pub size: u64,
    /// Last-modified time, seconds and nanoseconds since the epoch.
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// The key as the store listed it (fetched as it is).
    loc: ObjPath,
}

/// A bucket opened for listing and fetching.
pub struct S3Bucket {
    store: object_store::aws::AmazonS3,
    rt: tokio::runtime::Runtime,
    name: String,
}

impl S3Bucket {
    pub fn open(bucket: &str, o: &S3Options) -> io::Result<S3Bucket> {
        if bucket.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no bucket name",
            ));
        }
        let timeout = if o.timeout.is_zero() {
            Duration::from_secs(60)
        } else {
            o.timeout
        };
        let mut b = crate::s3_builder(
            bucket,
            o.endpoint.clone(),
            crate::client_options(timeout),
            crate::retry_config(5, timeout),
        )
        .with_virtual_hosted_style_request(o.virtual_hosted);
        if let Some(k) = &o.access_key {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &o.secret_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(r) = &o.region {
            b = b.with_region(r);
        }
        let name = format!("s3://{bucket}");
        let store = b.build().map_err(|e| store_err(&name, e))?;
        let rt = crate::runtime("ferofs-s3")?;
        Ok(S3Bucket { store, rt, name })
    }

    /// Every object under `prefix` (a directory: `data` lists `data/...`; empty: the
    /// whole bucket), sorted by key.
    pub fn list(&self, prefix: &str) -> io::Result<Vec<S3Object>> {
        let p = prefix.trim_matches('/');
        let path = (!p.is_empty()).then(|| ObjPath::from(p));
        let what = format!("{}/{p}", self.name);
        let mut v: Vec<S3Object> = self.rt.block_on(async {
            let mut s = self.store.list(path.as_ref());
            let mut v = Vec::new();
            // Bounded: at most MAX_OBJECTS entries are kept.
            while let Some(m) = s.next().await {
                let m = m.map_err(|e| store_err(&what, e))?;
                if v.len() >= MAX_OBJECTS {
                    return Err(other(format!("{what}: more than {MAX_OBJECTS} objects")));
                }
                let t = m.last_modified;
                v.push(S3Object {
                    key: m.location.to_string(),
                    dir: false,
                    size: m.size,
                    mtime: t.timestamp(),
                    mtime_nsec: t.timestamp_subsec_nanos(),
                    loc: m.location,
                });
            }
            Ok::<_, io::Error>(v)
        })?;
        v.sort_by(|a, b| a.key.cmp(&b.key));
        // The store's paths drop a directory marker's trailing `/` ("d/" lists as
        // "d"): an empty object is a directory when keys lie below it, or when no
        // object of its name without the slash exists.
        let below = |i: usize| {
            let k = &v[i].key;
            v[i + 1..]
                .iter()
                .take_while(|o| o.key.starts_with(k.as_str()))
                .any(|o| o.key.as_bytes().get(k.len()) == Some(&b'/'))
        };
        let mut dirs = Vec::new();
        for (i, o) in v.iter().enumerate() {
            if o.size == 0 && (below(i) || self.missing(o, &what)?) {
                dirs.push(i);
            }
        }
        for i in dirs {
            v[i].dir = true;
        }
        Ok(v)
    }

    /// Whether `o` cannot be fetched under its listed name (a directory marker).
    fn missing(&self, o: &S3Object, what: &str) -> io::Result<bool> {
        self.rt.block_on(async {
            match self.store.head(&o.loc).await {
                Ok(_) => Ok(false),
                Err(object_store::Error::NotFound { .. }) => Ok(true),
                Err(e) => Err(store_err(what, e)),
            }
        })
    }

    /// The contents of `objs` (small ones: each is held in memory), fetched
    /// [`PARALLEL`] at a time, in the order given; each exactly its listed size.
    pub fn fetch_many(&self, objs: &[&S3Object]) -> io::Result<Vec<bytes::Bytes>> {
        self.rt.block_on(async {
            let jobs = objs.iter().map(|o| async move {
                let what = format!("{}/{}", self.name, o.key);
                let r = self
                    .store
                    .get(&o.loc)
                    .await
                    .map_err(|e| store_err(&what, e))?;
                let b = r.bytes().await.map_err(|e| store_err(&what, e))?;
                if b.len() as u64 != o.size {
                    return Err(other(format!(
                        "{what}: {} bytes, {} listed (changed while read)",
                        b.len(),
                        o.size
                    )));
                }
                Ok(b)
            });
            let got: Vec<io::Result<bytes::Bytes>> = futures::stream::iter(jobs)
                .buffered(PARALLEL)
                .collect()
                .await;
            got.into_iter().collect()
        })
    }

    /// Write object `o` to `w`: exactly `o.size` bytes (else an error).
    pub fn fetch(&self, o: &S3Object, w: &mut dyn Write) -> io::Result<()> {
        let what = format!("{}/{}", self.name, o.key);
        self.rt.block_on(async {
            let r = self
                .store
                .get(&o.loc)
                .await
                .map_err(|e| store_err(&what, e))?;
            let mut s = r.into_stream();
            let mut got = 0u64;
            // Bounded: cut off once past the listed size.
            while let Some(c) = s.next().await {
                let c = c.map_err(|e| store_err(&what, e))?;
                got = got.saturating_add(c.len() as u64);
                if got > o.size {
                    return Err(other(format!(
                        "{what}: longer than the {} bytes listed (changed while read)",
                        o.size
                    )));
                }
                w.write_all(&c)?;
            }
            if got != o.size {
                return Err(other(format!(
                    "{what}: {got} bytes, {} listed (changed while read)",
                    o.size
                )));
            }
            Ok(())
        })
    }
}

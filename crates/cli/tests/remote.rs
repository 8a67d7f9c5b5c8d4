//! Images over the network: `ferofs ls|cat|extract|check|mount` of `http://` URLs
//! (nginx, started here on 127.0.0.1 and stopped at the end) and `s3://` URLs (moto's
//! S3 server, likewise) give what the same commands give for the local file; one
//! small `cat` fetches a small part of the image; `--cache-dir` serves a second run
//! without a range request; an object replaced under a mount gives EIO; a server that
//! is gone or stalls gives a clear error within the timeout.
//!
//! Needs root (make-tree's tmpfs, kernel mounts), /dev/fuse, nginx and moto
//! (`scripts/test` installs them; FEROFS_SKIP_KERNEL=1 skips loudly).

mod common;
use common::*;
use ferofs_testkit::run as sh;
use ferofs_testkit::*;
use std::collections::BTreeMap;
use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn available(test: &str) -> bool {
    if !kernel_available(test) {
        return false;
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "{test}: no /dev/fuse (set FEROFS_SKIP_KERNEL=1 to skip)"
    );
    true
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn wait_port(port: u16, what: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what} did not listen on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed (and reaped) on drop.
struct Server {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Server {
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// nginx serving `dir/www` on 127.0.0.1, its access log (`$request $status
/// $body_bytes_sent`) in `dir/access.log`.
fn nginx() -> Server {
    let dir = scratch("nginx");
    let www = dir.path().join("www");
    fs::create_dir(&www).expect("www");
    let port = free_port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 256; }}\n\
         http {{\n  log_format f '$request_method $status $body_bytes_sent $http_range';\n\
         access_log {d}/access.log f;\n  client_body_temp_path {d}/t1;\n\
         proxy_temp_path {d}/t2;\n  fastcgi_temp_path {d}/t3;\n  uwsgi_temp_path {d}/t4;\n\
         scgi_temp_path {d}/t5;\n  types {{ }}\n  default_type application/octet-stream;\n\
         server {{ listen 127.0.0.1:{port}; root {d}/www; }}\n}}\n"
    );
    fs::write(dir.path().join("nginx.conf"), conf).expect("nginx.conf");
    let child = Command::new("nginx")
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .arg("-p")
        .arg(dir.path())
        .stdin(Stdio::null())
        .spawn()
        .expect("start nginx (Debian package nginx; scripts/test installs it)");
    wait_port(port, "nginx");
    Server {
        child: Some(child),
        port,
        dir,
    }
}

impl Server {
    /// (GET requests, body bytes sent) from nginx's access log.
    fn gets(&self) -> (u64, u64) {
        let log = fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.starts_with("GET "))
            .fold((0, 0), |(n, b), l| {
                let bytes: u64 = l
                    .split(' ')
                    .nth(2)
                    .and_then(|s| s.parse().ok())
                    .expect("access log line");
                (n + 1, b + bytes)
            })
    }
    /// `gets()` once nginx has logged what was asked: it writes a request's line after
    /// the response, which the client need not wait for. Polls until the count since
    /// `base` is `want`, or, with no `want`, until two reads 100 ms apart agree; at
    /// most 5 s.
    fn gets_after(&self, base: (u64, u64), want: Option<(u64, u64)>) -> (u64, u64) {
        let mut last = self.gets();
        for _ in 0..50 {
            if want == Some((last.0 - base.0, last.1 - base.1)) {
                return last;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            let now = self.gets();
            if want.is_none() && now == last {
                return now;
            }
            last = now;
        }
        last
    }
    fn www(&self, name: &str) -> PathBuf {
        self.dir.path().join("www").join(name)
    }
    fn http_url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }
}

/// The Python with moto: `target/tools/moto/bin/python3` (scripts/test makes it) or
/// `python3`.
fn moto_python() -> PathBuf {
    let venv = workspace_root().join("target/tools/moto/bin/python3");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

const BUCKET: &str = "images";

/// moto's S3 server on 127.0.0.1 with bucket `images`.
fn moto() -> Server {
    let dir = scratch("moto");
    let port = free_port();
    let child = Command::new(moto_python())
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto (pip install 'moto[server]'; scripts/test installs it)");
    wait_port(port, "moto");
    let s = Server {
        child: Some(child),
        port,
        dir,
    };
    s.s3(&format!("s3.create_bucket(Bucket='{BUCKET}')"));
    s
}

impl Server {
    /// Run Python with `s3`, a boto3 client of this moto server.
    fn s3(&self, code: &str) {
        let prog = format!(
            "import boto3\ns3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{}', \
             region_name='us-east-1', aws_access_key_id='test', aws_secret_access_key='test')\n{code}\n",
            self.port
        );
        sh(Command::new(moto_python()).arg("-c").arg(prog));
    }
    fn put(&self, key: &str, file: &Path) {
        self.s3(&format!(
            "s3.upload_file('{}', '{BUCKET}', '{key}')",
            file.display()
        ));
    }
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// `ferofs` with the S3 environment of `moto` (or none) and no stray AWS settings.
fn cmd(s3: Option<&Server>) -> Command {
    let mut c = ferofs();
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    if let Some(m) = s3 {
        c.env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", m.endpoint());
    }
    c
}

fn output(mut c: Command, args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().expect("run ferofs")
}

fn good(c: Command, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (Vec<u8>, String) {
    let out = output(c, args);
    assert!(
        out.status.success(),
        "ferofs {:?} failed: {}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--fetch-stats` line: (bytes fetched, requests, disk-cache hits).
fn fetch_stats(stderr: &str) -> (u64, u64, u64) {
    let l = stderr
        .lines()
        .find(|l| l.contains(" bytes in ") && l.contains("fetched"))
        .unwrap_or_else(|| panic!("no --fetch-stats line in: {stderr}"));
    let nums: Vec<u64> = l
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    // "... 127.0.0.1:PORT/...: fetched B bytes in R requests; H blocks from ..."
    let n = nums.len();
    assert!(n >= 3, "{l}");
    (nums[n - 3], nums[n - 2], nums[n - 1])
}

/// What the tests need of make-tree's tree, made once per test process and kept in
/// memory (the tmpfs and the scratch directory are gone when `images` returns: a
/// static is never dropped): the tree's digest, a few of its files, the images.
struct Images {
    digest: String,
    files: BTreeMap<&'static str, Vec<u8>>,
    images: BTreeMap<&'static str, Vec<u8>>,
    /// `build --verity` of the tree (`-z none`): what it printed.
    verity_out: String,
}

const FILES: [&str; 5] = [
    "files/hundred-bytes.txt",
    "files/size-1024.txt",
    "files/size-4096.txt",
    "data/random-2MiB.bin",
    "files/size-65536.txt",
];

fn images() -> &'static Images {
    static I: OnceLock<Images> = OnceLock::new();
    I.get_or_init(|| {
        let (_fs, tree) = make_tree();
        let dir = scratch("remote-img");
        let mut images = BTreeMap::new();
        for (name, opts) in OPTIONS {
            let p = dir.path().join(name);
            build(&tree, &p, opts);
            images.insert(name, fs::read(&p).expect("read image"));
        }
        let v = dir.path().join(VERITY);
        let r = common::run(&[&"build", &"-q", &"-z", &"none", &"--verity", &tree, &v]);
        assert!(r.status.success(), "{r:?}");
        images.insert(VERITY, fs::read(&v).expect("read image"));
        Images {
            digest: digest(&tree),
            files: FILES
                .iter()
                .map(|f| (*f, fs::read(tree.join(f)).expect("read")))
                .collect(),
            images,
            verity_out: String::from_utf8_lossy(&r.stdout).into_owned(),
        }
    })
}

const VERITY: &str = "verity.erofs";

const OPTIONS: [(&str, &[&str]); 3] = [
    ("plain.erofs", &["-z", "none"]),
    ("lz4hc.erofs", &["-z", "lz4hc", "-C", "65536"]),
    (
        "zstd.erofs",
        &["-z", "zstd", "-C", "262144", "-E", "fragments,ztailpacking"],
    ),
];

impl Images {
    fn file(&self, path: &str) -> &[u8] {
        self.files.get(path).map_or(&[], |v| v)
    }
    /// The images, written into a scratch directory of the caller's.
    fn local(&self) -> Local {
        let dir = scratch("remote-img");
        for (name, b) in &self.images {
            fs::write(dir.path().join(name), b).expect("write image");
        }
        Local { dir }
    }
}

struct Local {
    dir: tempfile::TempDir,
}

impl Local {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// What ls, cat, stat, check and extract print for the local file and for `url`.
fn same_as_local(local: &Path, url: &str, s3: Option<&Server>, what: &str) {
    for args in [
        vec!["ls", "-a", "@", "/"],
        vec!["ls", "--json", "@", "/files"],
        vec!["cat", "@", "/files/size-65536.txt"],
        vec!["cat", "@", "/data/random-2MiB.bin"],
        vec!["stat", "--json", "@", "/data/random-2MiB.bin"],
        vec!["check", "@"],
        vec!["inspect", "--json", "@"],
        vec!["export", "@", "--tar", "-"],
    ] {
        let with = |img: &str| -> Vec<String> {
            args.iter()
                .map(|a| {
                    if *a == "@" {
                        img.to_string()
                    } else {
                        a.to_string()
                    }
                })
                .collect()
        };
        let l: Vec<String> = with(&local.to_string_lossy());
        let r: Vec<String> = with(url);
        let lo = output(cmd(None), &l.iter().map(|s| s as _).collect::<Vec<_>>());
        let ro = output(cmd(s3), &r.iter().map(|s| s as _).collect::<Vec<_>>());
        assert!(lo.status.success(), "{what} {l:?}");
        assert!(
            ro.status.success(),
            "{what} {r:?}: {}",
            String::from_utf8_lossy(&ro.stderr)
        );
        let (mut a, mut b) = (lo.stdout, ro.stdout);
        if args[0] == "inspect" {
            // The image's name is not part of what is compared.
            let strip = |v: &[u8]| {
                let mut j = json(&String::from_utf8_lossy(v));
                if let Some(o) = j.as_object_mut() {
                    o.remove("image");
                }
                j.to_string().into_bytes()
            };
            a = strip(&a);
            b = strip(&b);
        }
        assert!(
            a == b,
            "{what} {args:?}: output differs from the local file's"
        );
    }
    let out = scratch("remote-x");
    let x = out.path().join("x");
    good(cmd(s3), &[&"extract", &url, &x]);
    assert_eq!(digest(&x), images().digest, "{what}: extract of {url}");
    // diff of the file and the URL: equal (exit 0).
    good(cmd(s3), &[&"diff", &local, &url]);
}

#[test]
fn http_commands_match_local() {
    if !available("http_commands_match_local") {
        return;
    }
    let im = images().local();
    let ng = nginx();
    for (name, _) in OPTIONS {
        fs::copy(im.path(name), ng.www(name)).expect("copy");
        same_as_local(&im.path(name), &ng.http_url(name), None, name);
    }
}

#[test]
fn s3_commands_match_local() {
    if !available("s3_commands_match_local") {
        return;
    }
    let im = images().local();
    let m = moto();
    for (name, _) in OPTIONS {
        m.put(name, &im.path(name));
        same_as_local(
            &im.path(name),
            &format!("s3://{BUCKET}/{name}"),
            Some(&m),
            name,
        );
    }
    // --s3-endpoint instead of AWS_ENDPOINT_URL.
    let mut c = cmd(Some(&m));
    c.env_remove("AWS_ENDPOINT_URL");
    let (o, _) = good(
        c,
        &[
            &"--s3-endpoint",
            &m.endpoint(),
            &"cat",
            &format!("s3://{BUCKET}/plain.erofs"),
            &"/files/hundred-bytes.txt",
        ],
    );
    assert_eq!(o, images().file("files/hundred-bytes.txt"));
    // A key that is not there: a clear error, exit 1.
    let out = output(
        cmd(Some(&m)),
        &[&"ls", &format!("s3://{BUCKET}/missing.erofs")],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not found"), "{err}");
}

/// One `cat` of a small file fetches a small part of the image; a second run with
/// the same `--cache-dir` fetches nothing; a replaced object is fetched again.
fn small_cat_and_cache(
    url: &str,
    s3: Option<&Server>,
    log: Option<&Server>,
    image: &Path,
    block: &str,
) {
    let size = fs::metadata(image).expect("image").len();
    let want = images().file("files/size-4096.txt");
    let cache = scratch("remote-cache");
    let gets0 = log.map(|s| s.gets_after((0, 0), None));
    let (o, err) = good(
        cmd(s3),
        &[
            &"--fetch-stats",
            &"--fetch-block",
            &block,
            &"cat",
            &url,
            &"/files/size-4096.txt",
        ],
    );
    assert_eq!(o, want);
    let (bytes, reqs, _) = fetch_stats(&err);
    eprintln!(
        "one small cat ({block} blocks): {bytes} bytes in {reqs} requests of a {size}-byte image"
    );
    assert!(bytes > 0 && reqs > 0);
    assert!(
        bytes * 10 <= size,
        "one small cat fetched {bytes} bytes of a {size}-byte image"
    );
    if let (Some(s), Some((n0, b0))) = (log, gets0) {
        // The server's own count agrees.
        let (n1, b1) = s.gets_after((n0, b0), Some((reqs, bytes)));
        assert_eq!((n1 - n0, b1 - b0), (reqs, bytes), "nginx access log");
    }
    // Cached: the first run fills the cache, the second fetches nothing.
    let c = cache.path().to_string_lossy().into_owned();
    let args: [&dyn AsRef<std::ffi::OsStr>; 7] = [
        &"--cache-dir",
        &c,
        &"--fetch-stats",
        &"cat",
        &url,
        &"/data/random-2MiB.bin",
        &"--cache-size=64m",
    ];
    let want2 = images().file("data/random-2MiB.bin");
    let (o, err) = good(cmd(s3), &args);
    assert_eq!(o, want2);
    assert!(fetch_stats(&err).0 > 0, "{err}");
    let gets1 = log.map(|s| s.gets_after((0, 0), None));
    let (o, err) = good(cmd(s3), &args);
    assert_eq!(o, want2);
    let (b, r, hits) = fetch_stats(&err);
    assert_eq!((b, r), (0, 0), "second run with the cache fetched: {err}");
    assert!(hits > 0);
    if let Some(s) = log {
        assert_eq!(
            s.gets_after((0, 0), None),
            gets1.unwrap_or_default(),
            "GETs on the second run"
        );
    }
}

#[test]
fn http_small_cat_and_cache() {
    if !available("http_small_cat_and_cache") {
        return;
    }
    let im = images().local();
    let ng = nginx();
    // The zstd image is 5 MiB: finer blocks for it.
    for (name, block) in [("plain.erofs", "128k"), ("zstd.erofs", "16k")] {
        fs::copy(im.path(name), ng.www(name)).expect("copy");
        small_cat_and_cache(&ng.http_url(name), None, Some(&ng), &im.path(name), block);
    }
}

#[test]
fn s3_small_cat_and_cache() {
    if !available("s3_small_cat_and_cache") {
        return;
    }
    let im = images().local();
    let m = moto();
    for (name, block) in [("plain.erofs", "128k"), ("zstd.erofs", "16k")] {
        m.put(name, &im.path(name));
        small_cat_and_cache(
            &format!("s3://{BUCKET}/{name}"),
            Some(&m),
            None,
            &im.path(name),
            block,
        );
    }
}

/// A background `ferofs mount URL DIR`, unmounted on drop.
struct Fuse {
    dir: tempfile::TempDir,
}

impl Fuse {
    fn new(url: &str, s3: Option<&Server>, extra: &[&str]) -> Fuse {
        let dir = scratch("remote-fuse");
        let mut c = cmd(s3);
        c.args(extra).arg("mount").arg(url).arg(dir.path());
        let out = c.output().expect("ferofs mount");
        assert!(
            out.status.success(),
            "ferofs mount {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Fuse { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn mount_equals_kernel(url: &str, s3: Option<&Server>, image: &Path) {
    let k = Mount::erofs(image);
    let f = Fuse::new(url, s3, &[]);
    assert_eq!(
        digest(k.path()),
        digest(f.path()),
        "{url}: FUSE mount differs from the kernel's:\n{}",
        treecmp(k.path(), f.path())
    );
}

/// A file of the mount read after the object was replaced: EIO (not bytes of the new
/// object, not the old one's).
fn replaced_gives_eio(f: &Fuse, replace: &dyn Fn()) {
    // Read one file: the mount works.
    let first = fs::read(f.path().join("files/size-1024.txt")).expect("read before");
    assert_eq!(first, images().file("files/size-1024.txt"));
    // Opened (looked up) before, read after: its data was never fetched.
    let p = f.path().join("data/random-2MiB.bin");
    let file = fs::File::open(&p).expect("open");
    replace();
    let mut buf = vec![0u8; 4096];
    let e = file
        .read_exact_at(&mut buf, 2 * 1024 * 1024 - 4096)
        .expect_err("a read after the object was replaced must fail");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

/// A different image of the same size (the same tree with other mtimes and contents
/// would do; here: the image with one byte of file data flipped).
fn changed_copy(image: &Path, to: &Path) {
    let mut b = fs::read(image).expect("image");
    let n = b.len();
    // Somewhere in the middle (file data), and the last byte.
    b[n / 2] ^= 0xff;
    b[n - 1] ^= 0xff;
    fs::write(to, b).expect("write");
}

#[test]
fn http_mount() {
    if !available("http_mount") {
        return;
    }
    let im = images().local();
    let ng = nginx();
    for name in ["plain.erofs", "lz4hc.erofs"] {
        fs::copy(im.path(name), ng.www(name)).expect("copy");
        mount_equals_kernel(&ng.http_url(name), None, &im.path(name));
    }
    // Replaced under the mount (nginx's ETag is mtime and size: the new file gets
    // another mtime, as any real replacement would).
    let name = "plain.erofs";
    let f = Fuse::new(&ng.http_url(name), None, &["--fetch-block", "16k"]);
    let www = ng.www(name);
    replaced_gives_eio(&f, &|| {
        let tmp = www.with_extension("new");
        changed_copy(&im.path(name), &tmp);
        let later = fs::metadata(&www)
            .and_then(|m| m.modified())
            .expect("mtime")
            + Duration::from_secs(10);
        fs::File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(later))
            .expect("set mtime");
        fs::rename(&tmp, &www).expect("replace");
    });
}

#[test]
fn s3_mount() {
    if !available("s3_mount") {
        return;
    }
    let im = images().local();
    let m = moto();
    for name in ["plain.erofs", "zstd.erofs"] {
        m.put(name, &im.path(name));
        mount_equals_kernel(&format!("s3://{BUCKET}/{name}"), Some(&m), &im.path(name));
    }
    let name = "plain.erofs";
    let url = format!("s3://{BUCKET}/{name}");
    let f = Fuse::new(&url, Some(&m), &["--fetch-block", "16k"]);
    let scratchdir = scratch("remote-new");
    let tmp = scratchdir.path().join("new.erofs");
    replaced_gives_eio(&f, &|| {
        changed_copy(&im.path(name), &tmp);
        m.put(name, &tmp);
    });
}

/// The server goes away under a mount: a read that needs it fails with EIO within the
/// timeout; `cat` of a URL whose server accepts and never answers fails within it.
#[test]
fn server_gone_or_stalled_is_a_prompt_error() {
    if !available("server_gone_or_stalled_is_a_prompt_error") {
        return;
    }
    let im = images().local();
    let mut ng = nginx();
    let name = "plain.erofs";
    fs::copy(im.path(name), ng.www(name)).expect("copy");
    let f = Fuse::new(
        &ng.http_url(name),
        None,
        &["--timeout", "2", "--fetch-block", "16k"],
    );
    fs::read(f.path().join("files/hundred-bytes.txt")).expect("read while up");
    ng.stop();
    let t = Instant::now();
    // The lookup or the read needs the server (EIO from either).
    let mut buf = vec![0u8; 4096];
    let e = fs::File::open(f.path().join("data/random-2MiB.bin"))
        .and_then(|file| file.read_exact_at(&mut buf, 1 << 20))
        .expect_err("read with the server gone");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // --timeout 2: retries for 2 s, the last attempt up to 2 s more.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    eprintln!("server gone: EIO after {:?}", t.elapsed());
    drop(f);

    // Accepts connections, never answers.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let hold = std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().take(50) {
            match s {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
    });
    let t = Instant::now();
    let out = output(
        cmd(None),
        &[
            &"--timeout",
            &"1",
            &"cat",
            &format!("http://127.0.0.1:{port}/{name}"),
            &"/files/hundred-bytes.txt",
        ],
    );
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1"), "{err}");
    assert!(took < Duration::from_secs(8), "stalled server: {took:?}");
    drop(hold);
}

/// `--verity-root`: every fetched block is checked against the dm-verity tree. A byte
/// changed on the server in file data goes unseen without it (an uncompressed image
/// has no checksum of file data) and is an error with it; a wrong root hash fails at
/// open.
#[test]
fn http_verity_checks_fetched_blocks() {
    if !available("http_verity_checks_fetched_blocks") {
        return;
    }
    let ng = nginx();
    let img = ng.www("v.erofs");
    fs::write(&img, &images().images[VERITY]).expect("write");
    let out = &images().verity_out;
    let root = out
        .lines()
        .find_map(|l| l.strip_prefix("root hash "))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no root hash in:\n{out}"));
    let off: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("open with "))
        .and_then(|l| l.rsplit('=').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no hash offset in:\n{out}"));
    let url = ng.http_url("v.erofs");
    let (o, _) = good(cmd(None), &[&"--verity-root", &root, &"check", &url]);
    assert!(String::from_utf8_lossy(&o).starts_with("clean"));
    let (o, _) = good(
        cmd(None),
        &[
            &"--verity-root",
            &root,
            &"cat",
            &url,
            &"/files/size-4096.txt",
        ],
    );
    assert_eq!(o, images().file("files/size-4096.txt"));
    // A wrong root hash: refused at open.
    let mut wrong = root.clone().into_bytes();
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    let wrong = String::from_utf8(wrong).expect("hex");
    let e = output(cmd(None), &[&"--verity-root", &wrong, &"ls", &url]);
    assert_eq!(e.status.code(), Some(1));
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(err.contains("does not match the root hash"), "{err}");
    // One byte of file data changed on the server (in the middle of the data area).
    let f = fs::File::options()
        .read(true)
        .write(true)
        .open(&img)
        .expect("open");
    let at = off / 2;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x5a], at).expect("write");
    drop(f);
    let plain = output(cmd(None), &[&"check", &url]);
    assert_eq!(
        plain.status.code(),
        Some(0),
        "the changed byte should be in file data, unseen without verity"
    );
    let v = output(cmd(None), &[&"--verity-root", &root, &"check", &url]);
    assert_eq!(v.status.code(), Some(1), "{v:?}");
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(text.contains("does not match the hash tree"), "{text}");
}

/// `build --s3 BUCKET/PREFIX`: each object under the prefix a file at its key (0644,
/// the builder's ids, its last-modified time), directory markers (`KEY/`) directories
/// (0755), nothing outside the prefix; mkfs.erofs's `--s3=ENDPOINT,...` builds the same
/// bytes; a failure leaves neither an image nor the temporary tar.
#[test]
fn s3_bucket_builds_a_tree() {
    if !available("s3_bucket_builds_a_tree") {
        return;
    }
    let m = moto();
    // Over 1 MiB: streamed into the tar alone (the small ones come in batches).
    let blob = noise(1_500_000, 11);
    let d = scratch("s3-tree");
    std::fs::write(d.path().join("blob"), &blob).expect("write");
    m.s3(&format!(
        "for k, b in [('ds/a.txt', b'hello\\n'), ('ds/sub/', b''), ('ds/emptydir/', b''), \
         ('ds/sub/deeper/c', b'c'), ('dsx/outside', b'x'), ('ds/empty', b'')]:\n    \
         s3.put_object(Bucket='{BUCKET}', Key=k, Body=b)"
    ));
    m.put("ds/sub/blob.bin", &d.path().join("blob"));
    let out = d.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let img = out.join("s3.erofs");
    good(
        cmd(Some(&m)),
        &[
            &"build",
            &"-q",
            &"-z",
            &"none",
            &"--s3",
            &format!("{BUCKET}/ds"),
            &img,
        ],
    );
    let ls = |p: &str| -> String {
        let (o, _) = good(cmd(None), &[&"ls", &img, &p]);
        String::from_utf8_lossy(&o).into_owned()
    };
    let names = |p: &str| -> Vec<String> {
        ls(p)
            .lines()
            .filter_map(|l| l.split_whitespace().last().map(String::from))
            .collect()
    };
    assert_eq!(names("/"), ["ds"]);
    assert_eq!(names("/ds"), ["a.txt", "empty", "emptydir", "sub"]);
    assert_eq!(names("/ds/sub"), ["blob.bin", "deeper"]);
    let root_ls = ls("/ds");
    let uid = rustix::process::getuid().as_raw();
    for (name, mode) in [
        ("a.txt", "-rw-r--r--"),
        ("empty", "-rw-r--r--"),
        ("emptydir", "drwxr-xr-x"),
    ] {
        let line = root_ls
            .lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .expect("listed");
        assert!(line.starts_with(mode), "{line}");
        assert_eq!(
            line.split_whitespace().nth(2),
            Some(uid.to_string().as_str()),
            "{line}"
        );
    }
    let (cat, _) = good(cmd(None), &[&"cat", &img, &"/ds/sub/blob.bin"]);
    assert!(cat == blob, "blob.bin differs");
    let (cat, _) = good(cmd(None), &[&"cat", &img, &"/ds/a.txt"]);
    assert_eq!(cat, b"hello\n");
    // The mtime is the object's last-modified time: within the last hour.
    let (st, _) = good(cmd(None), &[&"stat", &"--json", &img, &"/ds/a.txt"]);
    let mtime = json(&String::from_utf8_lossy(&st))["mtime"]
        .as_i64()
        .expect("mtime");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(
        (now - 3600..=now + 60).contains(&mtime),
        "mtime {mtime}, now {now}"
    );
    fsck_erofs(&img).expect("fsck.erofs");
    // mkfs.erofs's command line: credentials from an s3fs password file.
    let pw = d.path().join("passwd");
    std::fs::write(&pw, "test:test\n").expect("write");
    std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let dropin = out.join("mkfs.erofs");
    let link = d.path().join("mkfs.erofs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferofs"), &link).expect("symlink");
    let mut c = cmd(None);
    c.env("AWS_REGION", "us-east-1");
    let o = Command::new(&link)
        .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .arg("--quiet")
        .arg(format!(
            "--s3={},urlstyle=path,passwd_file={}",
            m.endpoint(),
            pw.display()
        ))
        .arg(&dropin)
        .arg(format!("{BUCKET}/ds"))
        .output()
        .expect("mkfs.erofs --s3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&dropin).expect("read") == std::fs::read(&img).expect("read"));
    // A bucket that does not exist: an error naming it, nothing left behind.
    let bad = out.join("bad.erofs");
    let o = output(
        cmd(Some(&m)),
        &[&"build", &"-q", &"--s3", &"no-such-bucket/ds", &bad],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no-such-bucket"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(!bad.exists() && left.is_empty(), "{left:?}");
}

//! `ferofs build --oci REF`: an image pulled from a registry (a local one,
//! `oci_registry.py`, with Docker Hub's token flow and CDN redirects) builds the same
//! bytes as `--tar` of its layers; platform and layer selection, digest checks,
//! credentials; and mkfs.erofs's `--oci` through the drop-in.

mod common;
use common::*;
use ferofs_testkit::run as sh;
use ferofs_testkit::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Registry {
    child: Child,
    info: serde_json::Value,
}

impl Registry {
    fn start(dir: &Path, tag: &str, extra: &[&str]) -> Registry {
        let info = dir.join(format!("registry-{tag}.json"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oci_registry.py");
        let child = Command::new("python3")
            .arg(script)
            .arg("--info")
            .arg(&info)
            .args(["--name", "test/img", "--tag", tag])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("start oci_registry.py");
        let t = Instant::now();
        while !info.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "registry did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let info = json(&std::fs::read_to_string(&info).expect("registry info"));
        Registry { child, info }
    }
    fn reference(&self, tail: &str) -> String {
        format!("127.0.0.1:{}/test/img{tail}", self.info["port"])
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tar of `dir` (sorted, numeric owners), compressed by `comp` (`gzip -n`, `zstd -q`)
/// or not (`""`).
fn layer(dir: &Path, out: &Path, comp: &str) {
    let tar = out.with_extension("");
    sh(Command::new("tar")
        .args(["--format=posix", "--sort=name", "--numeric-owner", "-cf"])
        .arg(if comp.is_empty() { out } else { &tar })
        .arg("-C")
        .arg(dir)
        .arg("."));
    let _ = match comp {
        "" => String::new(),
        "gzip" => sh(Command::new("gzip").args(["-n", "-f"]).arg(&tar)),
        _ => sh(Command::new("zstd")
            .args(["-q", "-f", "--rm", "-o"])
            .arg(out)
            .arg(&tar)),
    };
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

/// Two layers: the second changes a file, deletes a directory (`.wh.d`) and makes
/// another opaque (`.wh..wh..opq`).
fn layers(d: &Path) -> (PathBuf, PathBuf) {
    let (a, b) = (d.join("l1"), d.join("l2"));
    write(&a, "etc/hostname", b"base\n");
    write(&a, "usr/bin/tool", &text_lines(20_000, 7));
    write(&a, "usr/share/doc/a", b"doc a\n");
    write(&a, "opt/d/x", b"x\n");
    std::os::unix::fs::symlink("../bin/tool", a.join("usr/share/tool")).expect("symlink");
    write(&b, "etc/hostname", b"top\n");
    write(&b, "usr/share/doc/.wh..wh..opq", b"");
    write(&b, "usr/share/doc/b", b"doc b\n");
    write(&b, "opt/.wh.d", b"");
    write(&b, "srv/new", &noise(70_000, 3));
    let (l1, l2) = (d.join("l1.tar.gz"), d.join("l2.tar.zst"));
    layer(&a, &l1, "gzip");
    layer(&b, &l2, "zstd");
    (l1, l2)
}

/// `ferofs build` with `args` then `img` (password in the environment when given).
fn build_with(args: &[&str], img: &Path, password: Option<&str>) -> std::process::Output {
    let mut c = ferofs();
    c.arg("build").args(args).arg(img);
    if let Some(p) = password {
        c.env("FEROFS_OCI_PASSWORD", p);
    }
    c.output().expect("run ferofs build")
}

fn built(args: &[&str], img: &Path, password: Option<&str>) -> Vec<u8> {
    let out = build_with(args, img, password);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(img).expect("read image")
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".ferofs"))
        .collect()
}

#[test]
fn oci_pull_builds_what_the_tar_stack_builds() {
    let d = scratch("oci");
    let (l1, l2) = layers(d.path());
    let (s1, s2) = (l1.to_str().expect("utf-8"), l2.to_str().expect("utf-8"));
    let reg = Registry::start(
        d.path(),
        "v1",
        &[
            "--layer",
            &format!("linux/amd64={s1}"),
            "--layer",
            &format!("linux/amd64={s2}"),
            "--layer",
            &format!("linux/arm64={s1}"),
            "--auth",
            "user:secret",
            "--redirect",
        ],
    );
    let z = ["-q", "-z", "lz4hc", "-E", "ztailpacking"];
    let out = d.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let want = |tars: &[&str], name: &str| {
        let mut a: Vec<&str> = z.to_vec();
        for t in tars {
            a.extend(["--tar", t]);
        }
        built(&a, &d.path().join(name), None)
    };
    let both = want(&[s1, s2], "both.erofs");
    let first = want(&[s1], "first.erofs");
    let second = want(&[s2], "second.erofs");
    let r = reg.reference(":v1");
    let oci = |extra: &[&str], name: &str| {
        let mut a: Vec<&str> = z.to_vec();
        a.extend(["--oci", &r, "--oci-insecure", "--oci-username", "user"]);
        a.extend(extra);
        built(&a, &out.join(name), Some("secret"))
    };
    assert!(oci(&["--oci-platform", "linux/amd64"], "amd64.erofs") == both);
    assert!(oci(&["--oci-platform", "linux/arm64"], "arm64.erofs") == first);
    assert!(
        oci(
            &["--oci-platform", "linux/amd64", "--oci-layer", "1"],
            "l1.erofs"
        ) == second
    );
    let blob = reg.info["layers"]["linux/amd64"][0]
        .as_str()
        .expect("layer digest")
        .to_string();
    assert!(
        oci(
            &["--oci-platform", "linux/amd64", "--oci-blob", &blob],
            "blob.erofs"
        ) == first
    );
    // By the manifest's digest (no index, no platform needed).
    let md = reg.info["manifests"]["linux/amd64"]
        .as_str()
        .expect("manifest digest")
        .to_string();
    let by_digest = reg.reference(&format!("@{md}"));
    let mut a: Vec<&str> = z.to_vec();
    a.extend([
        "--oci",
        &by_digest,
        "--oci-insecure",
        "--oci-username",
        "user",
    ]);
    assert!(built(&a, &out.join("digest.erofs"), Some("secret")) == both);
    // Credentials `docker login` stored (DOCKER_CONFIG), no --oci-username.
    let cfg = d.path().join("docker");
    std::fs::create_dir(&cfg).expect("mkdir");
    let port = &reg.info["port"];
    std::fs::write(
        cfg.join("config.json"),
        format!(r#"{{"auths": {{"127.0.0.1:{port}": {{"auth": "dXNlcjpzZWNyZXQ="}}}}}}"#),
    )
    .expect("write config.json");
    let img = out.join("stored.erofs");
    let o = ferofs()
        .arg("build")
        .args(z)
        .args([
            "--oci",
            &r,
            "--oci-insecure",
            "--oci-platform",
            "linux/amd64",
        ])
        .arg(&img)
        .env("DOCKER_CONFIG", &cfg)
        .env_remove("REGISTRY_AUTH_FILE")
        .output()
        .expect("build with stored credentials");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&img).expect("read") == both);
    // What the layers say, read back: the second layer's file, its whiteouts applied.
    let img = out.join("amd64.erofs");
    assert_eq!(ok(&[&"cat", &img, &"/etc/hostname"]), "top\n");
    assert_eq!(ok(&[&"cat", &img, &"/usr/share/doc/b"]), "doc b\n");
    let ls = ok(&[&"ls", &img, &"/usr/share/doc"]);
    assert!(!ls.contains(" a\n") && ls.contains(" b"), "{ls}");
    let ls = ok(&[&"ls", &img, &"/opt"]);
    assert!(!ls.contains(" d"), "{ls}");
    fsck_erofs(&img).expect("fsck.erofs");
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));

    // Failures: nothing written, nothing left behind, the cause named.
    let fails = |extra: &[&str], password: Option<&str>, want: &str| {
        let img = out.join("fail.erofs");
        let mut a: Vec<&str> = z.to_vec();
        a.extend(["--oci", &r, "--oci-insecure"]);
        a.extend(extra);
        let o = build_with(&a, &img, password);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{extra:?} succeeded");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!img.exists(), "{extra:?} left an image");
        assert!(
            leftovers(&out).is_empty(),
            "{extra:?}: {:?}",
            leftovers(&out)
        );
    };
    fails(&["--oci-username", "user"], Some("wrong"), "401");
    fails(&[], None, "401");
    fails(
        &["--oci-username", "user", "--oci-platform", "linux/s390x"],
        Some("secret"),
        "linux/amd64, linux/arm64",
    );
    fails(
        &["--oci-username", "user", "--oci-layer", "5"],
        Some("secret"),
        "layer 5",
    );
    let img = out.join("fail.erofs");
    let o = build_with(
        &[
            &z[..],
            &[
                "--oci",
                &reg.reference(":nope"),
                "--oci-insecure",
                "--oci-username",
                "user",
            ],
        ]
        .concat(),
        &img,
        Some("secret"),
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("404"), "{o:?}");
    drop(reg);

    // A registry that serves damaged layers: the digest check stops the build.
    let bad = Registry::start(
        d.path(),
        "v2",
        &["--layer", &format!("linux/amd64={s1}"), "--corrupt-blob"],
    );
    let img = out.join("bad.erofs");
    let o = build_with(
        &[
            "--oci",
            &bad.reference(":v2"),
            "--oci-insecure",
            "--oci-platform",
            "linux/amd64",
        ],
        &img,
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("content digest"),
        "{err}"
    );
    assert!(!img.exists());
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));

    // Images on disk: an OCI layout (layers read in place), a tar of one, and docker
    // save's archives (Docker 25's content-addressed layer paths, and the older
    // N/layer.tar).
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oci_registry.py");
    let fixture = |extra: &[&str]| {
        sh(Command::new("python3")
            .arg(&script)
            .args(["--name", "test/img", "--tag", "v9"])
            .args(["--layer", &format!("linux/amd64={s1}")])
            .args(["--layer", &format!("linux/amd64={s2}")])
            .args(["--layer", &format!("linux/arm64={s1}")])
            .args(extra));
    };
    let lay = d.path().join("layout");
    fixture(&["--layout", lay.to_str().expect("utf-8")]);
    let on_disk = |src: String, extra: &[&str], name: &str| {
        let mut a: Vec<&str> = z.to_vec();
        a.extend(["--oci", &src]);
        a.extend(extra);
        built(&a, &out.join(name), None)
    };
    let amd = ["--oci-platform", "linux/amd64"];
    assert!(on_disk(format!("oci:{}:v9", lay.display()), &amd, "lay.erofs") == both);
    assert!(
        on_disk(
            format!("oci:{}", lay.display()),
            &["--oci-platform", "linux/arm64"],
            "lay-arm.erofs"
        ) == first
    );
    let lay_tar = d.path().join("layout.tar");
    sh(Command::new("tar")
        .arg("-cf")
        .arg(&lay_tar)
        .arg("-C")
        .arg(&lay)
        .arg("."));
    assert!(
        on_disk(
            format!("oci-archive:{}:v9", lay_tar.display()),
            &amd,
            "oa.erofs"
        ) == both
    );
    for (name, extra) in [
        ("docker.tar", &[][..]),
        ("legacy.tar", &["--docker-legacy"][..]),
    ] {
        let f = d.path().join(name);
        let mut a = vec!["--docker-archive", f.to_str().expect("utf-8")];
        a.extend(extra);
        fixture(&a);
        assert!(
            on_disk(format!("docker-archive:{}", f.display()), &[], name) == both,
            "{name}"
        );
    }
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    // A damaged layer in the layout; a name the layout does not have.
    let blob_file = lay.join("blobs/sha256").join(&blob["sha256:".len()..]);
    let mut bytes = std::fs::read(&blob_file).expect("read blob");
    bytes[10] ^= 1;
    std::fs::write(&blob_file, &bytes).expect("write blob");
    for (src, want) in [
        (format!("oci:{}:v9", lay.display()), "content digest"),
        (
            format!("oci:{}:nope", lay.display()),
            "no image named \"nope\" (it has: v9)",
        ),
    ] {
        let img = out.join("fail.erofs");
        let o = build_with(&[&z[..], &["--oci", &src], &amd[..]].concat(), &img, None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{src}: {err}");
        assert!(!img.exists());
    }

    // mkfs.erofs's command line: `--oci[=f][,platform=...]` and the reference as SOURCE.
    // Its first two blob requests fail with 503 and its first manifest request with
    // 429: both are tried again.
    let good = Registry::start(
        d.path(),
        "v3",
        &[
            "--layer",
            &format!("linux/amd64={s1}"),
            "--layer",
            &format!("linux/amd64={s2}"),
            "--flaky",
            "2",
            "--flaky-manifests",
            "1",
        ],
    );
    let img = out.join("mkfs.erofs");
    mkfs_dropin(
        d.path(),
        &[
            &"-zlz4hc",
            &"-Eztailpacking",
            &"--quiet",
            &"--oci=f,platform=linux/amd64,insecure",
            &img,
            &good.reference(":v3"),
        ],
    );
    assert!(std::fs::read(&img).expect("read") == both);
    let o = Command::new(env!("CARGO_BIN_EXE_ferofs"))
        .args(["mkfs", "--oci=i,insecure"])
        .arg(out.join("i.erofs"))
        .arg(good.reference(":v3"))
        .output()
        .expect("mkfs --oci=i");
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--oci=i"),
        "{o:?}"
    );
}

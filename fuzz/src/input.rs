//! The build inputs that parse untrusted archives: tar streams, SquashFS images and
//! EROFS images (re-encoded).
//! Any bytes are written to a file and built into an image with default options (no
//! compression, one thread). A build may fail with an error, never panic, hang or
//! allocate without bound; a build that succeeds must give an image the reader opens
//! and walks; an EROFS image is also merged with itself by reference, and takes a small
//! layer in place (an image the reader walks, or the file as it was). A tar is built twice: read in place, and gzipped (read as a stream, its
//! file contents spooled); both must fail, or give the same image; and as a headerball
//! (headers only: an error, or an image the reader walks). Every input is also built with
//! its files' space reserved (an error, or an image whose block map points inside it,
//! and for a plain tar inside the tar).

use ferofs_builder::{BuildOptions, TarInput};

/// Which parser gets the bytes.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tar,
    Squashfs,
    Erofs,
}

pub fn run(kind: Kind, data: &[u8]) {
    let dir = crate::scratch_dir("ferofs-fuzz-in-");
    let input = dir.path().join("input");
    let out = dir.path().join("out.erofs");
    std::fs::write(&input, data).expect("write input");
    let opts = BuildOptions {
        threads: 1,
        ..BuildOptions::default()
    };
    let r = match kind {
        Kind::Tar => ferofs_builder::build_from_tars(&[TarInput::File(input.clone())], &out, &opts),
        Kind::Squashfs => ferofs_builder::build_from_squashfs(&input, &out, &opts),
        Kind::Erofs => ferofs_builder::build_from_erofs(&input, &out, &opts),
    };
    let streamed = match kind {
        Kind::Tar => {
            let gz = dir.path().join("input.gz");
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut e, data).expect("gzip");
            std::fs::write(&gz, e.finish().expect("gzip")).expect("write input.gz");
            let out2 = dir.path().join("streamed.erofs");
            let r2 = ferofs_builder::build_from_tars(&[TarInput::File(gz)], &out2, &opts);
            // Bytes that are a compressed stream themselves are decompressed in place,
            // and only gunzipped once streamed: then the two differ by design.
            let plain = ferofs_builder::tarball::stream_compression(data) == "none";
            if plain {
                assert_eq!(
                    r.is_ok(),
                    r2.is_ok(),
                    "in place: {:?}; streamed: {:?}",
                    r.as_ref().err(),
                    r2.as_ref().err()
                );
            }
            // The same bytes as a headerball (no data behind file headers): an error
            // and no output, or an image the reader walks.
            let hb = dir.path().join("headerball.erofs");
            let o3 = BuildOptions {
                tar_headerball: true,
                ..opts.clone()
            };
            match ferofs_builder::build_from_tars(&[TarInput::File(input.clone())], &hb, &o3) {
                Ok(_) => {
                    let b = std::fs::read(&hb).expect("read headerball image");
                    let len = b.len() as u64;
                    let img = ferofs_reader::Image::new(b).expect("the reader opens it");
                    crate::walk_all(&img, len);
                }
                Err(_) => assert!(!hb.exists(), "a failed build left its output behind"),
            }
            // With the data's space reserved (offsets are in the decompressed stream).
            reserved(&dir, &opts, plain.then_some(data.len() as u64), |o, out| {
                ferofs_builder::build_from_tars(&[TarInput::File(input.clone())], out, o)
            });
            (plain && r2.is_ok()).then(|| std::fs::read(&out2).expect("read streamed image"))
        }
        Kind::Erofs => {
            // Reserved: sizes come from the hostile image, unchecked by reading data.
            reserved(&dir, &opts, None, |o, out| {
                ferofs_builder::build_from_erofs(&input, out, o)
            });
            // The image merged with itself, by reference (the merge and the check of
            // which files lie in one piece see the hostile image too): an error and no
            // output, or an image the reader opens.
            let merged = dir.path().join("merged.erofs");
            let layers = [input.clone(), input.clone()];
            match ferofs_builder::build_from_images(&layers, &merged, &opts, true) {
                Ok(_) => {
                    let m = std::fs::read(&merged).expect("read merged image");
                    ferofs_reader::Image::new(m).expect("the reader opens a merged image");
                }
                Err(_) => assert!(!merged.exists(), "a failed merge left its output behind"),
            }
            // A small layer appended to (a copy of) the image in place: the walk, the
            // ".." and link-count patches see the hostile image. An image the reader
            // opens, or the file as it was.
            let appended = dir.path().join("appended.erofs");
            std::fs::write(&appended, data).expect("write copy");
            let layer = dir.path().join("layer");
            std::fs::create_dir_all(layer.join("d")).expect("mkdir layer");
            std::fs::write(layer.join("d/f"), b"appended").expect("write layer");
            let o2 = BuildOptions {
                compression: None,
                ..opts.clone()
            };
            match ferofs_builder::append_onto(&appended, ferofs_builder::Layer::Dir(&layer), &o2) {
                Ok(ferofs_builder::Appended::Done(_)) => {
                    let a = std::fs::read(&appended).expect("read appended image");
                    let len = a.len() as u64;
                    let img =
                        ferofs_reader::Image::new(a).expect("the reader opens an appended image");
                    crate::walk_all(&img, len);
                }
                _ => assert!(
                    std::fs::read(&appended).expect("read copy") == data,
                    "a failed append changed the image"
                ),
            }
            None
        }
        Kind::Squashfs => {
            reserved(&dir, &opts, None, |o, out| {
                ferofs_builder::build_from_squashfs(&input, out, o)
            });
            None
        }
    };
    if r.is_err() {
        assert!(!out.exists(), "a failed build left its output behind");
        return;
    }
    let image = std::fs::read(&out).expect("read image");
    if let Some(s) = streamed {
        assert!(s == image, "the streamed tar gave another image");
    }
    let len = image.len() as u64;
    let img = ferofs_reader::Image::new(image).expect("the reader opens a built image");
    crate::walk_all(&img, len);
}

/// A build with the files' space reserved (`--reserve-data --block-map`): an error and
/// no output, or an image the reader walks whose block map points inside it (and, with
/// `source_len`, inside the source).
fn reserved<T>(
    dir: &tempfile::TempDir,
    opts: &BuildOptions,
    source_len: Option<u64>,
    build: impl Fn(&BuildOptions, &std::path::Path) -> Result<T, ferofs_builder::BuildError>,
) {
    let rv = dir.path().join("reserved.erofs");
    let map = dir.path().join("reserved.map");
    let o = BuildOptions {
        reserve_data: true,
        block_map: Some(map.clone()),
        ..opts.clone()
    };
    match build(&o, &rv) {
        Ok(_) => {
            // Read through the file: the reserved blocks are holes, and a hostile
            // image's sizes make a large (sparse) image.
            let len = std::fs::metadata(&rv).expect("stat reserved image").len();
            let text = std::fs::read_to_string(&map).expect("read block map");
            for l in text.lines() {
                let f: Vec<&str> = l.split_whitespace().collect();
                let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
                let (blk, n, at) = (hex(f[0]), hex(f[1]), hex(f[2]));
                let zeroed: u64 = f.get(3).map_or(0, |z| z.parse().expect("decimal"));
                let end = blk.checked_add(n).and_then(|e| e.checked_mul(4096));
                assert!(end.is_some_and(|e| e <= len), "{l}: beyond the image");
                if let Some(s) = source_len {
                    let end = n
                        .checked_mul(4096)
                        .and_then(|d| d.checked_sub(zeroed))
                        .and_then(|d| d.checked_add(at));
                    assert!(end.is_some_and(|e| e <= s), "{l}: beyond the source");
                }
            }
            let img = ferofs_reader::Image::open(&rv).expect("the reader opens it");
            crate::walk_all(&img, len);
        }
        Err(_) => assert!(
            !rv.exists() && !map.exists(),
            "a failed build left its output behind"
        ),
    }
    let _ = std::fs::remove_file(&rv);
}

//! The build inputs that parse untrusted archives: tar streams and SquashFS images.
//! Any bytes are written to a file and built into an image with default options (no
//! compression, one thread). A build may fail with an error, never panic, hang or
//! allocate without bound; a build that succeeds must give an image the reader opens
//! and walks.

use ferofs_builder::{BuildOptions, TarInput};

/// Which parser gets the bytes.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tar,
    Squashfs,
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
        Kind::Tar => ferofs_builder::build_from_tars(&[TarInput::File(input)], &out, &opts),
        Kind::Squashfs => ferofs_builder::build_from_squashfs(&input, &out, &opts),
    };
    if r.is_err() {
        assert!(!out.exists(), "a failed build left its output behind");
        return;
    }
    let image = std::fs::read(&out).expect("read image");
    let len = image.len() as u64;
    let img = ferofs_reader::Image::new(image).expect("the reader opens a built image");
    crate::walk_all(&img, len);
}

//! `ferofs extract` of images made by mkfs.erofs 1.9.3 yields exactly what the kernel
//! shows when it mounts the same image (same make-tree digest).

mod common;
use common::*;
use ferofs_testkit::{digest, golden, kernel_available, treecmp, Mount, Tmpfs};

fn extract_equals_kernel(name: &str) {
    if !kernel_available(name) {
        return;
    }
    let img = golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"));
    let fs = Tmpfs::new("1G");
    let x = fs.path().join("x");
    ok(&[&"extract", &img, &x]);
    let m = Mount::erofs(&img);
    let (a, b) = (digest(m.path()), digest(&x));
    assert_eq!(
        a,
        b,
        "{name}: extract differs from the kernel mount:\n{}",
        treecmp(m.path(), &x)
    );
    ok(&[&"check", &img]);
}

macro_rules! golden_extract {
    ($($f:ident => $n:expr),* $(,)?) => { $( #[test] fn $f() { extract_equals_kernel($n); } )* };
}

golden_extract! {
    plain => "plain",
    plain_noinline => "plain-noinline",
    plain_extended => "plain-extended",
    plain_b1024 => "plain-b1024",
    plain_b512 => "plain-b512",
    plain_chunk64k => "plain-chunk64k",
    plain_chunk64k_indexes => "plain-chunk64k-indexes",
    plain_dot_omitted => "plain-dot-omitted",
    plain_48bit => "plain-48bit",
    plain_xattr_prefix => "plain-xattr-prefix",
    plain_metabox => "plain-metabox",
}

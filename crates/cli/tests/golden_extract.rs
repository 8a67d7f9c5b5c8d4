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
    lz4hc => "lz4hc",
    lz4_c64k_tpfd => "lz4-C64k-tpfd",
    lzma_c64k_tpfd => "lzma-C64k-tpfd",
    deflate_c64k_tpfd => "deflate-C64k-tpfd",
    zstd_c64k_tpfd => "zstd-C64k-tpfd",
    lz4hc_all_fragments => "lz4hc-all-fragments",
    lz4hc_zd => "lz4hc-zD",
    lz4hc_metabox => "lz4hc-metabox",
    lz4hc_48bit_c64k => "lz4hc-48bit-C64k",
    lz4hc_xattr_prefix_packed => "lz4hc-xattr-prefix-packed",
    lz4hc_lzma => "lz4hc-lzma",
}

//! Two small images made by mkfs.erofs 1.9.3 that the reader once misread, found by
//! `scripts/soak --mkfs-share`. The kernel (6.18) reads both exactly as the tree they
//! were built from; the reader must too. Made from a tree of 45 files (random bytes
//! from Python's `random.Random(7)`, numbered text lines, 40 tiny files, two equal
//! files), all mtimes 1600000000:
//!
//! - `mkfs-lzma-recs4-fragments-metabox.erofs`: `mkfs.erofs -zlzma
//!   -Enoinline_data,fragments -m4096 --all-root -T1600000000 --workers=1`. Encoded
//!   extents with 4-byte records, whose last record names a fragment: its plen is the
//!   fragment offset (the reader took it for a pcluster: "encoded extent beyond the
//!   image").
//! - `mkfs-zstd-48bit-interlaced.erofs`: `mkfs.erofs -zzstd
//!   -E48bit,ztailpacking,fragments,dedupe --all-root -T1600000000 --workers=1`.
//!   Uncompressed pclusters of an inode with the interlaced flag whose length is not a
//!   whole number of blocks: the kernel takes them as interlaced when they start on a
//!   block (the reader required a whole number of blocks too, and read them shifted).
//!
//! And one the kernel misreads (so the reader must not follow it):
//!
//! - `mkfs-lzma-metabox-inline-and-shared-xattrs.erofs` (`fuzz/seeds/mkfs-images/make.sh`:
//!   `mkfs.erofs -b512 -zlzma -m512 -Efragments`): `/a.txt` has three inline xattrs
//!   and one shared (`security.selinux`, id 40, which `/b.bin` shares). Linux 6.18
//!   lists only the three inline ones: it reads the shared entry through the metabox
//!   page its inline entries left in its buffer. erofsfuse 1.9.3 lists all four, as
//!   the format says.

use ferofs_reader::Image;
use sha2::{Digest, Sha256};
use std::path::Path;

/// (path, sha256 of the contents) of every regular file of the tree.
const FILES: [(&str, &str); 45] = [
    (
        "/d/copy-a",
        "5860073091d8491c482f33cdc4b081ab62c8198665a8745ad4c72a1733bd3209",
    ),
    (
        "/d/copy-b",
        "5860073091d8491c482f33cdc4b081ab62c8198665a8745ad4c72a1733bd3209",
    ),
    (
        "/d/small-0",
        "9a271f2a916b0b6ee6cecb2426f0b3206ef074578be55d9bc94f6f3fe3ab86aa",
    ),
    (
        "/d/small-1",
        "ad0fadf63cc7cd779ce475e345bf4063565b63a3c2efef1eebc89790aaa6acba",
    ),
    (
        "/d/small-10",
        "917df3320d778ddbaa5c5c7742bc4046bf803c36ed2b050f30844ed206783469",
    ),
    (
        "/d/small-11",
        "85796d03773c73e923df38859dbedc4d219f734a2888e47d601d25cd6131a849",
    ),
    (
        "/d/small-12",
        "10835c0c709d1eaee263da1b472aac68776a7e0813a72c859a003839f1cc2e7e",
    ),
    (
        "/d/small-13",
        "671b41570f9f76885066133c96713a9cb926f9844b437817635560830cbcd4a2",
    ),
    (
        "/d/small-14",
        "bf076b5546c8b47bcd48c9d9ffe4e4e20c061030e72ae4a8235e8fc97ed5a1b3",
    ),
    (
        "/d/small-15",
        "238903180cc104ec2c5d8b3f20c5bc61b389ec0a967df8cc208cdc7cd454174f",
    ),
    (
        "/d/small-16",
        "b78a8fa258aecc2e108a37b2a3ada33c924544e96abcf587e6e913ea875a0d20",
    ),
    (
        "/d/small-17",
        "ec08944e58d0364914b1b2fe05c1542473646ac61afb155537a2d15fcc21057f",
    ),
    (
        "/d/small-18",
        "7b9cbef723f0932d778e50d63360201e397e1ab0a3549207c5507d73b7cb6da7",
    ),
    (
        "/d/small-19",
        "5b6889a9ac9595f444bc25c294d0da4f01e82fe4809c432f02f5eb8ad48fed1b",
    ),
    (
        "/d/small-2",
        "579df6754926501d51d60a23a65d15dacc5cfa485e604a2a5252243f8e8d1022",
    ),
    (
        "/d/small-20",
        "5378796307535df3ec8d8b15a2e2dc5641419c3d3060cfe32238c0fa973f7aa3",
    ),
    (
        "/d/small-21",
        "b59bec8d58c80efc3eefb4edb3c993b8919a270f89bca975afa04459a014357c",
    ),
    (
        "/d/small-22",
        "4ec7d8e9cf48c8df1af18cd7d42bedd87206296b1209b741fca4683bcf121305",
    ),
    (
        "/d/small-23",
        "eaadeb8af6b30987cf2a6c2242b02b448a6655434ddf5a623340f8858cb275e3",
    ),
    (
        "/d/small-24",
        "b86a5c9b9b20be002b1a52fc9f11fd1369e85e1612128b47dd37800f3b5535b5",
    ),
    (
        "/d/small-25",
        "64aeb9975f234becd55bb4635e6e2f2da7a6b7bf0a896f0c07763bdfbfb31420",
    ),
    (
        "/d/small-26",
        "63e824954e140e6f2350ac1930cc7ae4d803c443c5aa7be06066846d13d62da3",
    ),
    (
        "/d/small-27",
        "e8e222afca8399267c238e5391646cae58a9ec5f72efe370f66affe089a2836d",
    ),
    (
        "/d/small-28",
        "12f2e42146204cdb1e977bae28868bc7433c87886c48cdf3990fa83edc4b7610",
    ),
    (
        "/d/small-29",
        "9729c2b034d15d8b67ab559200242a0fd4ee34c7e89e458378e952ed0a8483bf",
    ),
    (
        "/d/small-3",
        "ad4a66c2e2d2cbe1b9378f156751f1ccae954bbef62d117ab9ad595e76c9b020",
    ),
    (
        "/d/small-30",
        "f4ccd05b3271c386ee55d9876c7450012a3b361e5065c09dc22075e38b3cc35c",
    ),
    (
        "/d/small-31",
        "ceda3bddd3aee19cac2039cc5c8a3ea2450790b386a5ea4d513643953b4d64c7",
    ),
    (
        "/d/small-32",
        "70d5666f6b0bad1265c7e08d1e3a647f2141ca227cc970c471e465b18e47ffee",
    ),
    (
        "/d/small-33",
        "c3447a2828f0e70acab7a940f678fcf3ae8e6cad987a16d77337b918749b45c4",
    ),
    (
        "/d/small-34",
        "83cd191af24e83f968124f7d76446d7e2e4b4acf0e46dd63f56d501d4ed14722",
    ),
    (
        "/d/small-35",
        "90d7ec0f0acef104d8b6252794295f661a0149634868d02a1ae0c358099638f5",
    ),
    (
        "/d/small-36",
        "6312b28df42c363dfe2ae75c1beaa680ba1370024fb00640833430ae266b2ee2",
    ),
    (
        "/d/small-37",
        "d864fa120ef80f4684d71e4cec3c3765108198bc7e8280065eb33247ed9e6f79",
    ),
    (
        "/d/small-38",
        "535ae343b0152f79af59413c1e2810ea2ea7c843bb0414da73a051f8d67a1a63",
    ),
    (
        "/d/small-39",
        "4e15d431f062a612145bdc314a4afbc8a4daf98e64b33b8d9ba8aabcb7b645df",
    ),
    (
        "/d/small-4",
        "281ab584adf0d7e6902a8418ac150c3c2b7f756a379b0c6afbb449db083e2f86",
    ),
    (
        "/d/small-5",
        "f0b5c2c2211c8d67ed15e75e656c7862d086e9245420892a7de62cd9ec582a06",
    ),
    (
        "/d/small-6",
        "3275c31dd99be467469cb4b2308e6cdf1d88173b34e1f729620be77ee34993c5",
    ),
    (
        "/d/small-7",
        "1e74477de3d0600fa17d558d72961f665cceda1f2eae1d9e96098dadb88ea03d",
    ),
    (
        "/d/small-8",
        "42fa296b6f980baf2ebc16a7578b6b5db6304f5c900fa7ae203ef2e871dcdd86",
    ),
    (
        "/d/small-9",
        "718ed1daa96a399da8603f3eeab814faa06e61543771c6574dffb8b9e59ab934",
    ),
    (
        "/random-4097.bin",
        "ba2f899776cd2c41bc7916ef4f05fb6b19516409db0662d22aee3d767beec2d6",
    ),
    (
        "/random-9000.bin",
        "69332857856043feb32d2a45c173bce2714d198e0dfb9bcb5ffbd1da7aff55cc",
    ),
    (
        "/text-30000.txt",
        "ca9f4e57e41c03b3c1d4a6ad6186bb77e865da3e4d3d1d441f8f242f1c3eb25c",
    ),
];

fn check(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let img = Image::open(&path).unwrap_or_else(|e| panic!("{name}: open: {e}"));
    for (p, want) in FILES {
        let ino = img
            .lookup(p.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: lookup {p}: {e}"));
        let data = img
            .read_to_vec(&ino)
            .unwrap_or_else(|e| panic!("{name}: read {p}: {e}"));
        let got: String = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want, "{name}: {p} ({} bytes)", data.len());
    }
}

#[test]
fn fragment_named_by_a_four_byte_record() {
    check("mkfs-lzma-recs4-fragments-metabox.erofs");
}

#[test]
fn interlaced_plain_pclusters_of_any_length() {
    check("mkfs-zstd-48bit-interlaced.erofs");
}

#[test]
fn shared_xattr_of_a_metabox_inode_with_inline_ones() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/mkfs-lzma-metabox-inline-and-shared-xattrs.erofs");
    let img = Image::open(&path).expect("open");
    let selinux = (
        b"security.selinux".to_vec(),
        b"system_u:object_r:etc_t:s0".to_vec(),
    );
    for p in ["/a.txt", "/hard"] {
        let ino = img.lookup(p.as_bytes()).expect("lookup");
        assert_eq!(img.xattr_shared_ids(&ino).expect("ids"), [40], "{p}");
        let got: Vec<(Vec<u8>, Vec<u8>)> = img
            .xattrs(&ino)
            .expect("xattrs")
            .into_iter()
            .map(|x| (x.name, x.value))
            .collect();
        let want = vec![
            (b"trusted.t".to_vec(), b"1".to_vec()),
            (b"user.k".to_vec(), b"v".to_vec()),
            (b"user.long".to_vec(), vec![b'y'; 200]),
            selinux.clone(),
        ];
        assert_eq!(got, want, "{p}");
        assert_eq!(
            img.get_xattr(&ino, b"security.selinux").expect("get"),
            Some(selinux.1.clone()),
            "{p}"
        );
    }
    let ino = img.lookup(b"/b.bin").expect("lookup");
    let got: Vec<Vec<u8>> = img
        .xattrs(&ino)
        .expect("xattrs")
        .into_iter()
        .map(|x| x.name)
        .collect();
    assert_eq!(got, [selinux.0]);
}

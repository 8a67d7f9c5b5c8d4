#!/usr/bin/env bash
# Remake the seed images of this folder: a small tree with every kind of entry (text,
# random bytes, a hole, duplicates, hardlinks, symlinks, a FIFO, a device, xattrs with
# shared and inline entries, ACLs) built by mkfs.erofs 1.9.3 at the layouts ferofs's
# builder never writes (legacy and chunk indexes, --zD, --MZ, plain xattr prefixes,
# inode digests, random pcluster sizes and algorithms, ...) and at small block sizes.
# scripts/fuzz-smoke unpacks them into the image_walk seeds. Needs root (mknod,
# trusted.* xattrs), setfattr/setfacl, zstd, MKFS (erofs-utils 1.9.3's mkfs.erofs) and,
# for the two random-* images, MKFS_DEBUG (the same built with --enable-debug).
#
#   MKFS=... MKFS_DEBUG=... fuzz/seeds/mkfs-images/make.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
MKFS=${MKFS:-/work/anchors/erofs-utils/bin/mkfs.erofs}
MKFS_DEBUG=${MKFS_DEBUG:-/work/anchors-debug/erofs-utils/bin/mkfs.erofs}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tree=$work/tree
mkdir "$tree"
python3 - "$tree" <<'PY'
import os, random, shutil, sys
os.chdir(sys.argv[1])
r = random.Random(7)
words = ["".join(r.choice("abcdefghij") for _ in range(r.randint(2, 8))) for _ in range(200)]
def text(n):
    return " ".join(r.choice(words) for _ in range(n)).encode()[:n]
open("a.txt", "wb").write(text(3000))
open("b.bin", "wb").write(bytes(r.getrandbits(8) for _ in range(1200)))
os.makedirs("d")
for i in range(20):
    open(f"d/entry-with-a-long-name-{i:03d}", "wb").write(text(10 + i * 5))
open("d/dup1", "wb").write(text(1500))
shutil.copy("d/dup1", "d/dup2")
shutil.copy("a.txt", "a-copy.txt")
open("empty", "wb").close()
os.link("a.txt", "hard")
os.symlink("a.txt", "sym")
os.symlink("x" * 300, "longsym")
os.mkfifo("fifo")
os.mknod("chr", 0o20644, os.makedev(1, 3))
with open("sparse", "wb") as f:
    f.write(text(1500)); f.seek(12000); f.write(text(1500)); f.seek(16000); f.truncate()
open("mixed", "wb").write(b"".join(
    text(600) if i % 2 else bytes(r.getrandbits(8) for _ in range(600)) for i in range(8)))
for n, v in [("user.k", "v"), ("user.long", "y" * 200), ("trusted.t", "1"),
             ("security.selinux", "system_u:object_r:etc_t:s0")]:
    os.setxattr("a.txt", n, v.encode())
os.setxattr("d", "user.dir", b"x")
os.setxattr("b.bin", "security.selinux", b"system_u:object_r:etc_t:s0")
os.setxattr("mixed", "trusted.overlay.opaque", b"y")
PY
setfacl -m u:1000:rwx "$tree/mixed"
setfacl -d -m g:100:rx "$tree/d"
chown 1000:100 "$tree/d/dup1"
find "$tree" -exec touch -h -d @1700000000 {} +

fixed=(--quiet -T0 --mkfs-time -U e7f0f5e1-0f5e-4e70-8f5e-1e7f0f5e1e70)
rm -f "$here"/*.erofs.zst
mk() { # NAME MKFS OPTIONS...
  local name=$1 tool=$2
  shift 2
  "$tool" "${fixed[@]}" "$@" "$work/$name.erofs" "$tree"
  zstd -q -19 "$work/$name.erofs" -o "$here/$name.erofs.zst"
}
mk mkfs-b512_zlz4hc_Eztailpacking "$MKFS" -b512 -zlz4hc -Eztailpacking
mk mkfs-b512_zlz4_C4096_Efragments,dedupe "$MKFS" -b512 -zlz4 -C4096 -Efragments,dedupe
mk mkfs-b1024_zlzma_C8192_Eall_fragments "$MKFS" -b1024 -zlzma -C8192 -Eall-fragments
mk mkfs-b512_zdeflate,level=6_Eztailpacking,fragments "$MKFS" -b512 -zdeflate,level=6 -Eztailpacking,fragments
mk mkfs-b512_zzstd_C16384_Ededupe,ztailpacking "$MKFS" -b512 -zzstd -C16384 -Ededupe,ztailpacking
mk mkfs-b1024_zlz4hc_Elegacy_compress "$MKFS" -b1024 -zlz4hc -Elegacy-compress
mk mkfs-b512_zlz4hc_C2048_E48bit,ztailpacking "$MKFS" -b512 -zlz4hc -C2048 -E48bit,ztailpacking
mk mkfs-b512_zlzma_m512_Efragments "$MKFS" -b512 -zlzma -m512 -Efragments
mk mkfs-b512_chunksize=1024_Eforce_chunk_indexes "$MKFS" -b512 --chunksize=1024 -Eforce-chunk-indexes
mk mkfs-b512_chunksize=2048 "$MKFS" -b512 --chunksize=2048
mk mkfs-b512_Eforce_inode_blockmap,force_inode_extended "$MKFS" -b512 -Eforce-inode-blockmap,force-inode-extended
mk mkfs-b512_zlz4hc_zD "$MKFS" -b512 -zlz4hc --zD
mk mkfs-b512_zlz4_MZ "$MKFS" -b512 -zlz4 --MZ
mk mkfs-b512_zlz4hc_xattr_prefix=trusted_overlay_Eplain_xattr_prefix "$MKFS" -b512 -zlz4hc --xattr-prefix=trusted.overlay. -Eplain-xattr-prefixes,xattr-name-filter
mk mkfs-b512_zlz4hc_zstd_C8192_Eztailpacking,fragments_max_extent_by "$MKFS" -b512 -zlz4hc:zstd -C8192 -Eztailpacking,fragments --max-extent-bytes=4096
mk mkfs-b1024_E48bit,dot_omitted,noinline_data "$MKFS" -b1024 -E48bit,dot-omitted,noinline_data
mk mkfs-b512_zlz4hc_Eforce_inode_compact_xattr_inode_digest "$MKFS" -b512 -zlz4hc -Eforce-inode-compact --xattr-inode-digest
# Random pcluster sizes (and algorithms) differ run by run: these two are one draw.
mk mkfs-b512_random_pclusters_algorithms_tail "$MKFS_DEBUG" --random-pclusterblks --random-algorithms -zlz4hc:lzma:deflate:zstd -C8192 -b512 -Eztailpacking
mk mkfs-b1024_random_pclusters_lz4_fragments "$MKFS_DEBUG" --random-pclusterblks -zlz4 -C16384 -b1024 -Efragments,dedupe
ls "$here"/*.erofs.zst | wc -l

//! Stage 3, data placement: every regular file's contents go to the data region, from
//! the first block after block 0, in inode order — compressed by [`zdata`] or copied by
//! [`crate::data`] — and each file gets its [`Layout`]. This is the only stage that reads file
//! contents; the output depends on nothing but the tree, the plan and the options.
//!
//! With `-E dedupe`, files with the same contents ([`crate::dedupe`]) are stored once
//! and share that data. With fragments, tails and small files go to the packed inode
//! ([`crate::frag`]), whose data is compressed last, behind every file's.

use crate::data::DataWriter;
use crate::dedupe;
use crate::frag::FragStore;
use crate::layout::Layout;
use crate::options::*;
use crate::out::Out;
use crate::plan::Plan;
use crate::scan::{Kind, Tree};
use crate::source::Source;
use crate::zdata::{self, FragMode};

/// Where the data went.
pub struct Placed {
    /// Per inode: the regular file's layout; [`Layout::NONE`] for every other inode.
    pub layouts: Vec<Layout>,
    /// First block after the data region.
    pub end_blk: u64,
    /// Regular-file bytes read.
    pub bytes_in: u64,
    /// Bytes handed to a compressor.
    pub compressor_input: u64,
    /// File bytes not stored again (duplicates of other files or fragments).
    pub dedupe_saved: u64,
    /// The packed inode's data (`Some` when some file has a fragment).
    pub packed: Option<crate::frag::Packed>,
    /// Fragment bytes handed in.
    pub fragment_bytes: u64,
    /// A lower bound of what the fragments would take without the packed inode: a
    /// block each, or the file's size when it is shorter and its data could go inline.
    pub fragment_alt: u64,
    /// See [`BuildReport::warnings`].
    pub warnings: Vec<String>,
    /// `--blobdev`: the blob being written and its length in blocks.
    pub blob: Option<(Out, u64)>,
    /// `--reserve-data`: the reserved files, in block order.
    pub reserved: Vec<Reserved>,
}

/// The blocks reserved for a file's data (`--reserve-data`), a line of the block map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub blkaddr: u64,
    pub blocks: u64,
    /// Where the data is in the source (a tar's byte offset).
    pub at: u64,
    /// The file's size.
    pub size: u64,
}

/// The figures of [`Placed`] the build report needs.
pub struct Stats {
    pub bytes_in: u64,
    pub reserved_bytes: u64,
    pub compressor_input: u64,
    pub dedupe_saved: u64,
    pub fragment_bytes: u64,
    pub warnings: Vec<String>,
}

impl Stats {
    pub fn of(p: &Placed) -> Stats {
        Stats {
            bytes_in: p.bytes_in,
            reserved_bytes: p.reserved.iter().map(|r| r.size).sum(),
            compressor_input: p.compressor_input,
            dedupe_saved: p.dedupe_saved,
            fragment_bytes: p.fragment_bytes,
            warnings: p.warnings.clone(),
        }
    }
}

/// Store the data of every regular file of `tree` but the packed inode.
pub fn store_data(tree: &Tree, plan: &Plan, o: &BuildOptions, out: &mut Out) -> Result<Placed> {
    let mut placed = Placed {
        layouts: vec![Layout::NONE; tree.nodes.len()],
        end_blk: plan.first_blk,
        bytes_in: 0,
        compressor_input: 0,
        dedupe_saved: 0,
        packed: None,
        fragment_bytes: 0,
        fragment_alt: 0,
        warnings: Vec::new(),
        blob: None,
        reserved: Vec::new(),
    };
    // Files whose data is not written here, in inode order at the start of the data
    // region: files on an extra device (tar index mode, layers merged by reference)
    // only get chunk indexes pointing there, and a tail not on the device a block of
    // its own; files of `--reserve-data` get contiguous blocks, left unwritten (the
    // output file's holes read as zeros).
    for (id, nd) in tree.nodes.iter().enumerate() {
        let Kind::File { src, size } = &nd.kind else {
            continue;
        };
        if let Source::Reserved { at } = src {
            if *size == 0 {
                continue;
            }
            let blocks = size.div_ceil(plan.bs);
            let blkaddr = placed.end_blk;
            placed.end_blk = blkaddr
                .checked_add(blocks)
                .ok_or_else(|| BuildError::TooLarge("reserved data".into()))?;
            placed.layouts[id] = Layout::Plain { startblk: blkaddr };
            placed.reserved.push(Reserved {
                blkaddr,
                blocks,
                at: *at,
                size: *size,
            });
        } else if let Source::External {
            device,
            blkaddr,
            tail,
        } = src
        {
            let tail_blk = match tail {
                Some(f) => {
                    let after = blkaddr.saturating_add(size >> plan.bits);
                    Some(store_tail(
                        f,
                        *size,
                        plan.bits,
                        out,
                        &mut placed.end_blk,
                        after,
                    )?)
                }
                None => None,
            };
            placed.layouts[id] = external_layout(*device, *blkaddr, *size, plan.bits, tail_blk)?;
            placed.bytes_in += size;
        }
    }
    let mut files: Vec<(usize, &crate::scan::Node, &Source, u64)> = tree
        .nodes
        .iter()
        .enumerate()
        .filter(|(id, _)| Some(*id) != tree.packed)
        .filter_map(|(id, nd)| match &nd.kind {
            Kind::File {
                src: Source::External { .. } | Source::Reserved { .. },
                ..
            } => None,
            Kind::File { src, size } => Some((id, nd, src, *size)),
            _ => None,
        })
        .collect();
    // `--sort`: the listed files first, in the listed order; the rest in inode order.
    let mut listed = vec![false; tree.nodes.len()];
    if !o.sort.is_empty() {
        let mut rank = vec![usize::MAX; tree.nodes.len()];
        for (k, p) in o.sort.iter().enumerate() {
            let shown = String::from_utf8_lossy(p);
            match tree.lookup(p) {
                Some(id) if matches!(tree.nodes[id].kind, Kind::File { .. }) => {
                    if rank[id] == usize::MAX {
                        rank[id] = k;
                        listed[id] = true;
                    }
                }
                Some(_) => placed
                    .warnings
                    .push(format!("--sort: {shown} is not a regular file")),
                None => placed
                    .warnings
                    .push(format!("--sort: {shown} is not in the source")),
            }
        }
        // Stable: unlisted files (rank MAX) keep inode order behind the listed ones.
        files.sort_by_key(|&(id, ..)| rank[id]);
    }
    let threads = o.worker_threads();
    if let Some(c) = &o.compression {
        warn_if_fewer_workers(&mut placed.warnings, o, c);
    }
    // Per file: what goes to the packed inode.
    let mut frag_modes: Vec<FragMode> = files
        .iter()
        .map(|&(id, nd, _, size)| match &o.compression {
            Some(c) => frag_mode(o, c, &nd.rel, size, listed[id]),
            None => FragMode::None,
        })
        .collect();
    let first_grouped = group_common_names(&mut files, &mut frag_modes);
    // Per file (index in `files`): the earlier file it duplicates. Files that go to
    // the packed inode whole are left to fragment dedupe, which finds the same
    // duplicates (equal fragments share one offset, the same layout a duplicate
    // would copy) from the bytes the workers read anyway, instead of reading every
    // small file of a shared size once more here.
    let dup_of = if o.dedupe {
        let cands: Vec<dedupe::Candidate> = files
            .iter()
            .zip(&frag_modes)
            .map(|(&(id, _, src, size), m)| dedupe::Candidate {
                src,
                // Size 0: not a candidate.
                size: if *m == FragMode::Whole { 0 } else { size },
                meta: plan.fixed_meta(id),
            })
            .collect();
        dedupe::find_duplicates(&cands, threads)?
    } else {
        vec![None; files.len()]
    };
    for (&(_, _, _, size), d) in files.iter().zip(&dup_of) {
        placed.bytes_in += size;
        if d.is_some() {
            placed.dedupe_saved += size;
        }
    }
    // Read by the CLI's progress bar; without one, a private counter nobody reads.
    let progress = o.progress.clone().unwrap_or_default();
    progress.set_total(files.iter().map(|&(.., size)| size).sum());
    if let Some(c) = &o.compression {
        // Pcluster dedupe: identical pclusters of different files (or of one) stored once.
        let mut pcl = o.dedupe.then(zdata::PclMap::default);
        let mut frags = match o.fragments {
            Fragments::Off => None,
            _ => Some(FragStore::new(
                out.spool("fragments")?,
                o.dedupe,
                suffix_reach(c),
            )?),
        };
        let mut reqs = Vec::new();
        for (k, &(id, nd, src, size)) in files.iter().enumerate() {
            let frag = frag_modes[k];
            reqs.push(zdata::FileReq {
                id,
                src: src.clone(),
                size,
                rel: nd.rel.clone(),
                fixed_meta: plan.fixed_meta(id),
                inline_tail: plan.inline_tail(id, size),
                frag,
                skip: dup_of[k].is_some(),
                // Files grouped by name already sit beside their likes.
                similar: frag == FragMode::Whole && k < first_grouped,
                align: u64::from(o.dsunit),
            });
        }
        let (stored, end, fed) = zdata::store_all(
            &reqs,
            c,
            out,
            plan.bits,
            placed.end_blk,
            threads,
            o.memory_limit,
            frags.as_mut(),
            pcl.as_mut(),
            &progress,
        )?;
        placed.dedupe_saved += pcl.map_or(0, |m| m.saved);
        for (r, st) in reqs.iter().zip(stored) {
            let l: Layout = st.into();
            if l.fragment() {
                placed.fragment_alt += match l {
                    Layout::Fragment { .. } if r.size < plan.bs && r.inline_tail => r.size,
                    _ => plan.bs,
                };
            }
            placed.layouts[r.id] = l;
        }
        placed.end_blk = end;
        placed.compressor_input = fed;
        if let Some(fs) = frags {
            placed.dedupe_saved += fs.deduped;
            placed.fragment_bytes = fs.bytes_in;
            if !fs.is_empty() {
                placed.packed = Some(fs.finish());
            }
        }
    } else {
        // `--blobdev`: every file's chunks go to the blob, from its block 0 (the image
        // holds none; `reserve_blob_slot` made sure chunks are on).
        let mut blob = o
            .blobdev
            .as_deref()
            .map(|b| Out::create(b, 0))
            .transpose()?;
        let mut chunks = o.chunks.map(|c| match blob {
            Some(_) => crate::chunks::ChunkStore::for_blob(c),
            None => crate::chunks::ChunkStore::new(c),
        });
        let align = match o.chunks {
            Some(c) => chunk_align(o, c, plan.bits, &mut placed.warnings),
            None => u64::from(o.dsunit),
        };
        let (target, first_blk) = match blob.as_mut() {
            Some(b) => (b, 0),
            None => (&mut *out, placed.end_blk),
        };
        let mut dw = DataWriter {
            out: target,
            blkszbits: plan.bits,
            next_blk: first_blk,
            buf: Vec::new(),
            chunks: chunks.as_mut(),
            align,
        };
        for (k, &(id, _, src, size)) in files.iter().enumerate() {
            if dup_of[k].is_none() {
                placed.layouts[id] = dw.store_file(src, size, plan.inline_tail(id, size))?.into();
            }
            progress.add_done(size);
        }
        let end = dw.next_blk;
        placed.dedupe_saved += chunks.map_or(0, |c| c.deduped);
        match blob {
            Some(mut b) => {
                b.set_len(end << plan.bits)?;
                placed.blob = Some((b, end));
            }
            None => placed.end_blk = end,
        }
    }
    // Duplicates share the data of the file they copy (an earlier one: already placed).
    for (k, d) in dup_of.iter().enumerate() {
        if let Some(src) = d {
            placed.layouts[files[k].0] = placed.layouts[files[*src].0].clone();
        }
    }
    // Files stored without compressing them (small, holes, no gain) count here.
    progress.finish();
    Ok(placed)
}

/// `--blobdev`: checked against the output and the other options, and its slot in
/// the device table reserved (its size is set once the data is placed).
pub fn reserve_blob_slot(
    tree: &mut Tree,
    output: &std::path::Path,
    o: &BuildOptions,
) -> Result<()> {
    let Some(blob) = &o.blobdev else {
        return Ok(());
    };
    let same = blob == output
        || matches!(
            (std::fs::canonicalize(blob), std::fs::canonicalize(output)),
            (Ok(a), Ok(b)) if a == b
        );
    if same {
        return Err(BuildError::Options(format!(
            "--blobdev {}: the blob and the image must be different files",
            blob.display()
        )));
    }
    if o.compression.is_some() || o.chunks.is_none() || !tree.devices.is_empty() {
        return Err(BuildError::Options(
            "--blobdev: chunks of an uncompressed image (--chunksize, -z none), not with \
             other extra devices (a tar index, layers merged by reference)"
                .into(),
        ));
    }
    tree.devices = vec![crate::scan::Device::untagged(0)];
    Ok(())
}

/// `--dsunit` for chunks of `c`: as mkfs.erofs, a unit larger than a chunk is not kept
/// (chunks shared between files would break it anyway), and a warning says so.
fn chunk_align(o: &BuildOptions, c: ChunkOptions, bits: u8, warnings: &mut Vec<String>) -> u64 {
    let align = u64::from(o.dsunit);
    let chunk_blocks = 1u64 << c.bits.saturating_sub(bits);
    if align > 1 && align > chunk_blocks {
        warnings.push(format!(
            "--dsunit {align} ignored: larger than a chunk ({chunk_blocks} blocks)"
        ));
        return 0;
    }
    align
}

/// A file name this many files that go whole to the packed inode share makes a group.
pub const COMMON_NAME_MIN: usize = 8;

/// Files that go whole to the packed inode under a name at least [`COMMON_NAME_MIN`]
/// of them share (`copyright` of every Debian package, `__init__.py`, `Makefile`,
/// `Kconfig`) move behind all other files, grouped by name, each group in inode order.
/// Such files are often alike (licence texts, boilerplate) but sit in directories far
/// apart; side by side, the packed inode's codec finds one in the next. Every other
/// file keeps its place, and only the packed inode's data changes order: these files
/// have no data outside it. Measured with `-E smallest` at 128 KiB (see
/// docs/benchmarks.md): rootfs lz4 -0.70 %, zstd 3 -1.68 %; linux lz4 -0.21 %, zstd 3
/// -0.05 %. Grouping every file by type instead lost 1.2 % on the linux tree.
/// Returns where the groups start in the new order (`files.len()` when there are none).
fn group_common_names(
    files: &mut Vec<(usize, &crate::scan::Node, &Source, u64)>,
    modes: &mut Vec<FragMode>,
) -> usize {
    fn name(rel: &[u8]) -> &[u8] {
        match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => &rel[i + 1..],
            None => rel,
        }
    }
    let mut count: std::collections::HashMap<&[u8], usize> = Default::default();
    for (f, m) in files.iter().zip(modes.iter()) {
        if *m == FragMode::Whole {
            *count.entry(name(&f.1.rel)).or_default() += 1;
        }
    }
    let common = |k: usize| {
        modes[k] == FragMode::Whole
            && count.get(name(&files[k].1.rel)).copied().unwrap_or(0) >= COMMON_NAME_MIN
    };
    let (mut moved, keep): (Vec<usize>, Vec<usize>) = (0..files.len()).partition(|&k| common(k));
    if moved.is_empty() {
        return files.len();
    }
    let first_grouped = keep.len();
    // Stable: inode order inside a group.
    moved.sort_by_key(|&k| name(&files[k].1.rel));
    let order: Vec<usize> = keep.into_iter().chain(moved).collect();
    *files = order.iter().map(|&k| files[k]).collect();
    *modes = order.iter().map(|&k| modes[k]).collect();
    first_grouped
}

/// What part of a file of `size` bytes goes to the packed inode.
fn frag_mode(
    o: &BuildOptions,
    c: &zdata::Compression,
    rel: &[u8],
    size: u64,
    listed: bool,
) -> FragMode {
    let p = zdata::policy(c, rel);
    match o.fragments {
        // Listed files stay together in the data region, and files stored uncompressed
        // stay out of the packed inode.
        _ if listed || p.uncompressed => FragMode::None,
        Fragments::Off => FragMode::None,
        Fragments::All { .. } => FragMode::Whole,
        Fragments::Tails { .. } if size <= 2 * u64::from(p.pcluster) => FragMode::Whole,
        Fragments::Tails { .. } => FragMode::Tail,
    }
}

/// The chunk indexes of a file of `size` bytes contiguous from block `blkaddr` of
/// extra device `device`: one chunk as large as the file (at most 2^31 blocks a
/// chunk), so a file takes one 8-byte index or a few.
/// Store the last, partial block of a file whose full blocks are on an extra device
/// (read from `f`) at block `*next` of the image; returns that block. Never at block
/// `after`, the number of the device block right behind the full blocks: Linux's
/// iomap read path adds a page to the bio being built when its sector follows the
/// bio's last one, without comparing the block devices, so a whole-file read would
/// take the tail from the extra device (seen on 6.18: the soak's kernel mounts read
/// the wrong bytes). A zero block is skipped instead.
fn store_tail(
    f: &crate::erofsin::ErofsFile,
    size: u64,
    bits: u8,
    out: &mut Out,
    next: &mut u64,
    after: u64,
) -> Result<u32> {
    if *next == after {
        out.write_at(*next << bits, &vec![0u8; 1 << bits])?;
        *next += 1;
    }
    let full = (size >> bits) << bits;
    let mut b = vec![0u8; 1 << bits];
    let n = usize::try_from(size - full).map_err(|_| BuildError::TooLarge("tail".into()))?;
    f.read_exact_at(&mut b[..n], full)
        .map_err(|e| BuildError::Invalid {
            path: f.image.path.to_path_buf(),
            what: format!("source image: nid {}: tail: {e}", f.ino.nid),
        })?;
    let blk = *next;
    out.write_at(blk << bits, &b)?;
    *next += 1;
    u32::try_from(blk).map_err(|_| BuildError::TooLarge("image beyond 2^32 blocks".into()))
}

/// Chunk indexes for a file of `size` bytes contiguous from block `blkaddr` of
/// `device`: one chunk as large as the file (chunks of at most 2^31 blocks); with
/// `tail_blk`, only its full blocks are there, in chunks as large as divide them
/// evenly, and one more chunk (the tail) is block `tail_blk` of the image.
fn external_layout(
    device: u16,
    blkaddr: u64,
    size: u64,
    bits: u8,
    tail_blk: Option<u32>,
) -> Result<Layout> {
    if size == 0 {
        return Ok(Layout::NONE);
    }
    let (blocks, rel) = match tail_blk {
        None => {
            let blocks = size.div_ceil(1 << bits);
            (blocks, (64 - (blocks - 1).leading_zeros()).min(31) as u8)
        }
        Some(_) => {
            let blocks = size >> bits;
            (blocks, blocks.trailing_zeros().min(31) as u8)
        }
    };
    let count = blocks.div_ceil(1 << rel);
    Ok(Layout::ChunkIndex {
        tail_blk,
        chunk_rel: rel,
        device,
        blkaddr: u32::try_from(blkaddr)
            .ok()
            .filter(|b| u64::from(*b) + blocks <= 1 << 32)
            .ok_or_else(|| BuildError::TooLarge("tar beyond 2^32 blocks".into()))?,
        count: u32::try_from(count).map_err(|_| BuildError::TooLarge("too many chunks".into()))?,
    })
}

/// `store_all` runs fewer compression threads than `-j` when more would not fit in
/// the memory limit with `c`'s codecs: say so (once per count).
fn warn_if_fewer_workers(warnings: &mut Vec<String>, o: &BuildOptions, c: &zdata::Compression) {
    let threads = o.worker_threads();
    let fit = zdata::fit_workers(threads, c, o.memory_limit);
    if fit < threads {
        let w = format!(
            "{fit} compression threads, not {threads}: more would not fit in the memory \
             limit of {} MiB with this codec and pcluster size (--memory-limit raises it)",
            o.memory_limit >> 20
        );
        if !warnings.contains(&w) {
            warnings.push(w);
        }
    }
}

/// The packed inode's pcluster size.
fn packed_pcluster(o: &BuildOptions, c: &zdata::Compression) -> u32 {
    o.packed_pcluster().unwrap_or(c.pcluster_size)
}

/// How far back in the packed inode's data its codec finds a copy (LZ4's window,
/// DEFLATE's): fragment dedupe by suffix takes copies from further back only, as a
/// copy within reach costs next to nothing. Not at all with zstd and LZMA, whose
/// pclusters take in hundreds of KB: the copy also helps the similar files around
/// it (rootfs, zstd 3, 128 KiB: taking out 167 KB of copies from further back than
/// four pclusters made the image 82 KB larger; linux: +8 KB).
fn suffix_reach(c: &zdata::Compression) -> u64 {
    use ferofs_compress::Encoder;
    match c.algorithms[0].encoder {
        Encoder::Lz4 | Encoder::Lz4hc => 64 << 10,
        Encoder::Deflate => 32 << 10,
        Encoder::Zstd | Encoder::Lzma => u64::MAX,
    }
}

/// Store the packed inode's data (inode `id`, `packed.size` bytes; `plan` already
/// knows its size) behind the data region, compressed with the image's first
/// algorithm and the fragments' pcluster size, and turn every fragment id in
/// `placed.layouts` into its offset.
pub fn store_packed(
    id: usize,
    plan: &Plan,
    o: &BuildOptions,
    out: &mut Out,
    placed: &mut Placed,
) -> Result<()> {
    let (Some(c), Some(packed)) = (&o.compression, &placed.packed) else {
        return Ok(());
    };
    let pcl = packed_pcluster(o, c);
    let pc = zdata::Compression {
        algorithms: vec![c.algorithms[0].clone()],
        pcluster_size: pcl,
        ztailpacking: c.ztailpacking,
        hints: Vec::new(),
        max_extent: c.max_extent,
        full_index: c.full_index,
    };
    let size = packed.size;
    let req = zdata::FileReq {
        id,
        src: packed.source(),
        size,
        rel: b"(packed inode)".to_vec(),
        fixed_meta: plan.fixed_meta(id),
        inline_tail: plan.inline_tail(id, size),
        frag: FragMode::None,
        skip: false,
        similar: false,
        align: u64::from(o.dsunit),
    };
    let threads = o.worker_threads();
    warn_if_fewer_workers(&mut placed.warnings, o, &pc);
    // The packed inode's data is more to compress: the total grows by it.
    let progress = o.progress.clone().unwrap_or_default();
    progress.set_total(progress.total() + size);
    let (stored, end, fed) = zdata::store_all(
        std::slice::from_ref(&req),
        &pc,
        out,
        plan.bits,
        placed.end_blk,
        threads,
        o.memory_limit,
        None,
        None,
        &progress,
    )?;
    progress.finish();
    placed.end_blk = end;
    placed.compressor_input += fed;
    if let Some(st) = stored.into_iter().next() {
        placed.layouts[id] = st.into();
    }
    let offsets = &packed.offsets;
    let off = |i: u64| -> Result<u64> {
        usize::try_from(i)
            .ok()
            .and_then(|i| offsets.get(i).copied())
            .ok_or_else(|| BuildError::Options("internal: unknown fragment".into()))
    };
    for l in &mut placed.layouts {
        match l {
            Layout::Fragment { off: o } => *o = off(*o)?,
            Layout::Compressed(z) => {
                if let Some(f) = z.fragment.as_mut() {
                    *f = off(*f)?;
                    z.full_index |= *f > u64::from(u32::MAX);
                    if z.full_index {
                        // Full indexes carry the offset's high half in the tail
                        // head's block address.
                        if let Some(e) = z.extents.last_mut() {
                            e.blkaddr = (*f >> 32) as u32;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

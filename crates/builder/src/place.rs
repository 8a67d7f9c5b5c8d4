//! Stage 3, data placement: every regular file's contents go to the data region, from
//! the first block after block 0, in inode order — compressed by [`zdata`] or copied by
//! [`crate::data`] — and each file gets its [`Layout`]. This is the only stage that reads file
//! contents; the output depends on nothing but the tree, the plan and the options.

use crate::data::DataWriter;
use crate::layout::Layout;
use crate::options::*;
use crate::out::Out;
use crate::plan::Plan;
use crate::scan::{Kind, Tree};
use crate::zdata;

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
}

/// Store the data of every regular file of `tree`.
pub fn store_data(tree: &Tree, plan: &Plan, o: &BuildOptions, out: &mut Out) -> Result<Placed> {
    let mut placed = Placed {
        layouts: vec![Layout::NONE; tree.nodes.len()],
        end_blk: plan.first_blk,
        bytes_in: 0,
        compressor_input: 0,
    };
    let files = tree
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(id, nd)| match &nd.kind {
            Kind::File { path, size } => Some((id, nd, path, *size)),
            _ => None,
        });
    // Read by the CLI's progress bar; without one, a private counter nobody reads.
    let progress = o.progress.clone().unwrap_or_default();
    progress.set_total(files.clone().map(|(.., size)| size).sum());
    if let Some(c) = &o.compression {
        let mut reqs = Vec::new();
        for (id, nd, path, size) in files {
            placed.bytes_in += size;
            reqs.push(zdata::FileReq {
                id,
                path: path.clone(),
                size,
                rel: nd.rel.clone(),
                fixed_meta: plan.fixed_meta(id),
                inline_tail: plan.inline_tail(id, size),
            });
        }
        let threads = if o.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            o.threads
        };
        let (stored, end, fed) =
            zdata::store_all(&reqs, c, out, plan.bits, plan.first_blk, threads, &progress)?;
        for (r, st) in reqs.iter().zip(stored) {
            placed.layouts[r.id] = st.into();
        }
        placed.end_blk = end;
        placed.compressor_input = fed;
    } else {
        let mut dw = DataWriter {
            out,
            blkszbits: plan.bits,
            next_blk: plan.first_blk,
            buf: Vec::new(),
        };
        for (id, _, path, size) in files {
            placed.bytes_in += size;
            placed.layouts[id] = dw
                .store_file(path, size, plan.inline_tail(id, size))?
                .into();
            progress.add_done(size);
        }
        placed.end_blk = dw.next_blk;
    }
    // Files stored without compressing them (small, holes, no gain) count here.
    progress.finish();
    Ok(placed)
}

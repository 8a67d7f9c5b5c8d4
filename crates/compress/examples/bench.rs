//! Throughput and fill of the fixed-output compressors on a file, as the builder uses
//! them: consecutive pclusters of `cap` bytes, each taking the longest prefix that
//! fits (inputs of at most 16 MiB), storing a block uncompressed when nothing useful
//! fits.
//!
//! usage: cargo run --release -p ferofs-compress --example bench -- FILE
//!        [--specs lz4,lz4hc:zstd,3] [--caps 4096,131072] [--reference] [--hist]
//!        [--libdeflate]
//!
//! Columns: `trials` per pcluster, `in/full` input bytes per full pcluster, `work` input
//! bytes fed to the codec by all trials per input byte (what the search costs, free of
//! timing noise). `--hist` prints how many pclusters took 1, 2, ... trials.
//!
//! `--libdeflate` also runs libdeflate with the prefix search at each deflate level (our
//! own encoder serves levels 1-9).
//!
//! `--reference` also runs a plain bisection search for zstd/deflate that stops only
//! at a one-byte bracket or one byte of slack (what mkfs.erofs does), to compare how
//! much input each search packs per pcluster and how many trials it needs; for deflate
//! also a search like mkfs.erofs 1.9.3's libdeflate one (first guess 15/16 of the last
//! input, stop at `22 - 2 * level` unused bytes). Note that mkfs.erofs `-zdeflate` runs
//! its own fixed-output encoder, not libdeflate (`-zlibdeflate`).

use ferofs_compress::{
    new_compressor,
    search::{TRIALS, TRIAL_BYTES},
    CompressorSpec, Encoder, FixedOutputCompressor,
};
use std::sync::atomic::Ordering;
use std::time::Instant;

const BLOCK: usize = 4096;
const MAX_INPUT: usize = 16 << 20;

struct Outcome {
    secs: f64,
    packed: usize,
    full: usize,
    stored: usize,
    pclusters: usize,
    trials: u64,
    /// Input bytes fed to the codec by all trials.
    work: u64,
    /// Pclusters by the number of trials their search took (15: 15 or more).
    hist: [u64; 16],
}

fn simulate(
    data: &[u8],
    cap: usize,
    mut f: impl FnMut(&[u8], &mut [u8]) -> (usize, usize),
) -> Outcome {
    let mut dst = vec![0u8; cap];
    let (mut pos, mut stored, mut pclusters, mut packed, mut full) = (0, 0, 0, 0, 0);
    let t0 = TRIALS.load(Ordering::Relaxed);
    let w0 = TRIAL_BYTES.load(Ordering::Relaxed);
    let mut hist = [0u64; 16];
    let start = Instant::now();
    while pos < data.len() {
        let src = &data[pos..data.len().min(pos + MAX_INPUT)];
        let tb = TRIALS.load(Ordering::Relaxed);
        let (consumed, written) = f(src, &mut dst);
        let k = (TRIALS.load(Ordering::Relaxed) - tb).min(15) as usize;
        hist[k] += 1;
        let blocks = written.div_ceil(BLOCK) * BLOCK;
        if consumed > 0 && blocks < consumed {
            pos += consumed;
            if consumed < src.len() {
                packed += consumed;
                full += 1;
            }
            stored += blocks;
            pclusters += 1;
        } else {
            let n = BLOCK.min(data.len() - pos);
            pos += n;
            stored += BLOCK;
        }
    }
    Outcome {
        secs: start.elapsed().as_secs_f64(),
        packed,
        full,
        stored,
        pclusters,
        trials: TRIALS.load(Ordering::Relaxed) - t0,
        work: TRIAL_BYTES.load(Ordering::Relaxed) - w0,
        hist,
    }
}

/// Bisection with ratio steps, stopping at a one-byte bracket or one byte of slack.
/// With `slack` > 1, a stop and first guess like mkfs.erofs 1.9.3's libdeflate search
/// (15/16 of the previous pcluster's input; `22 - 2 * level` bytes).
struct Reference {
    scratch: Vec<u8>,
    /// Input taken by the previous pcluster (0: none yet, or `slack` is 1).
    last: usize,
    slack: usize,
}

impl Reference {
    fn run(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        mut compress: impl FnMut(&[u8], &mut [u8]) -> Option<usize>,
    ) -> (usize, usize) {
        let cap = dst.len();
        let (mut l, mut l_size, mut r) = (0usize, 0usize, src.len() + 1);
        let mut m = if self.last > 0 {
            self.last * 15 / 16
        } else {
            cap * 4
        };
        self.scratch.resize(cap + 64, 0);
        loop {
            m = m.max(l + 1).min(r - 1);
            TRIALS.fetch_add(1, Ordering::Relaxed);
            TRIAL_BYTES.fetch_add(m as u64, Ordering::Relaxed);
            match compress(&src[..m], &mut self.scratch[..cap + 64]) {
                Some(w) if w <= cap => {
                    dst[..w].copy_from_slice(&self.scratch[..w]);
                    (l, l_size) = (m, w);
                    if r <= l + 1 || w + self.slack >= cap {
                        break;
                    }
                    m = cap * m / w;
                }
                _ => {
                    r = m;
                    if r <= l + 1 {
                        break;
                    }
                    m = (l + r) / 2;
                }
            }
        }
        if self.slack > 1 {
            self.last = l;
        }
        (l, l_size)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: bench FILE [--specs A:B] [--caps N,M] [--reference]");
        std::process::exit(2);
    };
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let specs = opt("--specs").unwrap_or_else(|| "lz4:lz4hc:lzma:deflate:zstd".into());
    let caps: Vec<usize> = opt("--caps")
        .unwrap_or_else(|| "4096,131072".into())
        .split(',')
        .filter_map(|c| c.parse().ok())
        .collect();
    let with_ref = args.iter().any(|a| a == "--reference");
    let with_hist = args.iter().any(|a| a == "--hist");
    let with_lib = args.iter().any(|a| a == "--libdeflate");
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mb = data.len() as f64 / 1e6;
    println!("{path}: {} bytes", data.len());
    println!(
        "{:<20} {:>8} {:>10} {:>12} {:>8} {:>10} {:>8} {:>10} {:>6}",
        "spec", "cap", "MB/s", "stored", "ratio", "pclusters", "trials", "in/full", "work"
    );
    for s in specs.split(':') {
        let spec = CompressorSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        for &cap in &caps {
            let mut c = new_compressor(&spec, cap as u32).unwrap_or_else(|e| panic!("{e}"));
            let o = simulate(&data, cap, |src, dst| c.compress_destsize(src, dst));
            row(&spec.to_string(), cap, mb, data.len(), &o, with_hist);
            if spec.encoder == Encoder::Deflate && with_lib {
                // libdeflate at the same level with the prefix search (what levels
                // 1-9 used before our own encoder).
                let mut c = ferofs_compress::deflate::Deflate::libdeflate(spec.level);
                let o = simulate(&data, cap, |src, dst| c.compress_destsize(src, dst));
                row(
                    &format!("libdeflate,{}", spec.level),
                    cap,
                    mb,
                    data.len(),
                    &o,
                    with_hist,
                );
            }
            if with_ref {
                run_reference(&spec, &data, cap, mb, 1, with_hist);
                if spec.encoder == Encoder::Deflate {
                    let slack = (22 - 2 * spec.level).max(1) as usize;
                    run_reference(&spec, &data, cap, mb, slack, with_hist);
                }
            }
        }
    }
}

fn row(label: &str, cap: usize, mb: f64, len: usize, o: &Outcome, with_hist: bool) {
    println!(
        "{:<20} {:>8} {:>10.1} {:>12} {:>8.3} {:>10} {:>8.2} {:>10.1} {:>6.2}",
        label,
        cap,
        mb / o.secs,
        o.stored,
        len as f64 / o.stored as f64,
        o.pclusters,
        o.trials as f64 / o.pclusters.max(1) as f64,
        o.packed as f64 / o.full.max(1) as f64,
        o.work as f64 / len as f64
    );
    if with_hist {
        println!("  trials per pcluster (0..15+): {:?}", o.hist);
    }
}

fn run_reference(
    spec: &CompressorSpec,
    data: &[u8],
    cap: usize,
    mb: f64,
    slack: usize,
    with_hist: bool,
) {
    let mut r = Reference {
        scratch: Vec::new(),
        last: 0,
        slack,
    };
    let o = match spec.encoder {
        Encoder::Zstd => {
            let mut c = zstd_safe::CCtx::create();
            let wlog = spec.effective_dict(cap as u32).ilog2();
            let _ = c.set_parameter(zstd_safe::CParameter::CompressionLevel(spec.level));
            let _ = c.set_parameter(zstd_safe::CParameter::WindowLog(wlog));
            simulate(data, cap, |src, dst| {
                r.run(src, dst, |p, out| {
                    let res = c.compress2(out, p).ok();
                    if res.is_none() {
                        let _ = c.reset(zstd_safe::ResetDirective::SessionOnly);
                    }
                    res
                })
            })
        }
        Encoder::Deflate => {
            let lvl = libdeflater::CompressionLvl::new(spec.level).unwrap_or_default();
            let mut c = libdeflater::Compressor::new(lvl);
            simulate(data, cap, |src, dst| {
                r.run(src, dst, |p, out| {
                    c.deflate_compress(p, out).ok().filter(|&w| w > 0)
                })
            })
        }
        _ => return,
    };
    let label = if slack > 1 {
        format!("  (mkfs-like {slack})")
    } else {
        "  (reference)".to_string()
    };
    row(&label, cap, mb, data.len(), &o, with_hist);
}

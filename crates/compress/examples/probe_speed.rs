//! Probe throughput on a file: `cargo run --release -p ferofs-compress --example probe_speed -- FILE`
use ferofs_compress::{probe::Probe, Algorithm};
use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: probe_speed FILE")?;
    let data = std::fs::read(path)?;
    for alg in [Algorithm::Lz4, Algorithm::Zstd] {
        let mut p = Probe::new(alg);
        let t = Instant::now();
        let n = p.incompressible_prefix(&data, data.len());
        let dt = t.elapsed().as_secs_f64();
        println!(
            "{alg:?}: {n} of {} bytes incompressible, {:.0} MB/s",
            data.len(),
            data.len() as f64 / dt / 1e6
        );
    }
    Ok(())
}

//! Compare two images of the same tree file by file: stored bytes and layout.
//! usage: cargo run --release --example compare_images A.img B.img
use ferofs_reader::Image;
use std::collections::BTreeMap;

fn stored(img: &Image) -> BTreeMap<Vec<u8>, (u64, String, u64)> {
    let mut m = BTreeMap::new();
    img.walk(|p, ino| {
        if ino.is_regular() || ino.is_dir() {
            let ext = img.extents(ino)?;
            let s: u64 = ext
                .iter()
                .filter(|e| e.physical.is_some())
                .map(|e| e.stored)
                .sum();
            let inl: u64 = ext
                .iter()
                .filter(|e| e.kind.contains("inline"))
                .map(|e| e.stored.max(e.length))
                .sum();
            m.insert(p.to_vec(), (s, ino.layout.name().to_string(), inl));
        }
        Ok(())
    })
    .expect("walk");
    m
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let a = stored(&Image::open(&args[1]).expect("open a"));
    let b = stored(&Image::open(&args[2]).expect("open b"));
    let mut by_kind: BTreeMap<(String, String), (u64, i64)> = BTreeMap::new();
    let mut worst: Vec<(i64, Vec<u8>)> = Vec::new();
    for (p, (sa, la, ia)) in &a {
        if let Some((sb, lb, ib)) = b.get(p) {
            let d = *sa as i64 - *sb as i64 + *ia as i64 - *ib as i64;
            let e = by_kind.entry((la.clone(), lb.clone())).or_default();
            e.0 += 1;
            e.1 += d;
            worst.push((d, p.clone()));
        }
    }
    for (k, v) in &by_kind {
        println!(
            "{k:?}: {} files, stored+inline difference {} bytes",
            v.0, v.1
        );
    }
    worst.sort();
    let n: usize = std::env::var("SHOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let only = std::env::var("KIND").ok();
    for (d, p) in worst
        .iter()
        .rev()
        .filter(|(_, p)| {
            only.as_ref().is_none_or(|k| {
                a.get(p)
                    .is_some_and(|x| x.1 != b.get(p).map_or("", |y| y.1.as_str()))
                    && k == "diff"
            })
        })
        .take(n)
    {
        println!(
            "{d:>8} {} a={:?} b={:?}",
            String::from_utf8_lossy(p),
            a.get(p),
            b.get(p)
        );
    }
}

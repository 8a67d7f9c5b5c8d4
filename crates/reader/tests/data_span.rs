//! `Image::data_span` (what the FUSE mount caches by): the spans of every regular file
//! tile it from 0 to its size without gap or overlap, each span is read the same way
//! whole (one `read_at_with` call) as byte ranges through `read_at`, and holes read as
//! zeros. Over golden images of every data layout.

use ferofs_reader::{Image, ReadCtx, SpanKind};
use ferofs_testkit::golden;

fn check(name: &str) -> (usize, usize) {
    let img = Image::open(golden(&format!("erofs-utils-1.9.3/{name}.erofs.zst"))).expect("open");
    let mut files = Vec::new();
    img.walk(|p, ino| {
        if ino.is_regular() {
            files.push((String::from_utf8_lossy(p).into_owned(), ino.clone()));
        }
        Ok(())
    })
    .expect("walk");
    let (mut ctx, mut spans, mut encoded) = (ReadCtx::new(), 0, 0);
    for (p, ino) in &files {
        let whole = img.read_to_vec(ino).expect("read whole");
        let mut pos = 0u64;
        while pos < ino.size {
            let s = img
                .data_span(&mut ctx, ino, pos)
                .unwrap_or_else(|e| panic!("{name} {p} @{pos}: {e}"))
                .unwrap_or_else(|| panic!("{name} {p} @{pos}: no span before the end"));
            assert!(
                s.start <= pos && pos < s.end && s.end <= ino.size,
                "{name} {p}: {s:?} @{pos}"
            );
            if pos == s.start {
                let mut buf = vec![0u8; (s.end - s.start) as usize];
                let n = img
                    .read_at_with(&mut ctx, ino, s.start, &mut buf)
                    .expect("span read");
                assert_eq!(n, buf.len(), "{name} {p}: short span read");
                assert!(
                    buf[..] == whole[s.start as usize..s.end as usize],
                    "{name} {p}: span {s:?} bytes differ"
                );
                if s.kind == SpanKind::Hole {
                    assert!(buf.iter().all(|&b| b == 0), "{name} {p}: hole not zeros");
                }
                encoded += usize::from(matches!(s.kind, SpanKind::Encoded { .. }));
            }
            spans += 1;
            pos = s.end;
        }
        assert!(img
            .data_span(&mut ctx, ino, ino.size)
            .expect("at end")
            .is_none());
    }
    (spans, encoded)
}

#[test]
fn spans_tile_every_file_and_read_the_same() {
    for name in [
        "plain",
        "plain-chunk64k",
        "lz4hc",
        "lz4hc-C64k-tpfd",
        "zstd-C64k",
        "lz4hc-all-fragments",
        "lz4hc-48bit-C64k",
    ] {
        let (spans, encoded) = check(name);
        assert!(spans > 0, "{name}: no spans");
        if name.starts_with("lz4") || name.starts_with("zstd") {
            assert!(encoded > 0, "{name}: no encoded spans");
        }
    }
}

//! Limits that protect callers from hostile images, each on a crafted minimal image.

mod common;

use common::*;
use ferofs_reader::dir::MAX_DEPTH;
use ferofs_reader::{CorruptKind, Image};

fn walk_count(img: &Image<Vec<u8>>) -> Result<usize, ferofs_reader::Error> {
    let mut n = 0;
    img.walk(|_, _| {
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

/// A tree as deep as the limit allows walks on a thread with a small stack: the walk
/// keeps its own stack on the heap.
#[test]
fn deepest_allowed_tree_walks_on_a_small_stack() {
    let img = Image::new(deep_chain(MAX_DEPTH - 1)).expect("open");
    let n = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || walk_count(&img))
        .expect("spawn")
        .join()
        .expect("walk thread")
        .expect("walk");
    // root, MAX_DEPTH - 1 directories below it, the leaf
    assert_eq!(n, MAX_DEPTH + 1);
}

#[test]
fn deeper_than_the_limit_is_too_deep() {
    let img = Image::new(deep_chain(MAX_DEPTH + 5)).expect("open");
    let e = walk_count(&img).expect_err("walk of a too deep tree");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::TooDeep), "{e}");
    let mut path = b"/a".repeat(MAX_DEPTH + 5);
    path.extend_from_slice(b"/leaf");
    let e = img.lookup(&path).expect_err("lookup too deep");
    assert_eq!(e.corrupt_kind(), Some(CorruptKind::TooDeep), "{e}");
}

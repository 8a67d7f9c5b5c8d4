//! Positional-read sources. Reads take `&self`, so one image serves many threads.

use std::io;
use std::sync::Arc;

pub trait Source: Send + Sync {
    /// Fill `buf` from `offset`; an error (UnexpectedEof) if the source is shorter.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Total length in bytes.
    fn size(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.size()? == 0)
    }
}

impl Source for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        file_len(self)
    }
}

/// The length of an open file in bytes; for a block device (whose metadata says 0),
/// the device's size.
pub fn file_len(f: &std::fs::File) -> io::Result<u64> {
    use std::os::unix::fs::FileTypeExt;
    let md = f.metadata()?;
    if md.file_type().is_block_device() {
        // Positional reads do not use the file position, so moving it is harmless.
        let mut f = f;
        return io::Seek::seek(&mut f, io::SeekFrom::End(0));
    }
    Ok(md.len())
}

fn slice_read(data: &[u8], buf: &mut [u8], offset: u64) -> io::Result<()> {
    let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
    let end = start
        .checked_add(buf.len())
        .ok_or(io::ErrorKind::UnexpectedEof)?;
    let src = data.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?;
    buf.copy_from_slice(src);
    Ok(())
}

impl Source for Vec<u8> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        slice_read(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.as_slice().len() as u64)
    }
}

impl Source for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        slice_read(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }
}

impl<S: Source + ?Sized> Source for Arc<S> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
}

/// An image and its extra devices as one address space (EROFS's unified addressing):
/// the image from byte 0, each device from the place its device-table slot gives
/// (`uniaddr` blocks). Where parts overlap, the later one is read; a read past every
/// part, or into a gap between them, is an error (a chunk on a missing device).
pub struct Joined {
    /// (start, length, bytes), in the order given.
    parts: Vec<(u64, u64, Arc<dyn Source>)>,
}

impl Joined {
    /// `image`, then each of `devices` at the byte the image's device table puts it
    /// (device `k` in slot `k`). Errors: no EROFS superblock, fewer slots than devices.
    pub fn new(image: Arc<dyn Source>, devices: Vec<Arc<dyn Source>>) -> io::Result<Self> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        let tags: Vec<[u8; 64]>;
        let at = {
            let img = crate::Image::new(image.clone()).map_err(|e| bad(e.to_string()))?;
            if img.devices.len() < devices.len() {
                return Err(bad(format!(
                    "{} extra device(s) given, the image's device table has {}",
                    devices.len(),
                    img.devices.len()
                )));
            }
            tags = img.devices.iter().map(|d| d.tag).collect();
            let bits = u32::from(img.blkszbits);
            img.devices
                .iter()
                .map(|d| {
                    let blk = d.uniaddr();
                    blk.checked_shl(bits)
                        .filter(|p| p >> bits == blk)
                        .ok_or_else(|| bad(format!("device at block {blk}: out of range")))
                })
                .collect::<io::Result<Vec<u64>>>()?
        };
        for (k, d) in devices.iter().enumerate() {
            if let Some(want) = tags.get(k).and_then(uuid_of_tag) {
                if let Some(got) = erofs_uuid(&**d) {
                    if got != want {
                        return Err(bad(format!(
                            "extra device {}: an EROFS image with UUID {}, the device table \
                             wants {} (devices given in another order?)",
                            k + 1,
                            hex(&got),
                            hex(&want)
                        )));
                    }
                }
            }
        }
        let mut parts = vec![(0, image.size()?, image)];
        for (d, start) in devices.into_iter().zip(at) {
            parts.push((start, d.size()?, d));
        }
        Ok(Joined { parts })
    }
}

/// The UUID a device-table tag names: 32 lowercase hex digits, then NULs (what
/// mkfs.erofs and ferofs write for merged layers); None for any other tag.
fn uuid_of_tag(tag: &[u8; 64]) -> Option<[u8; 16]> {
    if tag[32..].iter().any(|&b| b != 0) {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, pair) in tag[..32].chunks_exact(2).enumerate() {
        let d = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        u[i] = (d(pair[0])? << 4) | d(pair[1])?;
    }
    Some(u)
}

/// The UUID of the EROFS image at the start of `src`, if it is one.
fn erofs_uuid(src: &dyn Source) -> Option<[u8; 16]> {
    let mut b = [0u8; ferofs_format::sb::SB_MAX_SIZE];
    src.read_exact_at(&mut b, ferofs_format::sb::SB_OFFSET)
        .ok()?;
    let sb = ferofs_format::sb::Superblock::parse(&b);
    (sb.magic == ferofs_format::sb::MAGIC).then_some(sb.uuid)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Joined {
    /// [`Joined::new`] with the devices opened from `paths` (an error names the path).
    pub fn open(image: Arc<dyn Source>, paths: &[std::path::PathBuf]) -> io::Result<Self> {
        let mut devices: Vec<Arc<dyn Source>> = Vec::with_capacity(paths.len());
        for p in paths {
            let f = std::fs::File::open(p)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
            devices.push(Arc::new(f));
        }
        Joined::new(image, devices)
    }
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spans: Vec<(u64, u64)> = self.parts.iter().map(|(s, l, _)| (*s, *l)).collect();
        f.debug_struct("Joined").field("parts", &spans).finish()
    }
}

impl Source for Joined {
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        // Bounded: each pass reads at least one byte or returns.
        while !buf.is_empty() {
            let (idx, (s, l, src)) = self
                .parts
                .iter()
                .enumerate()
                .rev()
                .find(|(_, (s, l, _))| offset >= *s && offset - *s < *l)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("byte {offset} is on no device given"),
                    )
                })?;
            // Up to the part's end or the next later part that starts inside it.
            let mut end = s + l;
            for (s2, _, _) in &self.parts[idx + 1..] {
                if *s2 > offset && *s2 < end {
                    end = *s2;
                }
            }
            let n = usize::try_from(end - offset).map_or(buf.len(), |n| n.min(buf.len()));
            let (head, rest) = buf.split_at_mut(n);
            src.read_exact_at(head, offset - s)?;
            buf = rest;
            offset += n as u64;
        }
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.parts.iter().map(|(s, l, _)| s + l).max().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joined_reads_across_parts_and_prefers_later_ones() {
        let j = Joined {
            parts: vec![
                (0, 8, Arc::new(vec![1u8; 8]) as Arc<dyn Source>),
                (8, 4, Arc::new(vec![2u8; 4])),
                (6, 4, Arc::new(vec![3u8; 4])),
            ],
        };
        let mut b = [0u8; 12];
        j.read_exact_at(&mut b, 0).expect("read");
        assert_eq!(b, [1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 2, 2]);
        assert_eq!(j.size().expect("size"), 12);
        let e = j
            .read_exact_at(&mut [0u8; 2], 11)
            .expect_err("past the end");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}

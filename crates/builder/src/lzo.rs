//! An LZO1X decoder (the format mksquashfs's `lzo` compressor writes), written for
//! untrusted input: every read and every back-reference is bounds-checked and the
//! output never grows past `max` bytes. Decoding follows the LZO1X bitstream: a
//! literal run or one of four match kinds (M1..M4) per instruction byte, each match
//! followed by 0..3 literals carried in its low two bits; M4 with distance 0 ends the
//! stream.

/// Why a stream did not decode.
pub type LzoError = &'static str;

struct In<'a> {
    b: &'a [u8],
    p: usize,
}

impl In<'_> {
    fn byte(&mut self) -> Result<usize, LzoError> {
        let v = *self.b.get(self.p).ok_or("input overrun")?;
        self.p += 1;
        Ok(v as usize)
    }
    fn le16(&mut self) -> Result<usize, LzoError> {
        Ok(self.byte()? | (self.byte()? << 8))
    }
    /// A run length: zero bytes add 255 each, then `base` plus the next byte.
    fn run(&mut self, base: usize) -> Result<usize, LzoError> {
        let mut zeros = 0usize;
        // Bounded by the input's length.
        while self.b.get(self.p) == Some(&0) {
            self.p += 1;
            zeros += 1;
        }
        Ok(zeros * 255 + base + self.byte()?)
    }
}

fn literals(inp: &mut In, out: &mut Vec<u8>, n: usize, max: usize) -> Result<(), LzoError> {
    let end = inp
        .p
        .checked_add(n)
        .filter(|&e| e <= inp.b.len())
        .ok_or("input overrun")?;
    if out.len() + n > max {
        return Err("output overrun");
    }
    out.extend_from_slice(&inp.b[inp.p..end]);
    inp.p = end;
    Ok(())
}

fn copy_match(out: &mut Vec<u8>, dist: usize, n: usize, max: usize) -> Result<(), LzoError> {
    if dist == 0 || dist > out.len() {
        return Err("lookbehind overrun");
    }
    if out.len() + n > max {
        return Err("output overrun");
    }
    let from = out.len() - dist;
    // Byte by byte: a match may overlap its own output.
    for i in 0..n {
        let c = out[from + i];
        out.push(c);
    }
    Ok(())
}

/// Decode an LZO1X stream of at most `max` bytes.
pub fn decompress(src: &[u8], max: usize) -> Result<Vec<u8>, LzoError> {
    let mut out = Vec::with_capacity(max);
    let mut inp = In { b: src, p: 0 };
    // 0: after a match with no literals; 1..3: after that many literals; 4: after a run.
    let mut state;
    let first = inp.byte()?;
    if first > 17 {
        let t = first - 17;
        literals(&mut inp, &mut out, t, max)?;
        state = if t < 4 { t } else { 4 };
    } else {
        inp.p = 0;
        state = 0;
    }
    // Bounded: every round consumes at least one input byte.
    loop {
        let t = inp.byte()?;
        let next;
        if t < 16 {
            match state {
                0 => {
                    let n = if t == 0 { inp.run(15)? } else { t } + 3;
                    literals(&mut inp, &mut out, n, max)?;
                    state = 4;
                    continue;
                }
                4 => {
                    next = t & 3;
                    let dist = 1 + 0x0800 + (t >> 2) + (inp.byte()? << 2);
                    copy_match(&mut out, dist, 3, max)?;
                }
                _ => {
                    next = t & 3;
                    let dist = 1 + (t >> 2) + (inp.byte()? << 2);
                    copy_match(&mut out, dist, 2, max)?;
                }
            }
        } else if t >= 64 {
            next = t & 3;
            let dist = 1 + ((t >> 2) & 7) + (inp.byte()? << 3);
            copy_match(&mut out, dist, (t >> 5) + 1, max)?;
        } else if t >= 32 {
            let n = if t & 31 == 0 { inp.run(31)? } else { t & 31 } + 2;
            let d = inp.le16()?;
            next = d & 3;
            copy_match(&mut out, 1 + (d >> 2), n, max)?;
        } else {
            let n = if t & 7 == 0 { inp.run(7)? } else { t & 7 } + 2;
            let d = inp.le16()?;
            let dist = ((t & 8) << 11) + (d >> 2);
            if dist == 0 {
                // The end marker.
                return Ok(out);
            }
            next = d & 3;
            copy_match(&mut out, dist + 0x4000, n, max)?;
        }
        state = next;
        literals(&mut inp, &mut out, next, max)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_lzokay_encodes_and_refuses_garbage() {
        let mut data = Vec::new();
        for i in 0..20000u32 {
            data.extend_from_slice(format!("line {} {}\n", i % 97, i / 13).as_bytes());
        }
        data.extend(std::iter::repeat_n(0u8, 5000));
        data.extend((0..3000u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8));
        let c = lzokay_native::compress(&data).expect("compress");
        assert_eq!(decompress(&c, data.len()).expect("decode"), data);
        assert_eq!(decompress(&c, data.len() - 1), Err("output overrun"));
        assert!(decompress(&c[..c.len() / 2], data.len()).is_err());
        // Every single-byte corruption decodes to an error or to some bytes: no panic.
        for i in (0..c.len()).step_by(7) {
            let mut b = c.clone();
            b[i] ^= 0xa5;
            let _ = decompress(&b, data.len());
        }
    }
}

//! Extended attributes (format doc §4).

use crate::le::*;

/// Inline area header size (`h_name_filter`, `h_shared_count`, reserved).
pub const IBODY_HEADER_SIZE: usize = 12;
pub const ENTRY_HEADER_SIZE: usize = 4;

pub const INDEX_USER: u8 = 1;
pub const INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const INDEX_TRUSTED: u8 = 4;
pub const INDEX_LUSTRE: u8 = 5;
pub const INDEX_SECURITY: u8 = 6;
/// `e_name_index` bit 7: the low 7 bits index the long-prefix table.
pub const LONG_PREFIX_FLAG: u8 = 0x80;
pub const LONG_PREFIX_INDEX_MASK: u8 = 0x7F;

/// Bloom filter seed (doc §4.7): `xxh32(suffix, FILTER_SEED + base_index)`.
pub const FILTER_SEED: u32 = 0x25BB_E08F;
pub const FILTER_BITS: u32 = 32;

/// The short prefixes in the order mkfs matches them.
pub const SHORT_PREFIXES: [(u8, &[u8]); 6] = [
    (INDEX_USER, b"user."),
    (INDEX_POSIX_ACL_ACCESS, b"system.posix_acl_access"),
    (INDEX_POSIX_ACL_DEFAULT, b"system.posix_acl_default"),
    (INDEX_TRUSTED, b"trusted."),
    (INDEX_LUSTRE, b"lustre."),
    (INDEX_SECURITY, b"security."),
];

/// Full-name prefix of a short index.
pub fn short_prefix(index: u8) -> Option<&'static [u8]> {
    SHORT_PREFIXES
        .iter()
        .find(|(i, _)| *i == index)
        .map(|(_, p)| *p)
}

/// Split a full xattr name into (short index, suffix). ACL names must match exactly.
pub fn split_name(name: &[u8]) -> Option<(u8, &[u8])> {
    for &(idx, p) in SHORT_PREFIXES.iter() {
        if idx == INDEX_POSIX_ACL_ACCESS || idx == INDEX_POSIX_ACL_DEFAULT {
            if name == p {
                return Some((idx, &[]));
            }
        } else if let Some(rest) = name.strip_prefix(p) {
            return Some((idx, rest));
        }
    }
    None
}

/// Bloom filter bit (0..31) for a name given by its short index and suffix.
pub fn filter_bit(base_index: u8, suffix: &[u8]) -> u32 {
    crate::xxh32::xxh32(suffix, FILTER_SEED.wrapping_add(u32::from(base_index))) & (FILTER_BITS - 1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbodyHeader {
    pub name_filter: u32,
    pub shared_count: u8,
}

impl IbodyHeader {
    pub fn parse(b: &[u8; IBODY_HEADER_SIZE]) -> Self {
        IbodyHeader {
            name_filter: u32_at(b, 0),
            shared_count: b[4],
        }
    }
    pub fn encode(&self) -> [u8; IBODY_HEADER_SIZE] {
        let mut b = [0u8; IBODY_HEADER_SIZE];
        put_u32(&mut b, 0, self.name_filter);
        b[4] = self.shared_count;
        b
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    pub name_len: u8,
    pub name_index: u8,
    pub value_size: u16,
}

impl EntryHeader {
    pub fn parse(b: &[u8; ENTRY_HEADER_SIZE]) -> Self {
        EntryHeader {
            name_len: b[0],
            name_index: b[1],
            value_size: u16_at(b, 2),
        }
    }
    pub fn encode(&self) -> [u8; ENTRY_HEADER_SIZE] {
        let mut b = [0u8; ENTRY_HEADER_SIZE];
        b[0] = self.name_len;
        b[1] = self.name_index;
        put_u16(&mut b, 2, self.value_size);
        b
    }
    /// Entry size including padding to 4 bytes.
    pub fn entry_size(&self) -> usize {
        round_up4(ENTRY_HEADER_SIZE + usize::from(self.name_len) + usize::from(self.value_size))
    }
}

pub fn round_up4(x: usize) -> usize {
    (x + 3) & !3
}

/// Encode one entry (header + suffix + value + padding).
pub fn encode_entry(name_index: u8, suffix: &[u8], value: &[u8]) -> Option<Vec<u8>> {
    let h = EntryHeader {
        name_len: u8::try_from(suffix.len()).ok()?,
        name_index,
        value_size: u16::try_from(value.len()).ok()?,
    };
    let mut v = Vec::with_capacity(h.entry_size());
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(suffix);
    v.extend_from_slice(value);
    v.resize(h.entry_size(), 0);
    Some(v)
}

/// Most long prefixes an image may have (`e_name_index` keeps 7 bits for the index).
pub const MAX_LONG_PREFIXES: usize = 128;
/// Longest full long prefix mkfs.erofs accepts (its short prefix included).
pub const MAX_LONG_PREFIX_LEN: usize = 255;

/// A long name prefix (§4.6): the short prefix it extends (0: none, an internal
/// namespace the kernel does not list) and the bytes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongPrefix {
    pub base_index: u8,
    pub infix: Vec<u8>,
}

impl LongPrefix {
    /// The long prefix for the full prefix `full`: its base is the first short prefix
    /// `full` starts with (the ACL names included, as mkfs.erofs matches them).
    pub fn of(full: &[u8]) -> Self {
        for &(idx, p) in SHORT_PREFIXES.iter() {
            if let Some(rest) = full.strip_prefix(p) {
                return LongPrefix {
                    base_index: idx,
                    infix: rest.to_vec(),
                };
            }
        }
        LongPrefix {
            base_index: 0,
            infix: full.to_vec(),
        }
    }

    /// The stored suffix of `name` under this prefix: `name` must have the same short
    /// prefix ([`split_name`]; none for index 0) and go on with the infix.
    pub fn suffix_of<'a>(&self, name: &'a [u8]) -> Option<&'a [u8]> {
        let (idx, rest) = split_name(name).unwrap_or((0, name));
        if idx != self.base_index {
            return None;
        }
        rest.strip_prefix(self.infix.as_slice())
    }
}

/// The long-prefix table: per prefix a `u16` length, the base index and the infix,
/// each record starting 4-byte aligned (relative to the table, which starts aligned).
/// None when a prefix is longer than a record can say.
pub fn encode_prefix_table(prefixes: &[LongPrefix]) -> Option<Vec<u8>> {
    let mut t = Vec::new();
    for p in prefixes {
        let len = u16::try_from(1 + p.infix.len()).ok()?;
        t.extend_from_slice(&len.to_le_bytes());
        t.push(p.base_index);
        t.extend_from_slice(&p.infix);
        t.resize(round_up4(t.len()), 0);
    }
    Some(t)
}

/// Encode `name`'s entry with the longest of `prefixes` it goes on with (the first of
/// equally long ones; the long index), else with its short prefix (index 0 and the
/// whole name for none).
pub fn encode_named(name: &[u8], value: &[u8], prefixes: &[LongPrefix]) -> Option<Vec<u8>> {
    let mut best: Option<(usize, &[u8])> = None;
    for (i, p) in prefixes.iter().enumerate().take(MAX_LONG_PREFIXES) {
        if let Some(suffix) = p.suffix_of(name) {
            if best.is_none_or(|(_, s)| suffix.len() < s.len()) {
                best = Some((i, suffix));
            }
        }
    }
    if let Some((i, suffix)) = best {
        return encode_entry(LONG_PREFIX_FLAG | i as u8, suffix, value);
    }
    let (idx, suffix) = split_name(name).unwrap_or((0, name));
    encode_entry(idx, suffix, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn bit(name: &str) -> u32 {
        let (i, s) = split_name(name.as_bytes()).expect("known prefix");
        filter_bit(i, s)
    }
    #[test]
    fn filter_vectors_from_doc() {
        assert_eq!(bit("user.shared"), 27);
        assert_eq!(bit("user.unique"), 9);
        assert_eq!(bit("security.selinux"), 11);
        assert_eq!(bit("security.capability"), 29);
        assert_eq!(bit("trusted.overlay.opaque"), 20);
        assert_eq!(bit("trusted.overlay.redirect"), 17);
        assert_eq!(bit("system.posix_acl_access"), 30);
        assert_eq!(bit("system.posix_acl_default"), 21);
    }
    #[test]
    fn long_prefixes() {
        let ovl = LongPrefix::of(b"trusted.overlay.");
        assert_eq!(
            (ovl.base_index, ovl.infix.as_slice()),
            (INDEX_TRUSTED, &b"overlay."[..])
        );
        let fp = LongPrefix::of(b"erofs.fingerprint.v1");
        assert_eq!(
            (fp.base_index, fp.infix.as_slice()),
            (0, &b"erofs.fingerprint.v1"[..])
        );
        assert_eq!(
            ovl.suffix_of(b"trusted.overlay.redirect"),
            Some(&b"redirect"[..])
        );
        assert_eq!(ovl.suffix_of(b"trusted.overlay."), Some(&b""[..]));
        assert_eq!(ovl.suffix_of(b"user.overlay.redirect"), None);
        assert_eq!(fp.suffix_of(b"erofs.fingerprint.v1"), Some(&b""[..]));
        // Records: length 9 = base + "overlay.", then padding to 4.
        let t = encode_prefix_table(&[ovl.clone(), fp.clone()]).expect("table");
        let mut want = vec![9, 0, INDEX_TRUSTED];
        want.extend_from_slice(b"overlay.");
        want.push(0);
        want.extend_from_slice(&[21, 0, 0]);
        want.extend_from_slice(b"erofs.fingerprint.v1");
        want.push(0);
        assert_eq!(t, want);
        // The longest prefix that fits wins; others fall back to the short prefix.
        let trusted = LongPrefix::of(b"trusted.");
        let e = encode_named(
            b"trusted.overlay.opaque",
            b"y",
            &[fp.clone(), trusted, ovl.clone()],
        )
        .expect("entry");
        assert_eq!(&e[..4], &[6, 0x82, 1, 0]);
        assert_eq!(&e[4..11], b"opaquey");
        let e =
            encode_named(b"erofs.fingerprint.v1", b"z", &[ovl.clone(), fp.clone()]).expect("entry");
        assert_eq!(&e[..5], &[0, 0x81, 1, 0, b'z']);
        let e = encode_named(b"trusted.other", b"", &[ovl]).expect("entry");
        assert_eq!(&e[..4], &[5, INDEX_TRUSTED, 0, 0]);
    }
    #[test]
    fn acl_names_are_exact() {
        assert_eq!(split_name(b"system.posix_acl_accessX"), None);
        assert_eq!(split_name(b"system.foo"), None);
    }
}

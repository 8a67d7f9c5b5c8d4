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
    fn acl_names_are_exact() {
        assert_eq!(split_name(b"system.posix_acl_accessX"), None);
        assert_eq!(split_name(b"system.foo"), None);
    }
}

//! CRC32C (Castagnoli), as EROFS uses it for the superblock checksum.
//!
//! EROFS stores `crc32c_raw(0xFFFF_FFFF, bytes)`: the reflected CRC with initial value
//! all ones and **no final inversion** (format doc §1.3).

const POLY: u32 = 0x82F6_3B78;

const fn make_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}
static TABLE: [u32; 256] = make_table();

/// Raw CRC32C update: no pre/post inversion.
pub fn crc32c_raw(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    crc
}

/// The EROFS superblock checksum of `block` (checksum field must already be zeroed).
pub fn erofs_sb_checksum(block: &[u8]) -> u32 {
    crc32c_raw(0xFFFF_FFFF, block)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn standard_check_value() {
        // The standard CRC-32C of "123456789" is 0xE3069283 (with final inversion).
        assert_eq!(!crc32c_raw(0xFFFF_FFFF, b"123456789"), 0xE306_9283);
    }
    #[test]
    fn newer_kernel_seed_equivalence() {
        // Doc §1.3: the state after hashing magic + zeroed checksum is 0x5045B54A.
        assert_eq!(
            crc32c_raw(0xFFFF_FFFF, &[0xe2, 0xe1, 0xf5, 0xe0, 0, 0, 0, 0]),
            0x5045_B54A
        );
    }
}

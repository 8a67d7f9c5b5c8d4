//! Small formatting helpers: `ls -l` style modes, UTC times, byte strings.

use ferofs_format::inode::*;

/// `drwxr-xr-x`-style mode string.
pub fn mode_string(mode: u16) -> String {
    let t = match mode & S_IFMT {
        S_IFDIR => 'd',
        S_IFLNK => 'l',
        S_IFCHR => 'c',
        S_IFBLK => 'b',
        S_IFIFO => 'p',
        S_IFSOCK => 's',
        S_IFREG => '-',
        _ => '?',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ];
    for (i, (bit, ch)) in bits.iter().enumerate() {
        let set = mode & bit != 0;
        let special = match i {
            2 => Some((0o4000, 's', 'S')),
            5 => Some((0o2000, 's', 'S')),
            8 => Some((0o1000, 't', 'T')),
            _ => None,
        };
        match special {
            Some((sbit, lower, upper)) if mode & sbit != 0 => {
                s.push(if set { lower } else { upper })
            }
            _ => s.push(if set { *ch } else { '-' }),
        }
    }
    s
}

/// Type name for JSON / stat output.
pub fn type_name(mode: u16) -> &'static str {
    match mode & S_IFMT {
        S_IFDIR => "directory",
        S_IFLNK => "symlink",
        S_IFCHR => "char-device",
        S_IFBLK => "block-device",
        S_IFIFO => "fifo",
        S_IFSOCK => "socket",
        S_IFREG => "file",
        _ => "unknown",
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// RFC 3339 UTC time with nanoseconds when non-zero.
pub fn time_string(secs: i64, nsec: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    if nsec != 0 {
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{nsec:09}Z")
    } else {
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
    }
}

/// Bytes as text: UTF-8 as is, other bytes as `\xNN`.
pub fn bytes_display(b: &[u8]) -> String {
    let mut out = String::new();
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// Hex string.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Canonical UUID text.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h = hex(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn modes() {
        assert_eq!(mode_string(S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(S_IFREG | 0o7777), "-rwsrwsrwt");
        assert_eq!(mode_string(S_IFREG | 0o7000), "---S--S--T");
    }
    #[test]
    fn times() {
        assert_eq!(time_string(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(time_string(-1, 0), "1969-12-31T23:59:59Z");
        assert_eq!(
            time_string(1_700_000_000, 5),
            "2023-11-14T22:13:20.000000005Z"
        );
        assert_eq!(time_string(4_102_444_800, 0), "2100-01-01T00:00:00Z");
    }
}

//! Errors: I/O, Corrupt (with nid / offset / bad value), Unsupported, and lookup
//! failures. Corrupt and Unsupported are never mixed.

use std::fmt;

/// What is wrong with a corrupt image. Tests assert these exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptKind {
    /// The image is shorter than a structure it must contain.
    Truncated,
    BadMagic,
    BadChecksum,
    BadBlockSize,
    BadSuperblock,
    /// A nid points outside the image (or outside the metabox).
    NidOutOfRange,
    BadInodeFormat,
    BadLayout,
    BadInodeSize,
    /// A dirent's name offset is out of range or not increasing.
    BadNameoff,
    BadDirent,
    UnsortedDirectory,
    /// A directory contains one of its ancestors.
    DirectoryLoop,
    /// Deeper than the walk/lookup bound.
    TooDeep,
    BadXattr,
    BadChunk,
    BadInlineData,
    BadBlockAddress,
    BadComprConfig,
    BadDeviceTable,
    BadXattrPrefix,
    BadLcluster,
    BadPcluster,
    Decompress,
}

/// A corruption report: the kind plus where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub kind: CorruptKind,
    pub nid: Option<u64>,
    pub offset: Option<u64>,
    pub value: Option<u64>,
    pub detail: &'static str,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt image: {:?}", self.kind)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        if let Some(n) = self.nid {
            write!(f, ", nid {n}")?;
        }
        if let Some(o) = self.offset {
            write!(f, ", offset {o}")?;
        }
        if let Some(v) = self.value {
            write!(f, ", value {v} ({v:#x})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cause is part of the message (and not also the error's `source()`, which
    /// made `{:#}` chains print it twice).
    #[error("I/O error at image offset {offset}: {error}")]
    Io { offset: u64, error: std::io::Error },
    #[error("{0}")]
    Corrupt(Corruption),
    #[error("unsupported: {what}{}", .nid.map(|n| format!(" (nid {n})")).unwrap_or_default())]
    Unsupported { what: String, nid: Option<u64> },
    #[error("{path}: no such file or directory")]
    NotFound { path: String },
    #[error("{path}: not a directory")]
    NotADirectory { path: String },
    #[error("nid {nid}: {what}")]
    WrongType { nid: u64, what: &'static str },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The corruption kind, if this is a corruption.
    pub fn corrupt_kind(&self) -> Option<CorruptKind> {
        match self {
            Error::Corrupt(c) => Some(c.kind),
            _ => None,
        }
    }
    /// True for `Unsupported`.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }
    /// A file's data ended before its size.
    pub fn short_read(nid: u64, offset: u64, size: u64) -> Self {
        corrupt(
            CorruptKind::Truncated,
            Some(nid),
            Some(offset),
            Some(size),
            "file data ends before its size",
        )
    }
}

/// Build a corruption error.
pub fn corrupt(
    kind: CorruptKind,
    nid: Option<u64>,
    offset: Option<u64>,
    value: Option<u64>,
    detail: &'static str,
) -> Error {
    Error::Corrupt(Corruption {
        kind,
        nid,
        offset,
        value,
        detail,
    })
}

pub fn unsupported(what: impl Into<String>, nid: Option<u64>) -> Error {
    Error::Unsupported {
        what: what.into(),
        nid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cause of an I/O error is said once: in the message, not again as the
    /// error's source (which `{:#}` and error reporters print behind it).
    #[test]
    fn io_cause_is_said_once() {
        let e = Error::Io {
            offset: 4096,
            error: std::io::Error::other("disk on fire"),
        };
        assert_eq!(
            e.to_string(),
            "I/O error at image offset 4096: disk on fire"
        );
        assert!(std::error::Error::source(&e).is_none());
    }
}

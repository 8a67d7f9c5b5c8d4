//! ferofs-reader

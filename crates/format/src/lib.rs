//! ferofs-format

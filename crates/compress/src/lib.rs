//! ferofs-compress

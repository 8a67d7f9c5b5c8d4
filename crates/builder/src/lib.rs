//! ferofs-builder

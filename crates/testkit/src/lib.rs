//! ferofs-testkit

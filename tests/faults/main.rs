//! Store faults through the HTTP layer: lapsed leases, a TCP fault proxy, a Redis restart.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod lease;
mod proxy;
mod restart;

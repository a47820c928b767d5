//! Store faults: lapsed leases, a TCP fault proxy, a Redis restart (through the HTTP layer),
//! and Redis failing under a duplicate storm over two application processes: a Sentinel
//! failover, a partition of one process.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod failover;
mod lease;
mod proxy;
mod restart;

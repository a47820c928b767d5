//! Store faults: lapsed leases, a TCP fault proxy, a Redis restart (through the HTTP layer),
//! and a Redis Sentinel failover under a duplicate storm (through the engine).
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod failover;
mod lease;
mod proxy;
mod restart;

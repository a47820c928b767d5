//! Store faults: lapsed leases, a TCP fault proxy, a Redis restart (through the HTTP layer),
//! a Redis Sentinel failover under a duplicate storm (through the engine), and a PostgreSQL
//! server killed under a duplicate storm over two application processes.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod failover;
mod lease;
mod postgres;
mod proxy;
mod restart;

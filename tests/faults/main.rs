//! Store faults: lapsed leases, SQLite application processes killed (after a 201, inside a
//! transaction), a TCP fault proxy, a Redis restart (through the HTTP layer),
//! Redis failing under a duplicate storm over two application processes (a Sentinel failover,
//! a partition of one process), a PostgreSQL server killed under such a storm, and steps
//! finished by the next process after an application process was killed mid-checkout.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod fail_open;
mod failover;
mod lease;
mod postgres;
mod proxy;
mod restart;
mod sqlite;
mod steps;

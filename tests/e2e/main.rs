//! End to end: the quickstart binary as a child process, duplicate storms, two processes on Redis,
//! the transactional example on PostgreSQL.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod quickstart;
mod redis;
mod storm_memory;
mod storm_redis;
mod transactional;
mod waiting_redis;

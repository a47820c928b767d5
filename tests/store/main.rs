//! Every store against the contract: the conformance suite, bounds, a model, tampered records.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "test-util")]
mod custom_store;
mod encrypted_records;
mod encrypted_steps;
mod hostile_records;
mod memory_bound;
#[cfg(feature = "test-util")]
mod memory_metrics;
// The conformance suite needs the `test-util` feature (scripts/test.sh enables every feature).
mod memory_steps;
#[cfg(feature = "test-util")]
mod memory_store;
mod model_stores;
#[cfg(feature = "test-util")]
mod mysql_exchanges;
#[cfg(feature = "test-util")]
mod mysql_store;
#[cfg(feature = "test-util")]
mod mysql_within;
#[cfg(feature = "test-util")]
mod postgres_connections;
#[cfg(feature = "test-util")]
mod postgres_exchanges;
#[cfg(feature = "test-util")]
mod postgres_steps;
#[cfg(feature = "test-util")]
mod postgres_store;
#[cfg(feature = "test-util")]
mod postgres_within;
#[cfg(feature = "test-util")]
mod redis_cluster;
#[cfg(feature = "test-util")]
mod redis_replicas;
#[cfg(feature = "test-util")]
mod redis_sentinel;
#[cfg(feature = "test-util")]
mod redis_store;
mod secret_rotation;
mod security_at_rest;
#[cfg(feature = "test-util")]
mod sqlite_store;
#[cfg(feature = "test-util")]
mod sqlite_within;

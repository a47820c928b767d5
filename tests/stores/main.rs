//! Every store against the contract: the conformance suite, bounds, a model, tampered records.
//!
//! One test binary per door or store family (they build and link once); the helpers they share
//! live in `tests/support/`, mounted the same way by every binary.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod hostile_records;
mod memory_bound;
mod memory_store;
mod model_stores;
mod redis_cluster;
mod redis_store;
mod security_at_rest;

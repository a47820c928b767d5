//! The `#[idempotent]` attribute: routes over a real server, and trybuild compile tests.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod routes;
mod ui;

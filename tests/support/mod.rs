//! Helpers shared by the integration tests.

pub mod conformance;
pub mod redis_server;

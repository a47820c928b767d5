//! Helpers shared by the integration tests.

pub mod conformance;
pub mod http;
pub mod redis_server;

//! Helpers shared by the integration tests, mounted by every test binary as
//! `#[path = "../support/mod.rs"] mod support;`.
//!
//! - [`http`]: an axum app behind the layer on a real TCP server, a reqwest client, spy and
//!   fault stores;
//! - [`raw_http`]: the same, with raw HTTP/1.1 bytes for requests a client library refuses;
//! - [`apps`]: the load-style apps (in-process and the quickstart binary) for storms and faults;
//! - [`redis_server`]: `redis-server` (and clusters) spawned on free loopback ports;
//! - [`postgres_server`]: a PostgreSQL server (`initdb`, `pg_ctl`) on a free loopback port;
//! - [`proxy`]: a TCP proxy that injects latency, drops and black holes;
//! - [`pb`]: the vendored tonic code of the gRPC tests.

// Each binary uses a part of the helpers.
#![allow(dead_code, unreachable_pub, unused_imports, unused_macros)]

pub mod apps;
pub mod http;
pub mod postgres_server;
pub mod proxy;
pub mod raw_http;
pub mod redis_server;

#[cfg(feature = "tonic")]
#[path = "grpc/orders.v1.rs"]
#[allow(
    unreachable_pub,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    clippy::all
)]
pub mod pb;

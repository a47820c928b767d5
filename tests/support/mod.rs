//! Helpers shared by the integration tests, mounted by every test binary as
//! `#[path = "../support/mod.rs"] mod support;`.
//!
//! - [`http`]: the test server (axum on a real TCP port), the test handler and its counters,
//!   the client and its answers, the demo authentication, the spy (and fault) store;
//! - [`raw_http`]: raw HTTP/1.1 bytes to that server, for requests a client library refuses;
//! - [`apps`]: load over the in-process app or quickstart processes: storms, answer mixes;
//! - [`child`]: this test binary as a child process (an application to kill), and its output;
//! - [`quickstart`]: the built quickstart example as a child process (memory store or Redis);
//! - [`metrics`]: the crate's counters read back from the debugging recorder (feature `metrics`);
//! - [`nats_server`]: `nats-server -js` on a free loopback port with a temporary store;
//! - [`ports`], [`servers`]: one free loopback port picker; the switch that makes a missing
//!   server a failure (`TOWER_IDEMPOTENCY_REQUIRE_SERVERS`), server directories, watchdogs;
//! - [`stores`]: the per-store matrix ([`per_store!`](stores::per_store)): one test per store;
//! - [`redis_server`]: `redis-server` (and clusters) spawned on free loopback ports;
//! - [`redis_sentinel`]: a primary, a replica and three `redis-sentinel` processes on loopback;
//! - [`postgres_server`]: a PostgreSQL server (`initdb`, `pg_ctl`) on a free loopback port;
//! - [`sqlite_file`]: a SQLite file in a temporary directory of its own, removed after;
//! - [`smtp_server`]: an SMTP server (`python3-aiosmtpd`) on a free loopback port;
//! - [`observed`]: a store wrapper that reports how each claim and complete ended;
//! - [`proxy`]: a TCP proxy that injects latency, drops and black holes;
//! - [`pb`]: the vendored tonic code of the gRPC tests.

// Each binary uses a part of the helpers: what one binary leaves unused is dead code there.
#![allow(dead_code)]

pub(crate) mod apps;
pub(crate) mod child;
pub(crate) mod http;
pub(crate) mod mariadb_server;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
pub(crate) mod nats_server;
pub(crate) mod observed;
pub(crate) mod ports;
pub(crate) mod postgres_server;
pub(crate) mod proxy;
pub(crate) mod quickstart;
pub(crate) mod raw_http;
pub(crate) mod redis_sentinel;
pub(crate) mod redis_server;
pub(crate) mod servers;
pub(crate) mod smtp_server;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite_file;
pub(crate) mod stores;

#[cfg(feature = "tonic")]
#[path = "grpc/orders.v1.rs"]
#[allow(
    unreachable_pub,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    clippy::all
)]
pub(crate) mod pb;

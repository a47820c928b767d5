//! The helpers these tests share with the server crate's suites, mounted from
//! `tests/support` of the workspace root: one copy of each.

#[path = "../../../tests/support/http.rs"]
pub(crate) mod http;
#[path = "../../../tests/support/ports.rs"]
pub(crate) mod ports;
#[path = "../../../tests/support/proxy.rs"]
pub(crate) mod proxy;
// Its Redis connection helpers are for the store suites (feature `redis` of the server crate).
#[allow(unexpected_cfgs)]
#[path = "../../../tests/support/redis_server.rs"]
pub(crate) mod redis_server;
#[path = "../../../tests/support/servers.rs"]
pub(crate) mod servers;

#[cfg(feature = "tonic")]
#[path = "../../../tests/support/grpc/orders.v1.rs"]
#[allow(
    unreachable_pub,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    clippy::all
)]
pub(crate) mod pb;

//! The HTTP door over real servers: the layer, replay, rejections, extractors and gRPC.
//!
//! One test binary per door or store family: each builds and links once. The helpers they
//! share live in `tests/support/`, mounted the same way by every binary.

#[path = "../support/mod.rs"]
mod support;

mod abandoned;
mod concurrency;
mod cors;
mod declared;
mod declared_bodies;
mod detached;
mod durations;
mod extractors;
mod fingerprint_options;
mod forget;
mod fuzz_standins;
mod grpc;
mod hostile_input;
#[cfg(feature = "json")]
mod json;
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
mod openapi;
mod openapi_aide;
mod rejections;
mod replay;
mod steps;
mod store_hangs;
mod streaming;
mod waiting;

//! The message door: its outcomes over the memory and Redis stores, and its adapters.
//!
//! The NATS adapter runs against a real `nats-server`. A redelivery storm runs over two
//! consumer processes. Under a duplicate storm, a JetStream consumer process is killed
//! mid-handler, and `nats-server` is killed and restarted mid-stream. The apalis adapter runs
//! on a real `redis-server`.
//!
//! One test binary for the door: it builds and links once. The helpers it shares with the
//! other binaries live in `tests/support/`.

#[path = "../support/mod.rs"]
mod support;

mod apalis;
mod crash;
mod nats;
mod outcomes;
mod restart;
mod steps;
mod storm;

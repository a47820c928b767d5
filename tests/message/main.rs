//! The message door: its outcomes over the memory and Redis stores, the NATS JetStream adapter
//! against a real `nats-server`, a redelivery storm over two consumer processes, and a JetStream
//! consumer process killed mid-handler.
//!
//! One test binary for the door (it builds and links once); the helpers it shares with the
//! other binaries live in `tests/support/`.

#[path = "../support/mod.rs"]
mod support;

mod apalis;
mod crash;
mod nats;
mod outcomes;
mod storm;

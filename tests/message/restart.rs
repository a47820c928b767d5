//! `nats-server` killed with SIGKILL mid-stream and started again on the same port and file
//! store, while three consumer processes handle a duplicate storm and a publisher still
//! publishes. The consumers, the publisher, the door and the adapter keep every default. They must carry
//! on by themselves once the server is back: no side effect lost, none done twice, nothing
//! left half done. The machinery is [`crash`](super::crash)'s; only the fault differs.
//!
//! The CI case shortens the server's `ack_wait` (2 s) and the engine's lease (6 s), and is
//! named so: acks lost around the kill wait for `ack_wait`, 30 s by default, on a server whose
//! clock cannot be paused. The figure run keeps every default:
//!
//! ```text
//! TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1 cargo test -p tower-idempotency --all-features \
//!     --test message -- --ignored --exact restart::restart_figure_with_every_default --nocapture
//! ```
//!
//! Size: `CRASH_MESSAGES` (default 300) × `CRASH_COPIES` (default 3); the server stays down
//! `RESTART_DOWN_MS` (default 2000).
#![cfg(all(feature = "nats", feature = "redis"))]
#![allow(clippy::unwrap_used)]

use crate::crash::{Fault, Figures, assert_nothing_lost, default_plan, fault_run, short_plan};
use crate::storm::env_or;
use std::time::Duration;

fn down() -> Fault {
    let ms = env_or("RESTART_DOWN_MS", 2000);
    Fault::RestartServer {
        down: Duration::from_millis(ms as u64),
    }
}

/// A restart interrupts no run and stores every acknowledged publish: nothing runs twice.
fn assert_nothing_twice(f: &Figures) {
    assert_eq!(
        f.not_stored, 0,
        "the server kept every acknowledged publish: {f:#?}"
    );
    assert_eq!(f.extra_runs, 0, "no message ran twice: {f:#?}");
    assert_eq!(f.duplicate_effects, 0, "no side effect done twice: {f:#?}");
    assert!(
        f.first_ack.is_some(),
        "messages delivered after the restart ran: {f:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restarted_mid_stream_with_a_short_lease_and_ack_wait_loses_nothing() {
    let messages = env_or("CRASH_MESSAGES", 300);
    let copies = env_or("CRASH_COPIES", 3);
    let Some(f) = fault_run(short_plan(messages, copies, down())).await else {
        return;
    };
    assert_nothing_lost(&f);
    assert_nothing_twice(&f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the RELIABILITY figure, with the server's and the engine's defaults"]
async fn restart_figure_with_every_default() {
    let messages = env_or("CRASH_MESSAGES", 300);
    let copies = env_or("CRASH_COPIES", 3);
    let Some(f) = fault_run(default_plan(messages, copies, down())).await else {
        return;
    };
    assert_nothing_lost(&f);
    assert_nothing_twice(&f);
}

//! The webhook door end to end: each sender's deliveries, signed as the sender signs them,
//! through axum on a real TCP port; forged and stale deliveries; concurrent and failed
//! deliveries; redelivery after a restart over Redis; each sender's retention.
//!
//! ```text
//! cargo test -p tower-idempotency --all-features --test webhook
//! ```

#[path = "../support/mod.rs"]
mod support;

mod app;
mod deliveries;
mod metrics;
mod redis;
mod retention;
mod sign;

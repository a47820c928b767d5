//! The client door against the real server layer: both client stacks (`RetryMiddleware` on
//! reqwest, `StampKeyLayer` + `RetryPolicy` on a hyper-util client) call the in-process app
//! behind `IdempotencyLayer` with `MemoryStore` and with `RedisStore` (a `redis-server` on a
//! free loopback port), through the TCP fault proxy of `tests/support/proxy.rs`.
//!
//! Every scenario in `scenarios.rs` runs once per store and stack
//! (`memory_tower::…`, `memory_reqwest::…`, `redis_tower::…`, `redis_reqwest::…`):
//!
//! ```text
//! cargo test --features reqwest,redis,tonic --test client
//! ```
//!
//! `grpc.rs` runs the tower stack on a tonic channel against a tonic server (feature `tonic`).
//!
//! A binary of its own rather than a module of `tests/faults`: the client is a door of its own
//! (one binary per door or store family), and its tests need the `reqwest` feature where the
//! store-fault tests need `redis` only.

#[path = "../support/mod.rs"]
mod support;

mod defaults;
mod grpc;
mod rig;
mod scenarios;

/// Expands every scenario for one store and one stack, as a module of tests.
macro_rules! scenarios {
    ($module:ident, $backend:expr, $stack:expr) => {
        mod $module {
            use crate::rig::{Backend, Stack};
            use crate::scenarios as s;

            scenarios!(@tests $backend, $stack;
                answer_lost_after_the_handler_ran_is_replayed,
                reset_connection_is_retried_and_replayed,
                answer_delayed_past_the_attempt_timeout_is_replayed,
                in_flight_409_is_retried_after_its_retry_after,
                key_reused_422_is_not_retried,
                post_without_a_key_is_not_retried,
                server_errors_are_retried_with_one_key_until_max_attempts,
                a_key_given_by_the_caller_is_kept,
            );
        }
    };
    (@tests $backend:expr, $stack:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                s::$name($backend, $stack).await;
            }
        )*
    };
}

scenarios!(memory_tower, Backend::Memory, Stack::Tower);
#[cfg(feature = "reqwest")]
scenarios!(memory_reqwest, Backend::Memory, Stack::Reqwest);
#[cfg(feature = "redis")]
scenarios!(redis_tower, Backend::Redis, Stack::Tower);
#[cfg(all(feature = "redis", feature = "reqwest"))]
scenarios!(redis_reqwest, Backend::Redis, Stack::Reqwest);

/// Expands every test of `defaults.rs` for one stack.
macro_rules! defaults {
    ($module:ident, $stack:expr; $($name:ident),* $(,)?) => {
        mod $module {
            use crate::defaults as d;
            use crate::rig::Stack;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    d::$name($stack).await;
                }
            )*
        }
    };
}

macro_rules! all_defaults {
    ($module:ident, $stack:expr) => {
        defaults!($module, $stack;
            lost_answer_from_a_server_that_ignores_keys_is_not_retried,
            server_error_from_a_server_that_ignores_keys_is_not_retried,
            refused_connect_is_retried_to_any_server,
            give_up_error_carries_the_key_to_resume_under,
            permanent_server_errors_are_not_retried,
        );
    };
}

all_defaults!(defaults_tower, Stack::Tower);
#[cfg(feature = "reqwest")]
all_defaults!(defaults_reqwest, Stack::Reqwest);

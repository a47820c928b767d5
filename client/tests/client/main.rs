//! The client against the real server layer. Both stacks call the in-process app behind
//! `IdempotencyLayer`: `RetryMiddleware` on reqwest, and `StampKeyLayer` with `RetryPolicy`
//! on a hyper-util client. The app keeps its records in `MemoryStore`, or in `RedisStore` on a
//! `redis-server` at a free loopback port. Calls go through the TCP fault proxy of
//! `tests/support/proxy.rs`.
//!
//! Every scenario in `scenarios.rs` runs once per store and stack: `memory_tower::…`,
//! `memory_reqwest::…`, `redis_tower::…`, `redis_reqwest::…`.
//!
//! ```text
//! cargo test -p tower-idempotency-client --all-features --test client
//! ```
//!
//! `grpc.rs` runs the tower stack on a tonic channel against a tonic server (feature `tonic`).
//! The helpers come from the workspace's `tests/support`, mounted by `support.rs`.

// Without `hyper-util` and `reqwest` some scenarios and helpers go unused.
#![cfg_attr(
    not(all(feature = "hyper-util", feature = "reqwest")),
    allow(dead_code, unused_macros)
)]

#[allow(dead_code)]
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
scenarios!(redis_tower, Backend::Redis, Stack::Tower);
#[cfg(feature = "reqwest")]
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

// The tower stack tells a failed connect from a lost answer by hyper-util's error.
#[cfg(feature = "hyper-util")]
all_defaults!(defaults_tower, Stack::Tower);
#[cfg(feature = "reqwest")]
all_defaults!(defaults_reqwest, Stack::Reqwest);

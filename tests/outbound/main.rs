//! The outbound door: a job that runs twice sends once.
//!
//! - `door.rs`: every outcome of the generic `SendOnce` over a scripted provider, once per
//!   store (`memory::…` over `MemoryStore`, `redis::…` under a prefix of its own on the
//!   binary's one `redis-server`), each store wrapped in the spy store that can fail claims
//!   and completes (`support::stores::per_store!`);
//! - `http_calls.rs`: the HTTP adapter over hyper-util's client against local stubs (one that
//!   answers, one that reads the body and closes, one that refuses connections);
//! - `crash.rs`: a sending process killed with SIGKILL after its request went out, and a
//!   second process's retry with the same key over the same Redis;
//! - `mail.rs` (feature `lettre`): lettre's SMTP transport against a real SMTP server
//!   (Debian's `python3-aiosmtpd`, `tests/support/smtp_server.py`).
//!
//! ```text
//! cargo test -p tower-idempotency --features redis,lettre,json,hyper-util --test outbound
//! ```

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod crash;
mod door;
mod http_calls;
#[cfg(feature = "lettre")]
mod mail;
mod rig;
mod slow;

use support::http::SpyStore;
use support::stores::per_store;

per_store!([memory: memory, redis: redis] door, SpyStore::wrap;
    sends_once_and_replays_the_receipt,
    a_send_in_flight_is_answered_in_flight,
    the_key_with_another_request_is_key_reused,
    a_refused_connection_releases_the_key_and_the_retry_sends,
    a_rejection_releases_the_key,
    a_reset_mid_exchange_is_unknown_and_the_retry_does_not_send,
    an_unknown_delivery_is_held_for_the_hold_time,
    a_send_dropped_after_it_began_keeps_its_key,
    a_failed_claim_fails_retryable_and_sends_nothing,
    a_failed_complete_still_returns_the_receipt,
    a_request_without_a_key_is_sent_every_time,
    require_key_refuses_a_request_without_a_key,
    an_unreachable_host_after_sending_holds_the_key,
    a_receipt_over_the_record_limit_is_held_not_refused,
    an_operator_frees_a_held_key_with_forget,
    an_invalid_key_is_refused_before_sending,
    a_record_of_another_door_is_not_replayed,
);

per_store!([memory_http: memory, redis_http: redis] http_calls, SpyStore::wrap;
    a_webhook_sent_twice_is_delivered_once,
    a_stub_that_reads_the_body_and_closes_is_unknown,
    a_refused_connection_is_released_and_the_retry_sends,
    the_inbound_derived_key_is_forwarded,
    a_429_releases_and_a_500_holds,
    a_timeout_after_the_request_was_written_is_unknown,
    another_body_under_the_key_is_key_reused_and_a_failed_claim_sends_nothing,
    a_call_dropped_after_it_was_written_keeps_its_key,
    a_303_after_a_create_is_kept_as_the_receipt,
    a_503_holds_unless_it_says_when_to_come_back,
    an_unreachable_host_after_the_request_went_is_unknown,
    a_response_over_the_record_limit_is_kept_without_its_body,
);

#[cfg(feature = "lettre")]
per_store!([memory_mail: memory, redis_mail: redis] mail, SpyStore::wrap;
    a_job_that_runs_twice_delivers_one_message,
    a_server_that_stalls_after_data_is_unknown_and_the_retry_does_not_send,
    a_refused_connection_is_released_and_the_retry_sends,
    a_transient_reply_releases_the_key_and_a_permanent_one_is_final,
    a_key_from_the_caller_or_the_message_id,
    another_message_under_the_key_is_key_reused_and_a_failed_claim_sends_nothing,
    key_from_message_id_refuses_a_message_without_one,
    one_job_key_for_a_mail_and_a_charge_is_two_keys,
);

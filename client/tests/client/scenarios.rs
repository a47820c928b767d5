//! The rules of the client door, each against the real server layer through the fault proxy.
//! Each function is one test, expanded per store and stack in `main.rs`.

use crate::rig::{Backend, Call, Rig, Stack};
use crate::support::http::bounded;
use crate::support::proxy::Cut;
use http::StatusCode;
use std::time::Duration;
use tower_idempotency_client::StopReason;

async fn rig(backend: Backend, stack: Stack) -> Option<Rig> {
    Rig::start(backend, stack).await
}

/// The handler ran, its answer was lost on the way back (the connection closed): the retry
/// sends the same key and gets the first run's answer, replayed; the handler ran once.
pub(crate) async fn answer_lost_after_the_handler_ran_is_replayed(backend: Backend, stack: Stack) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    rig.proxy.cut_responses(1, Cut::Close);
    let reply = rig
        .call(&Call::post("book"))
        .await
        .expect("the retry succeeds");
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
    let attempts = reply.attempts();
    assert_eq!(
        attempts.count(),
        2,
        "one lost answer, one retry: {}",
        reply.describe()
    );
    assert!(
        attempts.replayed(),
        "the retry is answered from the record: {}",
        reply.describe()
    );
    assert_eq!(attempts.reason(), StopReason::Final);
    assert_eq!(
        reply.key().len(),
        36,
        "a stamped UUID key: {}",
        reply.describe()
    );
    assert_eq!(rig.work.runs_of(&reply.key()), 1, "the handler ran once");
    assert_eq!(rig.work.executions(), 1, "no other run");
    assert_eq!(rig.proxy.cuts_left(), 0, "the answer was cut");
}

/// The connection is reset after the handler ran: retried with the same key, replayed.
pub(crate) async fn reset_connection_is_retried_and_replayed(backend: Backend, stack: Stack) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    rig.proxy.cut_responses(1, Cut::Reset);
    let reply = rig
        .call(&Call::post("pen"))
        .await
        .expect("the retry succeeds");
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
    assert_eq!(reply.attempts().count(), 2, "{}", reply.describe());
    assert!(reply.attempts().replayed(), "{}", reply.describe());
    assert_eq!(rig.work.executions(), 1, "the handler ran once");
}

/// The handler ran and its answer was recorded, but the answer is slow to come back: the
/// attempt times out, the retry (same key) is answered from the record.
pub(crate) async fn answer_delayed_past_the_attempt_timeout_is_replayed(
    backend: Backend,
    stack: Stack,
) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    rig.proxy.hold_responses(1, Duration::from_secs(3));
    let call = Call::post("lamp").attempt_timeout(Duration::from_millis(500));
    let reply = rig.call(&call).await.expect("the retry succeeds");
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
    assert_eq!(reply.attempts().count(), 2, "{}", reply.describe());
    assert!(reply.attempts().replayed(), "{}", reply.describe());
    assert!(
        reply.elapsed < Duration::from_secs(3),
        "the retry did not wait for the held answer: {}",
        reply.describe()
    );
    assert_eq!(rig.work.executions(), 1, "the handler ran once");
}

/// The same request is still running under the key (another client's attempt): the server
/// answers 409 with `Retry-After: 1`; the client waits that long, retries, and gets the first
/// run's answer. The 409 refused the attempt (nothing ran), so it is retried even though the
/// policy declares no server as honouring keys.
pub(crate) async fn in_flight_409_is_retried_after_its_retry_after(backend: Backend, stack: Stack) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    let key = "order-409";
    let call = Call::post("desk")
        .key(key)
        .header("x-gate", "desk")
        .undeclared();
    let first = tokio::spawn(rig.direct(&call, key).send());
    rig.work.wait_runs(key, 1).await;
    let open_soon = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rig.work.open("desk");
    };
    let (reply, ()) = tokio::join!(rig.call(&call), open_soon);
    let reply = reply.expect("the retry succeeds");
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
    assert_eq!(
        reply.attempts().count(),
        2,
        "409, then the replay: {}",
        reply.describe()
    );
    assert!(reply.attempts().replayed(), "{}", reply.describe());
    assert!(
        reply.elapsed >= Duration::from_secs(1),
        "the retry waited for Retry-After: 1: {}",
        reply.describe()
    );
    let first = bounded(Duration::from_secs(10), "the first request", first)
        .await
        .expect("the first request's task")
        .expect("the first request");
    assert_eq!(first.status().as_u16(), 201);
    assert_eq!(rig.work.runs_of(key), 1, "the handler ran once");
}

/// The key was used for another request: 422 `idempotency.key_reused` is returned at once,
/// with its problem details, and not retried.
pub(crate) async fn key_reused_422_is_not_retried(backend: Backend, stack: Stack) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    let key = "order-422";
    let first = rig
        .direct(&Call::post("chair"), key)
        .send()
        .await
        .expect("first");
    assert_eq!(first.status().as_u16(), 201);
    let accepted = rig.proxy.accepted();
    let reply = rig
        .call(&Call::post("table").key(key))
        .await
        .expect("an answer");
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.describe()
    );
    assert_eq!(
        reply.json()["code"],
        "idempotency.key_reused",
        "{}",
        reply.describe()
    );
    assert_eq!(
        reply.headers["content-type"], "application/problem+json",
        "the problem details reach the caller"
    );
    assert_eq!(reply.attempts().count(), 1, "{}", reply.describe());
    assert_eq!(reply.attempts().reason(), StopReason::Final);
    assert!(!reply.attempts().replayed());
    assert_eq!(
        rig.proxy.accepted(),
        accepted + 1,
        "one connection, one attempt"
    );
    assert_eq!(rig.work.executions(), 1, "only the first request ran");
}

/// A POST without a key is never retried, whatever happens to it: its answer is lost and
/// the caller gets the error, after one attempt.
pub(crate) async fn post_without_a_key_is_not_retried(backend: Backend, stack: Stack) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    rig.proxy.cut_responses(1, Cut::Close);
    let result = rig.call(&Call::post("cup").unstamped()).await;
    assert!(
        result.is_err(),
        "the lost answer is the caller's error: {result:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rig.proxy.accepted(), 1, "one attempt only");
    assert_eq!(rig.proxy.cuts_left(), 0);
}

/// 503 from the handler is released by the server, so every retry runs the handler again,
/// always under the one key; the client stops after `max_attempts` (4) and returns the 503.
pub(crate) async fn server_errors_are_retried_with_one_key_until_max_attempts(
    backend: Backend,
    stack: Stack,
) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    let reply = rig
        .call(&Call::post("vase").header("x-status", "503"))
        .await
        .expect("an answer");
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.describe()
    );
    assert_eq!(reply.attempts().count(), 4, "{}", reply.describe());
    assert_eq!(reply.attempts().reason(), StopReason::AttemptsExhausted);
    assert_eq!(rig.work.runs_of(&reply.key()), 4, "four attempts, one key");
    assert_eq!(rig.work.executions(), 4);
}

/// A key the caller gives is kept (not replaced by a stamped one) on every attempt.
pub(crate) async fn a_key_given_by_the_caller_is_kept(backend: Backend, stack: Stack) {
    let Some(rig) = rig(backend, stack).await else {
        return;
    };
    rig.proxy.cut_responses(1, Cut::Close);
    let key = "caller-chosen-key-7";
    let reply = rig
        .call(&Call::post("rug").key(key))
        .await
        .expect("the retry succeeds");
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
    assert_eq!(reply.key(), key, "{}", reply.describe());
    assert!(reply.attempts().replayed(), "{}", reply.describe());
    assert_eq!(rig.work.runs_of(key), 1);
    assert_eq!(rig.work.executions(), 1);
}

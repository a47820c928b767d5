//! The client's defaults against servers that honour keys and servers that ignore them: a
//! POST is repeated only where a repeat cannot run its work twice, and when the attempts end
//! in an error the caller gets the attempts and the key to resume under. Each function is one
//! test, expanded per stack in `main.rs`.

use crate::rig::{Backend, Call, Rig, Stack};
use crate::support::proxy::Cut;
use http::StatusCode;
use std::time::Duration;
use tower_idempotency_client::{RetryErrorKind, StopReason};

/// A server without the layer runs every request. The answer to a stamped POST is lost after
/// the handler ran: with the default policy (no server declared to honour keys) the client
/// does not send it again, and the caller's error carries the key to resume under.
pub(crate) async fn lost_answer_from_a_server_that_ignores_keys_is_not_retried(stack: Stack) {
    let Some(rig) = Rig::start(Backend::IgnoresKeys, stack).await else {
        return;
    };
    rig.proxy.cut_responses(1, Cut::Close);
    let err = rig
        .call(&Call::post("kettle").undeclared())
        .await
        .expect_err("the lost answer is the caller's error");
    let (failure, attempts) = err.retry();
    assert_eq!(failure, RetryErrorKind::ConnectionLost, "{}", err.text);
    assert_eq!(attempts.count(), 1, "not sent again: {attempts:?}");
    assert_eq!(attempts.reason(), StopReason::NotHonoured);
    let key = attempts
        .key()
        .expect("the stamped key")
        .to_str()
        .expect("ASCII");
    assert_eq!(key.len(), 36, "a stamped UUID");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rig.work.executions(), 1, "the handler ran once, not twice");
    assert_eq!(rig.proxy.accepted(), 1, "one attempt");
}

/// A 503 from a server that ignores keys may follow a run: not retried by default.
pub(crate) async fn server_error_from_a_server_that_ignores_keys_is_not_retried(stack: Stack) {
    let Some(rig) = Rig::start(Backend::IgnoresKeys, stack).await else {
        return;
    };
    let reply = rig
        .call(&Call::post("toaster").header("x-status", "503").undeclared())
        .await
        .expect("an answer");
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.describe()
    );
    assert_eq!(reply.attempts().count(), 1, "{}", reply.describe());
    assert_eq!(reply.attempts().reason(), StopReason::NotHonoured);
    assert!(reply.attempts().key().is_some(), "the key to resume under");
    assert_eq!(rig.work.executions(), 1, "ran once");
}

/// A connect that fails sent nothing, so it is retried to any server, declared or not; when
/// the attempts run out the error says so, with the key every attempt carried.
pub(crate) async fn refused_connect_is_retried_to_any_server(stack: Stack) {
    let Some(rig) = Rig::start(Backend::IgnoresKeys, stack).await else {
        return;
    };
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let err = rig
        .call(
            &Call::post("mug")
                .undeclared()
                .to(format!("http://127.0.0.1:{closed}/work")),
        )
        .await
        .expect_err("nothing listens");
    let (failure, attempts) = err.retry();
    assert_eq!(failure, RetryErrorKind::Connect, "{}", err.text);
    assert_eq!(attempts.count(), 4, "every attempt: {attempts:?}");
    assert_eq!(attempts.reason(), StopReason::AttemptsExhausted);
    assert!(attempts.key().is_some());
}

/// Every answer is lost (the server honours keys, the network does not): the client gives up
/// after its attempts, and its error carries them and the key; the caller resumes later under
/// that key and gets the first run's answer, replayed.
pub(crate) async fn give_up_error_carries_the_key_to_resume_under(stack: Stack) {
    let Some(rig) = Rig::start(Backend::Memory, stack).await else {
        return;
    };
    rig.proxy.cut_responses(4, Cut::Reset);
    let call = Call::post("clock");
    let err = rig.call(&call).await.expect_err("every answer lost");
    let (failure, attempts) = err.retry();
    assert_eq!(failure, RetryErrorKind::ConnectionLost, "{}", err.text);
    assert_eq!(attempts.count(), 4, "{attempts:?}");
    assert_eq!(attempts.reason(), StopReason::AttemptsExhausted);
    let key = attempts
        .key()
        .expect("the key")
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(
        !err.text.contains(&key),
        "the key stays out of the error's Display and Debug: {}",
        err.text
    );
    let resumed = rig.direct(&call, &key).send().await.expect("resume");
    assert_eq!(resumed.status().as_u16(), 201);
    assert_eq!(
        resumed
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "answered from the first run's record"
    );
    assert_eq!(rig.work.runs_of(&key), 1, "the work ran once");
}

/// 501, 505 and 511 say the server cannot serve this request at all: not retried.
pub(crate) async fn permanent_server_errors_are_not_retried(stack: Stack) {
    let Some(rig) = Rig::start(Backend::Memory, stack).await else {
        return;
    };
    for status in [501_u16, 505, 511] {
        let before = rig.work.executions();
        let reply = rig
            .call(&Call::post("fan").header("x-status", status.to_string()))
            .await
            .expect("an answer");
        assert_eq!(reply.status.as_u16(), status, "{}", reply.describe());
        assert_eq!(
            reply.attempts().count(),
            1,
            "{status}: {}",
            reply.describe()
        );
        assert_eq!(reply.attempts().reason(), StopReason::Final);
        assert_eq!(rig.work.executions(), before + 1, "{status} ran once");
    }
}

/// The delays between attempts, on a paused clock: a `Retry-After` is waited for as sent, a
/// backoff without one stays within its bounds (after the second attempt: the base delay
/// doubled once, between half of that and all of it). A service in the process answers; no network is involved, so the paused
/// clock only moves through the retry layer's sleeps.
#[tokio::test(start_paused = true)]
async fn delays_follow_retry_after_then_the_backoff() {
    use bytes::Bytes;
    use http_body_util::Full;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;
    use tower::retry::RetryLayer;
    use tower_idempotency_client::{Attempts, RetryPolicy, StampKeyLayer};

    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let server = tower::service_fn(move |_req: http::Request<Full<Bytes>>| {
        let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut res = http::Response::new(Full::new(Bytes::new()));
            match n {
                1 => {
                    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    res.headers_mut()
                        .insert("retry-after", http::HeaderValue::from_static("2"));
                }
                2 => *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
                _ => *res.status_mut() = StatusCode::CREATED,
            }
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let policy = RetryPolicy::new()
        .keys_honoured_by_all()
        .base_delay(Duration::from_millis(400));
    let client = tower::ServiceBuilder::new()
        .layer(StampKeyLayer::new())
        .layer(RetryLayer::new(policy))
        .service(server);
    let req = http::Request::post("http://api.test/orders")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let start = tokio::time::Instant::now();
    let res = client.oneshot(req).await.expect("an answer");
    let waited = start.elapsed();
    assert_eq!(res.status(), StatusCode::CREATED);
    let attempts = res.extensions().get::<Attempts>().expect("Attempts");
    assert_eq!(attempts.count(), 3);
    assert!(
        waited >= Duration::from_millis(2_400) && waited <= Duration::from_millis(2_800),
        "2 s as asked, then 400–800 ms of backoff: {waited:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

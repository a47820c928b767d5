//! A store outage with the defaults and with `fail_open`: Redis behind a TCP proxy
//! (`support/proxy.rs`), black-holed (each claim times out after the store's default 1 s) and
//! then killed (each claim fails at once). The default refuses with 503 and runs nothing; a
//! layer that fails open runs the handler, passes its response on, records nothing, and counts
//! and logs each such request.
#![cfg(all(feature = "redis", feature = "metrics"))]
#![allow(clippy::unwrap_used)]

use crate::support;

use metrics_util::debugging::DebuggingRecorder;
use std::sync::{Arc, Mutex};
use support::http::{RequestExt, TestServer, Work, send, server_with};
use support::metrics::moved_once;
use support::proxy::Proxy;
use support::redis_server::{self, RedisServer};
use tower_idempotency::{IdempotencyLayer, RedisStore};

const BODY: &str = r#"{"item":"book"}"#;

/// The warn-level lines the crate logs, kept for the test to read.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

struct Door {
    server: TestServer,
    work: Work,
}

impl Door {
    async fn post(&self, key: &str) -> support::http::Answer {
        send(self.server.post("/work", BODY).principal("alice").key(key)).await
    }
}

/// One outage as the two layers see it: the default refuses, the one that fails open runs
/// the handler each time (nothing recorded), counted and logged.
async fn outage(
    closed: &Door,
    open: &Door,
    tag: &str,
    snap: &metrics_util::debugging::Snapshotter,
    log: &Log,
) {
    let (closed_before, open_before) = (closed.work.executions(), open.work.executions());
    let _ = moved_once(snap);
    let _ = log.take();

    let refused = closed.post(&format!("{tag}-closed")).await;
    refused.assert_problem(503, "idempotency.store_failed");
    assert!(refused.retry_after().is_some(), "{}", refused.describe());
    assert_eq!(
        closed.work.executions(),
        closed_before,
        "{tag}: the handler did not run"
    );
    assert_eq!(
        moved_once(snap),
        ["door=http,outcome=store_failed"],
        "{tag}"
    );
    assert!(!log.take().contains("ran_unclaimed"), "{tag}");

    let ran = open.post(&format!("{tag}-open")).await;
    assert_eq!(ran.status, 201, "{tag}: {}", ran.describe());
    assert!(!ran.is_replay());
    assert_eq!(
        open.work.executions(),
        open_before + 1,
        "{tag}: the handler ran"
    );
    assert_eq!(
        ran.execution(),
        (open_before + 1) as u64,
        "{tag}: its own response"
    );
    assert_eq!(
        moved_once(snap),
        ["door=http,outcome=ran_unclaimed"],
        "{tag}"
    );
    let logged = log.take();
    assert!(
        logged.contains("WARN") && logged.contains("ran_unclaimed"),
        "{tag}: a warning: {logged}"
    );

    // Nothing was recorded: the repeat runs again. The risk the docs state.
    let again = open.post(&format!("{tag}-open")).await;
    assert_eq!(again.status, 201, "{tag}: {}", again.describe());
    assert!(!again.is_replay());
    assert_eq!(open.work.executions(), open_before + 2, "{tag}: ran again");
}

#[tokio::test]
async fn a_store_outage_fails_closed_by_default_and_runs_unclaimed_when_failing_open() {
    if !redis_server::available() {
        return;
    }
    // This thread's recorder and subscriber: the current-thread runtime runs the servers, the
    // clients and the layers on it.
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let log = Log::default();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_env_filter("tower_idempotency=warn")
            .with_writer(log.clone())
            .with_ansi(false)
            .finish(),
    );

    let mut redis = RedisServer::start();
    let proxy = Proxy::start(redis.port()).await;
    let store = RedisStore::connect(&proxy.url(), "fail-open")
        .await
        .unwrap();
    let door = |layer| async {
        let (server, work) = server_with(layer).await;
        Door { server, work }
    };
    let closed = door(IdempotencyLayer::new(store.clone())).await;
    let open = door(IdempotencyLayer::new(store.clone()).fail_open(true)).await;

    // Healthy: failing open changes nothing, the repeat replays.
    assert_eq!(open.post("healthy").await.status, 201);
    assert!(open.post("healthy").await.is_replay());
    assert_eq!(closed.post("healthy-closed").await.status, 201);

    // No answer: each claim times out.
    proxy.black_hole();
    outage(&closed, &open, "silent", &snap, &log).await;
    proxy.restore();

    // No server: each claim fails.
    redis.stop();
    outage(&closed, &open, "down", &snap, &log).await;
    assert_eq!(closed.work.executions(), 1, "only the healthy request ran");
}

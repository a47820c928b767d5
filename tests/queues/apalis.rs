//! The apalis adapter with the apalis-redis backend, against the `redis-server` the tests
//! start: a worker that handles a task and dies before acknowledging it; its task, re-enqueued
//! when its heartbeats stop, goes to another worker and is not run again.
#![cfg(all(feature = "apalis", feature = "redis"))]
#![allow(clippy::unwrap_used)]

use crate::support::redis_server::{self, RedisServer};
use apalis::prelude::{BoxDynError, Task, TaskBuilder, TaskSink, WorkerBuilder};
use apalis_redis::{Config, RedisStorage};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::{Service, service_fn};
use tower_idempotency::engine::Engine;
use tower_idempotency::message::jobs::JobIdempotencyLayer;
use tower_idempotency::message::{Handled, MessageIdempotencyLayer};
use tower_idempotency::store::redis::RedisStore;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Invoice {
    order: u32,
}

/// Between the worker and the door: passes the door's answer on, or — to play a worker that
/// dies before it acknowledges — never answers once the door has answered.
#[derive(Clone)]
struct Outcomes<S> {
    inner: S,
    die_before_ack: bool,
    seen: Arc<Mutex<Vec<Handled<()>>>>,
}

impl<S> Service<Task<Invoice>> for Outcomes<S>
where
    S: Service<Task<Invoice>, Response = Handled<()>, Error = BoxDynError>,
    S::Future: Send + 'static,
{
    type Response = Handled<()>;
    type Error = BoxDynError;
    type Future = Pin<Box<dyn Future<Output = Result<Handled<()>, BoxDynError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, task: Task<Invoice>) -> Self::Future {
        let fut = self.inner.call(task);
        let (die, seen) = (self.die_before_ack, Arc::clone(&self.seen));
        Box::pin(async move {
            let out = fut.await;
            if let Ok(h) = &out {
                seen.lock().unwrap().push(h.clone());
            }
            if die {
                std::future::pending::<()>().await;
            }
            out
        })
    }
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_before_acking_hands_over_and_the_effect_happens_once() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let config = Config::default()
        .queue("invoices")
        .heartbeat_interval(Duration::from_millis(500))
        .missed_heartbeats(2);
    let storage = || async {
        RedisStorage::<Invoice>::new(apalis_redis::connect(redis.url()).await.unwrap())
            .with_config(config.clone())
    };
    let engine = Engine::new(
        RedisStore::connect(&redis.url(), "apalis-door")
            .await
            .unwrap(),
    );
    let effects = Arc::new(AtomicUsize::new(0));
    let handler = {
        let effects = Arc::clone(&effects);
        service_fn(move |task: Task<Invoice>| {
            let effects = Arc::clone(&effects);
            async move {
                assert_eq!(task.args.order, 1);
                effects.fetch_add(1, Ordering::SeqCst);
                Ok::<(), BoxDynError>(())
            }
        })
    };
    let door = || {
        JobIdempotencyLayer::new(MessageIdempotencyLayer::new(
            engine.clone(),
            "invoice-workers",
        ))
    };

    let mut sink = storage().await;
    sink.push_task(
        TaskBuilder::new(Invoice { order: 1 })
            .idempotency_key("invoice-1")
            .build(),
    )
    .await
    .unwrap();

    // Worker A handles the task (effect and record done), then dies before acknowledging.
    let seen_a = Arc::new(Mutex::new(Vec::new()));
    let (seen, h) = (Arc::clone(&seen_a), handler.clone());
    let worker_a = WorkerBuilder::new("worker-a")
        .backend(storage().await)
        .layer(tower::layer::layer_fn(move |inner| Outcomes {
            inner,
            die_before_ack: true,
            seen: Arc::clone(&seen),
        }))
        .layer(door())
        .build(h);
    let a = tokio::spawn(worker_a.run());
    wait_for(
        "worker A to handle the task",
        Duration::from_secs(20),
        || effects.load(Ordering::SeqCst) == 1,
    )
    .await;
    a.abort();
    let _ = a.await;
    assert_eq!(*seen_a.lock().unwrap(), [Handled::Ran(())]);

    // Worker B: once A's heartbeats have stopped, A's task is re-enqueued and comes to B.
    let seen_b = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&seen_b);
    let worker_b = WorkerBuilder::new("worker-b")
        .backend(storage().await)
        .layer(tower::layer::layer_fn(move |inner| Outcomes {
            inner,
            die_before_ack: false,
            seen: Arc::clone(&seen),
        }))
        .layer(door())
        .build(handler);
    let b = tokio::spawn(worker_b.run());
    wait_for(
        "worker B to get the redelivery",
        Duration::from_secs(30),
        || !seen_b.lock().unwrap().is_empty(),
    )
    .await;
    // Another heartbeat or two: nothing else arrives.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.abort();
    assert_eq!(
        *seen_b.lock().unwrap(),
        [Handled::Duplicate(None)],
        "the redelivery was answered as a completed duplicate"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the side effect happened once"
    );
}

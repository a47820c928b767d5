//! An apalis worker on Redis whose handler runs once per task key, however often the task is
//! pushed or redelivered.
//!
//! ```text
//! redis-server --save "" --appendonly no &      # the broker and the store
//! cargo run --example queue_apalis --features apalis,redis
//! ```
//!
//! `REDIS_URL` (default `redis://127.0.0.1:6379/`) names another server. The example pushes
//! three tasks to the queue `example-emails`: a welcome email under the key `welcome-7`, the
//! same again (a producer's retry), and a receipt with no key. One worker with the door in its
//! layer stack handles them, several at once: two emails go out, and the repeat is answered as a
//! duplicate without running (`Skipped` while the first still runs, `Duplicate` once it is done). The door keeps its records in the same Redis (`RedisStore`), so every worker
//! process of the pool shares them. It prints each outcome, then exits.

use apalis::prelude::{BoxDynError, Task, TaskBuilder, TaskSink, WorkerBuilder};
use apalis_redis::{Config, RedisStorage};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;
use tower::service_fn;
use tower_idempotency::engine::Engine;
use tower_idempotency::message::jobs::JobIdempotencyLayer;
use tower_idempotency::message::{Handled, MessageIdempotencyLayer};
use tower_idempotency::store::redis::RedisStore;

#[derive(Debug, Serialize, Deserialize)]
struct Email {
    to: String,
    kind: String,
}

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let conn = apalis_redis::connect(url.as_str())
        .await
        .map_err(|e| format!("cannot reach Redis at {url} ({e}); start it with `redis-server`"))?;
    // A queue of its own per run, so leftovers of an earlier run are not picked up.
    let queue = format!("example-emails-{}", std::process::id());
    let mut storage = RedisStorage::<Email>::new(conn).with_config(Config::default().queue(&queue));

    let welcome = || Email {
        to: "ada@example.com".into(),
        kind: "welcome".into(),
    };
    storage
        .push_task(
            TaskBuilder::new(welcome())
                .idempotency_key("welcome-7")
                .build(),
        )
        .await?;
    storage
        .push_task(
            TaskBuilder::new(welcome())
                .idempotency_key("welcome-7")
                .build(),
        )
        .await?;
    storage
        .push(Email {
            to: "ada@example.com".into(),
            kind: "receipt".into(),
        })
        .await?;

    let door = JobIdempotencyLayer::new(MessageIdempotencyLayer::new(
        Engine::new(RedisStore::connect(&url, "example-apalis").await?),
        "email-workers", // the pool's name: the same in every worker process
    ));
    let (handled, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let (count, all_done) = (Arc::clone(&handled), Arc::clone(&done));
    let report = tower::layer::layer_fn(move |inner| {
        let (count, all_done) = (Arc::clone(&count), Arc::clone(&all_done));
        tower::util::MapResponse::new(inner, move |outcome: Handled<()>| {
            println!("outcome: {outcome:?}");
            if count.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                all_done.notify_one();
            }
            outcome
        })
    });
    let send_email = service_fn(|task: Task<Email>| async move {
        println!("  sending the {} email to {}", task.args.kind, task.args.to);
        Ok::<(), BoxDynError>(())
    });
    let worker = WorkerBuilder::new("email-worker-1")
        .backend(storage)
        .layer(report)
        .layer(door)
        .build(send_email);
    worker
        .run_until(async move {
            done.notified().await;
            Ok::<(), std::io::Error>(())
        })
        .await?;
    println!("tasks handled: {}", handled.load(Ordering::SeqCst));
    Ok(())
}

//! An apalis worker on Redis whose handler runs once per task, however often the task is
//! redelivered.
//!
//! ```text
//! redis-server --save "" --appendonly no &      # the broker and the store
//! cargo run --example message_apalis --features apalis,redis
//! ```
//!
//! `REDIS_URL` (default `redis://127.0.0.1:6379/`) names another server. The example pushes
//! three tasks to a queue of its own: two daily reminders with equal arguments (two jobs: both
//! go out, as each task is keyed by its own id) and a welcome email under the key `welcome-7`.
//! One worker with the door in its layer stack handles them and prints each outcome. Then it
//! hands the welcome task to the door again, as apalis-redis does when a worker died before
//! acknowledging it: the door answers `Replayed` without sending it twice. The door keeps its
//! records in the same Redis (`RedisStore`), so every worker process of the pool shares them.

use apalis::prelude::{BoxDynError, Task, TaskBuilder, TaskSink, WorkerBuilder};
use apalis_redis::{Config, RedisStorage};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::message::apalis::ApalisLayer;
use tower_idempotency::message::{Handled, MessageIdempotencyLayer};
use tower_idempotency::store::redis::RedisStore;

#[derive(Clone, Debug, Serialize, Deserialize)]
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

    let email = |kind: &str| Email {
        to: "ada@example.com".into(),
        kind: kind.into(),
    };
    storage.push(email("reminder")).await?; // Monday's
    storage.push(email("reminder")).await?; // Tuesday's: equal arguments, another job
    storage
        .push_task(
            TaskBuilder::new(email("welcome"))
                .idempotency_key("welcome-7")
                .build(),
        )
        .await?;

    let door = ApalisLayer::new(MessageIdempotencyLayer::new(
        RedisStore::connect(&url, "example-apalis").await?,
        "email-workers", // the pool's name: the same in every worker process
    ));
    let send_email = service_fn(|task: Task<Email>| async move {
        println!("  sending the {} email to {}", task.args.kind, task.args.to);
        Ok::<(), BoxDynError>(())
    });

    // Each outcome, and the welcome task as the worker got it (to hand it over again below).
    let (handled, done) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Notify::new()));
    let (seen, all_done) = (Arc::clone(&handled), Arc::clone(&done));
    let report = tower::layer::layer_fn(move |inner| {
        let (seen, all_done) = (Arc::clone(&seen), Arc::clone(&all_done));
        tower::util::MapRequest::new(
            tower::util::MapResponse::new(inner, |outcome: Handled<()>| {
                println!("outcome: {outcome:?}");
                outcome
            }),
            move |task: Task<Email>| {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.push(task.clone());
                if seen.len() == 3 {
                    all_done.notify_one();
                }
                task
            },
        )
    });
    let worker = WorkerBuilder::new("email-worker-1")
        .backend(storage)
        .layer(report)
        .layer(door.clone())
        .build(send_email);
    worker
        .run_until(async move {
            done.notified().await;
            // Let the last answer reach apalis before the worker stops.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            Ok::<(), std::io::Error>(())
        })
        .await?;

    let welcome = handled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|t| t.args.kind == "welcome")
        .cloned()
        .ok_or("the welcome task was not handled")?;
    println!("the welcome task redelivered:");
    let again = door.layer(send_email).oneshot(welcome).await?;
    println!("outcome: {again:?}");
    Ok(())
}

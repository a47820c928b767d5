//! A repeat that waits, across two processes on one Redis: the first run is
//! served by this test process, its repeat by a second process (this test binary again, run
//! as a server by the ignored test `child_server`), which waits for the first run through
//! Redis (polling with backoff) and replays its record.
//!
//! Without `redis-server` on `PATH` the test prints a notice and passes, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set.
#![cfg(feature = "redis")]

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::http::{RequestExt, TestServer, Work, client, send};
use support::redis_server::{self, RedisServer};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::store::redis::RedisStore;

const BODY: &str = r#"{"item":"book"}"#;
const PREFIX: &str = "waiting-2p";
/// Set (to the Redis URL) in the environment of the child process.
const CHILD_ENV: &str = "TOWER_IDEMPOTENCY_WAIT_CHILD_REDIS";

/// The layer both processes use: the same Redis prefix, a 10 s wait.
async fn layer(url: &str) -> IdempotencyLayer<RedisStore> {
    let store = RedisStore::connect(url, PREFIX)
        .await
        .expect("connect to redis");
    IdempotencyLayer::new(store).wait_in_flight(Duration::from_secs(10))
}

/// The second process: serves the test app on a free port, prints it, and exits after 60 s
/// at the latest (the parent kills it sooner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by `a_duplicate_on_another_process_waits_and_replays` as its second process"]
async fn child_server() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let server = TestServer::start(Work::new().app(layer(&url).await)).await;
    println!("LISTENING {}", server.addr().port());
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// Kills the child process on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the second process and returns it with the port it serves on.
fn start_child(url: &str) -> (ChildGuard, u16) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([
            "waiting_redis::child_server",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the second process");
    let stdout = child.stdout.take().expect("piped stdout");
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(port) = line.strip_prefix("LISTENING ") {
                let _ = tx.send(port.trim().parse::<u16>().ok());
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .flatten()
        .expect("the second process said where it listens");
    (guard, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_on_another_process_waits_and_replays() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let work = Work::new();
    let here = TestServer::start(work.app(layer(&redis.url()).await)).await;
    let (_child, port) = start_child(&redis.url());

    let first = tokio::spawn(send(
        here.post("/work", BODY)
            .principal("alice")
            .key("two-processes")
            .delay_ms(800),
    ));
    work.wait_runs("two-processes", 1).await;
    let sent = Instant::now();
    let repeat = send(
        client()
            .post(format!("http://127.0.0.1:{port}/work"))
            .header("content-type", "application/json")
            .body(BODY)
            .principal("alice")
            .key("two-processes"),
    )
    .await;
    let waited = sent.elapsed();
    let first = first.await.expect("the first request");

    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(repeat.status, 201, "{}", repeat.describe());
    assert!(
        repeat.is_replay(),
        "the other process waited and replayed: {}",
        repeat.describe()
    );
    assert_eq!(
        repeat.execution(),
        first.execution(),
        "the first run's answer"
    );
    assert_eq!(
        work.executions(),
        1,
        "the handler ran once, in this process"
    );
    assert!(
        waited >= Duration::from_millis(200),
        "the repeat waited for the first run ({waited:?})"
    );
}

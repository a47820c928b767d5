//! The apalis adapter with apalis' own backends and retry layer: apalis-redis against the
//! `redis-server` the tests start (a worker process killed mid-handler, a worker that dies
//! before acknowledging, retries), and `MemoryStorage` under apalis' `RetryPolicy`.
#![cfg(all(feature = "apalis", feature = "redis"))]
#![allow(clippy::unwrap_used)]

use crate::support::redis_server::{self, RedisServer};
use apalis::prelude::{
    BoxDynError, MemoryStorage, RetryPolicy, Task, TaskBuilder, TaskSink, WorkerBuilder,
    WorkerBuilderExt,
};
use apalis_redis::{Config, ConnectionManager, RedisStorage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tower::{Service, service_fn};
use tower_idempotency::engine::Engine;
use tower_idempotency::message::apalis::ApalisLayer;
use tower_idempotency::message::{Handled, MessageIdempotencyLayer};
use tower_idempotency::store::redis::redis::aio::ConnectionManagerConfig;
use tower_idempotency::store::redis::{RedisStore, redis};

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Invoice {
    order: u32,
    /// A map, so every deserialization iterates it in a new order.
    lines: HashMap<String, u32>,
}

fn invoice(order: u32) -> Invoice {
    Invoice {
        order,
        lines: (0..32).map(|i| (format!("sku-{i}"), i)).collect(),
    }
}

/// The store's prefix, the same for every worker of these tests.
const STORE_PREFIX: &str = "apalis-door";
/// The worker pool's name (the door's consumer name).
const POOL: &str = "invoice-workers";

/// The door with its default settings (the engine's lease aside, where a test names one).
fn door(
    engine: &Engine<RedisStore>,
) -> ApalisLayer<MessageIdempotencyLayer<RedisStore, tower_idempotency::message::apalis::TaskKey>> {
    ApalisLayer::new(MessageIdempotencyLayer::new(engine.clone(), POOL))
}

/// apalis-redis stamps heartbeats in whole seconds, and each heartbeat re-enqueues the tasks
/// of every worker whose stamp is `heartbeat_interval × missed_heartbeats` (whole seconds) old,
/// its own worker included. At 0.5 s × 2 a heartbeat whose two calls fall either side of a
/// second finds its own worker orphaned, and the worker stops ("worker not registered"). At
/// 1 s × 3 that takes a 2 s stall between them; a dead worker's tasks move 3–4 s after its
/// last heartbeat.
fn config(queue: &str) -> Config {
    Config::default()
        .queue(queue)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(3)
}

/// A connection for apalis-redis. A worker stops on any error of its backend, a reply later
/// than the connection's response timeout included: `apalis_redis::connect` keeps redis'
/// default of 500 ms, which a loaded machine exceeds. Seconds here.
async fn connect(url: &str) -> ConnectionManager {
    let seconds = Some(Duration::from_secs(10));
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(seconds)
        .set_connection_timeout(seconds);
    apalis_redis::Client::open(url)
        .unwrap()
        .get_connection_manager_with_config(config)
        .await
        .unwrap()
}

async fn storage(url: &str, queue: &str) -> RedisStorage<Invoice> {
    RedisStorage::<Invoice>::new(connect(url).await).with_config(config(queue))
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// As [`wait_for`], while `worker` runs: a worker that stopped fails the wait at once, with
/// what it stopped on (apalis-redis stops a worker on a backend error).
async fn wait_on<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    worker: &mut JoinHandle<T>,
    mut done: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while !done() {
        if worker.is_finished() {
            let stopped = worker.await;
            panic!("the worker stopped before {what}: {stopped:?}");
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether apalis-redis filed the task done and not dead.
async fn filed(conn: &mut ConnectionManager, queue: &str, id: &str) -> (bool, bool) {
    let config = config(queue);
    let mut member = async |set: String| -> bool {
        redis::cmd("SISMEMBER")
            .arg(set)
            .arg(id)
            .query_async(conn)
            .await
            .unwrap()
    };
    let done = member(config.done_jobs_set()).await;
    let dead = member(config.dead_jobs_set()).await;
    (done, dead)
}

/// Where apalis-redis keeps task `id`, for a failure's message: its metadata, the sets and
/// lists that hold it, and the registered workers.
async fn whereabouts(conn: &mut ConnectionManager, queue: &str, id: &str) -> String {
    let config = config(queue);
    let meta: Vec<String> = redis::cmd("HGETALL")
        .arg(format!("{}:{id}", config.job_meta_hash()))
        .query_async(conn)
        .await
        .unwrap_or_default();
    let workers: Vec<String> = redis::cmd("ZRANGE")
        .arg(config.workers_set())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .unwrap_or_default();
    let active: Vec<String> = redis::cmd("LRANGE")
        .arg(config.active_jobs_list())
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap_or_default();
    let scheduled: Option<f64> = redis::cmd("ZSCORE")
        .arg(config.scheduled_jobs_set())
        .arg(id)
        .query_async(conn)
        .await
        .unwrap_or_default();
    // The registered workers, and the tests' own, registered or not.
    let names: std::collections::BTreeSet<String> = workers
        .iter()
        .step_by(2)
        .cloned()
        .chain(["worker-a".to_owned(), "worker-b".to_owned()])
        .collect();
    let mut inflight = Vec::new();
    for worker in names {
        let held: bool = redis::cmd("SISMEMBER")
            .arg(format!("{}:{worker}", config.inflight_jobs_set()))
            .arg(id)
            .query_async(conn)
            .await
            .unwrap_or_default();
        if held {
            inflight.push(worker);
        }
    }
    // The workers' scores are their latest heartbeats: the server's time says how old.
    let (now, _): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .unwrap_or_default();
    format!(
        "meta {meta:?}; workers {workers:?} at {now}; in the active list {}; scheduled at \
         {scheduled:?}; in flight at {inflight:?}",
        active.iter().any(|a| a == id)
    )
}

/// The last lines apalis logged for one worker (its backend's states and calls), for a
/// failure's message: attach with [`Trail::attach`].
#[derive(Clone, Default)]
struct Trail(Arc<Mutex<std::collections::VecDeque<String>>>);

impl Trail {
    const LINES: usize = 60;

    fn attach<F: Future>(&self, future: F) -> tracing::instrument::WithDispatch<F> {
        use tracing::instrument::WithSubscriber;
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("apalis_core=debug,apalis_redis=debug")
            .with_writer(self.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        future.with_subscriber(subscriber)
    }

    fn lines(&self) -> String {
        let lines = self.0.lock().unwrap();
        lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("")
    }
}

impl std::io::Write for Trail {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut lines = self.0.lock().unwrap();
        lines.push_back(String::from_utf8_lossy(buf).into_owned());
        while lines.len() > Self::LINES {
            lines.pop_front();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Trail {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

/// What reached the door: the task's id, its arguments' JSON as this delivery serializes them,
/// and the door's answer (`Ok` outcome or the error's text).
type Seen = Arc<Mutex<Vec<(String, String, Result<Handled<()>, String>)>>>;

/// Between the worker and the door: records what reached the door and its answer, or — to play
/// a worker that dies before it acknowledges — never answers once the door has answered.
#[derive(Clone)]
struct Outcomes<S> {
    inner: S,
    die_before_ack: bool,
    seen: Seen,
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
        let id = task.ctx().task_id().unwrap().to_string();
        let json = serde_json::to_string(&task.args).unwrap();
        let fut = self.inner.call(task);
        let (die, seen) = (self.die_before_ack, Arc::clone(&self.seen));
        Box::pin(async move {
            let out = fut.await;
            let answer = out.as_ref().map(Clone::clone).map_err(ToString::to_string);
            seen.lock().unwrap().push((id, json, answer));
            if die {
                std::future::pending::<()>().await;
            }
            out
        })
    }
}

/// Worker A's lease on its claims, and B's: a killed worker's claim lapses after it. The
/// store's expiry runs on a real server whose clock cannot be paused, and the default 60 s
/// lease would make the test wait a minute; the test is named for this lease. The handlers
/// that hold one run in microseconds, renewed every third of it. A's claims outlive it by
/// 10–15 s, A's tasks come to B 1–5 s after the kill ([`config`]): seconds to spare for the
/// redeliveries the claims refuse.
const LEASE: Duration = Duration::from_secs(15);

const CHILD_REDIS: &str = "QUEUES_APALIS_CHILD_REDIS";
const CHILD_QUEUE: &str = "QUEUES_APALIS_CHILD_QUEUE";
const CHILD_TEST: &str = "apalis::worker_process_that_hangs_mid_handler";

fn engine_at(store: RedisStore) -> Engine<RedisStore> {
    Engine::builder(store).lease(LEASE).build()
}

/// Worker A of the kill test, in a process of its own: every task's handler starts, says so,
/// and never returns, until the test kills the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_worker_process_killed_mid_handler_with_a_15_s_lease_loses_no_task_and_each_runs_once"]
async fn worker_process_that_hangs_mid_handler() {
    let (Ok(url), Ok(queue)) = (std::env::var(CHILD_REDIS), std::env::var(CHILD_QUEUE)) else {
        return;
    };
    let engine = engine_at(RedisStore::connect(&url, STORE_PREFIX).await.unwrap());
    let handler = service_fn(|task: Task<Invoice>| async move {
        println!("STARTED {}", task.ctx().task_id().unwrap());
        std::future::pending::<()>().await;
        Ok::<(), BoxDynError>(())
    });
    WorkerBuilder::new("worker-a")
        .backend(storage(&url, &queue).await)
        .layer(door(&engine))
        .build(handler)
        .run()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_handler_with_a_15_s_lease_loses_no_task_and_each_runs_once() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let (url, queue) = (redis.url(), "killed-mid-handler");
    let mut sink = storage(&url, queue).await;
    // Two tasks with equal arguments (two jobs), and one with a key of its own.
    sink.push(invoice(1)).await.unwrap();
    sink.push(invoice(1)).await.unwrap();
    sink.push_task(
        TaskBuilder::new(invoice(2))
            .idempotency_key("invoice-2")
            .build(),
    )
    .await
    .unwrap();

    // Worker A, a process of its own, claims and starts all three, and is killed (SIGKILL)
    // while their handlers run.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            CHILD_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_REDIS, &url)
        .env(CHILD_QUEUE, queue)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut started = std::collections::BTreeSet::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while started.len() < 3 {
            let line = lines.next_line().await.unwrap().expect("worker A exited");
            // libtest may print its own "test … " before the line.
            if let Some(i) = line.find("STARTED ") {
                started.insert(line[i + 8..].trim().to_owned());
            }
        }
    })
    .await
    .expect("worker A to start the three tasks");
    child.kill().await.unwrap();

    // Worker B, the door's and the adapter's default settings and the 15 s lease: A's tasks
    // come to it once A's heartbeats have stopped, while A's claims still hold their keys.
    let engine = engine_at(RedisStore::connect(&url, STORE_PREFIX).await.unwrap());
    let runs = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let handler = {
        let runs = Arc::clone(&runs);
        service_fn(move |task: Task<Invoice>| {
            let id = task.ctx().task_id().unwrap().to_string();
            *runs.lock().unwrap().entry(id).or_default() += 1;
            async { Ok::<(), BoxDynError>(()) }
        })
    };
    let seen = Seen::default();
    let s = Arc::clone(&seen);
    let worker_b = WorkerBuilder::new("worker-b")
        .backend(storage(&url, queue).await)
        .layer(tower::layer::layer_fn(move |inner| Outcomes {
            inner,
            die_before_ack: false,
            seen: Arc::clone(&s),
        }))
        .layer(door(&engine))
        .build(handler);
    let trail = Trail::default();
    let mut b = tokio::spawn(trail.attach(worker_b.run()));
    let mut conn = connect(&url).await;
    let start = Instant::now();
    for id in &started {
        loop {
            if filed(&mut conn, queue, id).await.0 {
                break;
            }
            if b.is_finished() {
                let stopped = (&mut b).await;
                panic!("worker B stopped before task {id} was done: {stopped:?}");
            }
            if start.elapsed() > Duration::from_secs(90) {
                let at = whereabouts(&mut conn, queue, id).await;
                panic!(
                    "task {id} not done ({at}); worker B saw {:?}; its last lines:\n{}",
                    seen.lock().unwrap(),
                    trail.lines()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Another heartbeat or two: nothing else runs.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    b.abort();

    let runs = runs.lock().unwrap().clone();
    let every_task_once: BTreeMap<String, usize> =
        started.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(
        runs, every_task_once,
        "each of A's tasks ran once, under the id A saw"
    );
    let refused = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, answer)| {
            answer
                .as_ref()
                .is_err_and(|e| e.contains("still being handled"))
        })
        .count();
    assert!(
        refused >= 3,
        "each redelivery within A's lease was refused as in flight, not acknowledged ({refused})"
    );
    for id in &started {
        assert_eq!(
            filed(&mut conn, queue, id).await,
            (true, false),
            "task {id} filed done"
        );
    }
}

/// Worker A handles a task (effect and record done) and dies before acknowledging; once its
/// heartbeats stop, apalis-redis re-enqueues the task to worker B, which deserializes its
/// arguments anew (the map in a new order). Returns B's answers and the effect count.
async fn die_before_ack_then_redeliver(keyed: bool) {
    let redis = RedisServer::start();
    let (url, queue) = (redis.url(), "die-before-ack");
    let engine = Engine::new(RedisStore::connect(&url, STORE_PREFIX).await.unwrap());
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
    let mut sink = storage(&url, queue).await;
    let task = TaskBuilder::new(invoice(1));
    let task = if keyed {
        task.idempotency_key("invoice-1")
    } else {
        task
    };
    sink.push_task(task.build()).await.unwrap();

    let worker = |name: &'static str, die_before_ack: bool, seen: &Seen| {
        let (seen, h, door) = (Arc::clone(seen), handler.clone(), door(&engine));
        let url = url.clone();
        async move {
            WorkerBuilder::new(name)
                .backend(storage(&url, queue).await)
                .layer(tower::layer::layer_fn(move |inner| Outcomes {
                    inner,
                    die_before_ack,
                    seen: Arc::clone(&seen),
                }))
                .layer(door)
                .build(h)
        }
    };
    let (seen_a, seen_b) = (Seen::default(), Seen::default());
    let mut a = tokio::spawn(worker("worker-a", true, &seen_a).await.run());
    wait_on(
        "worker A to handle the task",
        Duration::from_secs(20),
        &mut a,
        || !seen_a.lock().unwrap().is_empty(),
    )
    .await;
    a.abort();
    let _ = a.await;

    let mut b = tokio::spawn(worker("worker-b", false, &seen_b).await.run());
    wait_on(
        "worker B to get the redelivery",
        Duration::from_secs(30),
        &mut b,
        || !seen_b.lock().unwrap().is_empty(),
    )
    .await;
    let mut conn = connect(&url).await;
    let id = seen_b.lock().unwrap()[0].0.clone();
    let start = Instant::now();
    while !filed(&mut conn, queue, &id).await.0 {
        if b.is_finished() {
            let stopped = (&mut b).await;
            panic!("worker B stopped before the task was filed done: {stopped:?}");
        }
        if start.elapsed() > Duration::from_secs(20) {
            let at = whereabouts(&mut conn, queue, &id).await;
            panic!("the task is filed done: {at}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another heartbeat or two: nothing else arrives.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    b.abort();

    let (a, b) = (
        seen_a.lock().unwrap().clone(),
        seen_b.lock().unwrap().clone(),
    );
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].2, Ok(Handled::Recorded(())));
    assert_eq!(b.len(), 1, "one redelivery: {b:?}");
    assert_eq!(a[0].0, b[0].0, "the redelivery keeps the task's id");
    assert_ne!(
        a[0].1, b[0].1,
        "the map serialized in another order (the case under test)"
    );
    assert_eq!(b[0].2, Ok(Handled::Replayed(None)), "a completed repeat");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the side effect happened once"
    );
    assert_eq!(
        filed(&mut conn, queue, &id).await,
        (true, false),
        "done, not dead"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_the_record_is_a_duplicate_filed_done() {
    if redis_server::available() {
        die_before_ack_then_redeliver(false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_redelivery_whose_map_iterates_anew_is_a_duplicate_not_a_reused_key() {
    if redis_server::available() {
        die_before_ack_then_redeliver(true).await;
    }
}

/// The settings these tests give apalis-redis ([`config`], [`connect`]) keep a worker running
/// through a stall of Redis: here three of 1 s, as a loaded machine makes. At 0.5 s × 2
/// heartbeats a stall makes the worker's heartbeat find itself orphaned, and with redis'
/// 500 ms response timeout the stalled reply is an error; either stops the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apalis_redis_worker_on_these_settings_outlives_redis_stalls_of_1_s() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let (url, queue) = (redis.url(), "stalled");
    let handler = service_fn(|_: Task<Invoice>| async { Ok::<(), BoxDynError>(()) });
    let worker = WorkerBuilder::new("worker")
        .backend(storage(&url, queue).await)
        .build(handler);
    let mut w = tokio::spawn(worker.run());
    let mut conn = connect(&url).await;
    let mut sink = storage(&url, queue).await;
    for stall in 0..3 {
        // Between stalls, a heartbeat or two and a task that runs.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sink.push(invoice(stall)).await.unwrap();
        let () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !w.is_finished(),
            "stopped at stall {stall}: {:?}",
            (&mut w).await
        );
    }
    let done = || async {
        let mut conn = connect(&url).await;
        redis::cmd("SCARD")
            .arg(config(queue).done_jobs_set())
            .query_async::<usize>(&mut conn)
            .await
            .unwrap()
    };
    let start = Instant::now();
    while done().await < 3 {
        if w.is_finished() {
            panic!("the worker stopped: {:?}", (&mut w).await);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the three tasks ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apalis_redis_retry_keeps_the_task_id_and_runs_again() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let (url, queue) = (redis.url(), "retried");
    let engine = Engine::new(RedisStore::connect(&url, STORE_PREFIX).await.unwrap());
    let ids = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let ids = Arc::clone(&ids);
        service_fn(move |task: Task<Invoice>| {
            let mut ids = ids.lock().unwrap();
            ids.push(task.ctx().task_id().unwrap().to_string());
            let first = ids.len() == 1;
            async move {
                if first {
                    return Err::<(), BoxDynError>("the first attempt fails".into());
                }
                Ok(())
            }
        })
    };
    storage(&url, queue).await.push(invoice(1)).await.unwrap();
    let seen = Seen::default();
    let s = Arc::clone(&seen);
    let worker = WorkerBuilder::new("worker")
        .backend(storage(&url, queue).await)
        .layer(tower::layer::layer_fn(move |inner| Outcomes {
            inner,
            die_before_ack: false,
            seen: Arc::clone(&s),
        }))
        .layer(door(&engine))
        .build(handler);
    let w = tokio::spawn(worker.run());
    // apalis-redis reschedules a failed task after `attempt` seconds.
    wait_for("the retry", Duration::from_secs(30), || {
        ids.lock().unwrap().len() == 2
    })
    .await;
    wait_for("its answer", Duration::from_secs(5), || {
        seen.lock().unwrap().len() == 2
    })
    .await;
    w.abort();
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids[0], ids[1], "the retry keeps the task's id");
    let seen = seen.lock().unwrap().clone();
    assert!(seen[0].2.is_err());
    assert_eq!(
        seen[1].2,
        Ok(Handled::Recorded(())),
        "the failed attempt released the key"
    );
}

/// Runs `tasks` on `MemoryStorage` under `.retry(RetryPolicy::retries(3))` with the door
/// inside; returns how often each task (by its arguments) reached the door.
async fn under_retry_policy<F, Fut>(tasks: Vec<Task<u32>>, handler: F) -> BTreeMap<u32, usize>
where
    F: Fn(Task<u32>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxDynError>> + Send + 'static,
{
    let engine = Engine::new(tower_idempotency::MemoryStore::new());
    let calls = Arc::new(Mutex::new(BTreeMap::<u32, usize>::new()));
    let c = Arc::clone(&calls);
    let mut storage = MemoryStorage::new();
    let n = tasks.len();
    for task in tasks {
        storage.push_task(task).await.unwrap();
    }
    let worker = WorkerBuilder::new("worker")
        .backend(storage)
        .retry(RetryPolicy::retries(3))
        .map_request(move |task: Task<u32>| {
            *c.lock().unwrap().entry(task.args).or_default() += 1;
            task
        })
        .layer(ApalisLayer::new(MessageIdempotencyLayer::new(
            engine, "pool",
        )))
        .build(service_fn(handler));
    let w = tokio::spawn(worker.run());
    wait_for(
        "every task to reach the door",
        Duration::from_secs(10),
        || calls.lock().unwrap().len() == n,
    )
    .await;
    // Time for retries (instant under `RetryPolicy`) to happen.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.abort();
    calls.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apalis_retry_policy_does_not_retry_the_doors_abort_error() {
    // Task 2 reuses task 1's key with other arguments: the door refuses it (`KeyReused`). The
    // key is in the tasks' metadata: `MemoryStorage` drops a second push under the same
    // `TaskBuilder::idempotency_key` itself.
    let keyed = |args: u32| {
        TaskBuilder::new(args)
            .with_metadata([("Idempotency-Key", "order-17")].into_iter().collect())
            .build()
    };
    let calls = under_retry_policy(vec![keyed(1), keyed(2)], |_| async { Ok(()) }).await;
    assert_eq!(
        calls,
        BTreeMap::from([(1, 1), (2, 1)]),
        "the refusal was not retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apalis_retry_policy_does_not_retry_a_handlers_abort_error_and_retries_others() {
    let handler = |task: Task<u32>| async move {
        match task.args {
            1 => Err(
                Box::new(apalis::prelude::AbortError::new("a permanent failure")) as BoxDynError,
            ),
            _ => Err("a passing failure".into()),
        }
    };
    let tasks = vec![TaskBuilder::new(1).build(), TaskBuilder::new(2).build()];
    let calls = under_retry_policy(tasks, handler).await;
    // `retries(3)`: a first run and three retries.
    assert_eq!(calls, BTreeMap::from([(1, 1), (2, 4)]));
}

//! `RedisStore` on a real standalone `redis-server`: the conformance suite, the command count
//! of each answer, outages, start-up checks and store prefixes.
//!
//! Without `redis-server` on `PATH` these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::support;

// Only the helpers this suite uses, mounted where `store_conformance!` expects them, so this
// suite does not depend on the HTTP helpers compiling.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::redis_server::{self, RedisServer, redis_key};
use tower_idempotency::conformance::{Harness, fingerprint, random_key, record};
use tower_idempotency::engine::{Begin, Engine, KeyState, Recorded, Scope};
use tower_idempotency::store::redis::{EvictionCheck, RedisStore, redis};
use tower_idempotency::{ConfigError, ConfigErrorKind};

/// The store's default operation timeout, as its docs say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
use tower_idempotency::store::{Claim, Forgotten, StepId, StepRecorded, StoreErrorKind, StoreKey};
use tower_idempotency::{IdempotencyKey, Store};

struct RedisHarness {
    store: RedisStore,
}

impl Harness for RedisHarness {
    type S = RedisStore;

    fn store(&self) -> &RedisStore {
        &self.store
    }

    // Expiry is the server's (`PX`), on real time.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// A fresh harness on the shared server, or `None` (skip) when no server can be run.
fn harness() -> Option<impl Future<Output = RedisHarness>> {
    let server = RedisServer::shared()?;
    Some(async move {
        let store = RedisStore::connect(&server.url(), "conformance")
            .await
            .expect("connect");
        RedisHarness { store }
    })
}

// `return` in the expression leaves the test early (the notice is already printed).
tower_idempotency::store_conformance!(match harness() {
    Some(make) => make,
    None => return,
});

/// The same suite with claims sent as the script (servers older than 7.0, or proxies).
mod script_claims {
    use super::*;

    fn harness() -> Option<impl Future<Output = RedisHarness>> {
        let server = RedisServer::shared()?;
        Some(async move {
            let store = RedisStore::builder("conformance-script")
                .native_claim(false)
                .connect(&server.url())
                .await
                .expect("connect");
            RedisHarness { store }
        })
    }

    tower_idempotency::store_conformance!(match harness() {
        Some(make) => make,
        None => return,
    });
}

// ---- one round trip per step ------------------------------------------------------------

/// `INFO commandstats` as `command → calls`, without the INFO that asks.
fn commandstats(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls = rest.split(',').next()?.parse().ok()?;
            (name != "info").then(|| (name.to_owned(), calls))
        })
        .collect()
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

fn response() -> Recorded {
    Recorded::new(
        201,
        vec![(
            Bytes::from_static(b"content-type"),
            Bytes::from_static(b"application/json"),
        )],
        Some(Bytes::from_static(b"{\"id\":1}")),
    )
}

/// Counted on a server of its own, through the engine. `INFO commandstats` also counts the
/// commands a script runs (`redis.call`), so the expected deltas name those too.
async fn command_counts(native: bool) -> [BTreeMap<String, u64>; 4] {
    let server = RedisServer::start();
    let store = RedisStore::builder("count")
        .native_claim(native)
        .connect(&server.url())
        .await
        .expect("connect");
    let engine = Engine::new(store);
    let scope = Scope::principal("counter");
    let key = |k: &str| StoreKey::derive("count", &scope, &IdempotencyKey::new(k).unwrap());
    let (fa, fb) = (fingerprint("a"), fingerprint("b"));

    // Warm up: the first EVALSHA of each script meets NOSCRIPT and loads it.
    let Begin::Run(t) = engine.begin(key("warm"), fa).await.unwrap() else {
        panic!("warm-up runs")
    };
    engine.complete(t, &response()).await.unwrap();
    assert!(matches!(
        engine.begin(key("warm"), fa).await.unwrap(),
        Begin::Replayed(_)
    ));

    let before = commandstats(&server);
    let Begin::Run(t) = engine.begin(key("first"), fa).await.unwrap() else {
        panic!("first run")
    };
    assert!(engine.complete(t, &response()).await.unwrap());
    let first = delta(&before, &commandstats(&server));

    let before = commandstats(&server);
    assert!(
        matches!(engine.begin(key("first"), fa).await.unwrap(), Begin::Replayed(r) if r == response())
    );
    let replay = delta(&before, &commandstats(&server));

    let Begin::Run(_held) = engine.begin(key("held"), fa).await.unwrap() else {
        panic!("held runs")
    };
    let before = commandstats(&server);
    assert!(matches!(
        engine.begin(key("held"), fa).await.unwrap(),
        Begin::InFlight
    ));
    let in_flight = delta(&before, &commandstats(&server));

    let before = commandstats(&server);
    assert!(matches!(
        engine.begin(key("first"), fb).await.unwrap(),
        Begin::KeyReused
    ));
    let mismatch = delta(&before, &commandstats(&server));
    eprintln!(
        "native claim {native}: server-side commands per answer: first run {first:?}, \
         replay {replay:?}, in flight {in_flight:?}, mismatch {mismatch:?}"
    );
    [first, replay, in_flight, mismatch]
}

/// Native claims: a first execution is `SET … NX PX … GET` and the complete script (its
/// `GET` and `SET` counted inside); every other answer is that one `SET`, no script at all.
#[tokio::test]
async fn each_answer_costs_one_command_and_a_first_run_two() {
    if !redis_server::available() {
        return;
    }
    let [first, replay, in_flight, mismatch] = command_counts(true).await;
    assert_eq!(
        first,
        counts(&[("evalsha", 1), ("get", 1), ("set", 2), ("del", 1)]),
        "a first execution is the native claim and one script call (complete, which frees \
         the key's steps)"
    );
    for (answer, what) in [
        (replay, "replay"),
        (in_flight, "in flight"),
        (mismatch, "mismatch"),
    ] {
        assert_eq!(
            answer,
            counts(&[("set", 1)]),
            "a {what} answer is one native SET"
        );
    }
}

/// Script claims: one `EVALSHA` per step, each running one `GET` and at most one write.
#[tokio::test]
async fn script_claims_cost_one_script_call_per_step() {
    if !redis_server::available() {
        return;
    }
    let [first, replay, in_flight, mismatch] = command_counts(false).await;
    assert_eq!(
        first,
        counts(&[("evalsha", 2), ("get", 2), ("set", 2), ("del", 1)]),
        "a first execution is two script calls (claim, complete) and nothing else"
    );
    for (answer, what) in [
        (replay, "replay"),
        (in_flight, "in flight"),
        (mismatch, "mismatch"),
    ] {
        assert_eq!(
            answer,
            counts(&[("evalsha", 1), ("get", 1)]),
            "a {what} answer is one script call"
        );
    }
}

/// Inspection: one `EVALSHA` running `GET` and `PTTL`, and no write, whatever holds the key.
#[tokio::test]
async fn inspect_is_one_script_call_that_writes_nothing() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    let store = RedisStore::builder("count")
        .connect(&server.url())
        .await
        .expect("connect");
    let engine = Engine::new(store);
    let scope = Scope::principal("inspector");
    let key = |k: &str| StoreKey::derive("count", &scope, &IdempotencyKey::new(k).unwrap());
    // Warm up: the first EVALSHA meets NOSCRIPT and loads the script.
    engine.inspect(&key("warm")).await.unwrap();
    let Begin::Run(t) = engine.begin(key("done"), fingerprint("a")).await.unwrap() else {
        panic!("first run")
    };
    assert!(engine.complete(t, &response()).await.unwrap());
    let Begin::Run(_held) = engine.begin(key("held"), fingerprint("a")).await.unwrap() else {
        panic!("held runs")
    };
    for (k, what) in [("done", "done"), ("held", "in flight")] {
        let before = commandstats(&server);
        let state = engine.inspect(&key(k)).await.unwrap();
        assert_eq!(
            delta(&before, &commandstats(&server)),
            counts(&[("evalsha", 1), ("get", 1), ("pttl", 1)]),
            "inspecting a {what} key is one script call: {state:?}"
        );
    }
    let before = commandstats(&server);
    assert_eq!(
        engine.inspect(&key("free")).await.unwrap(),
        KeyState::Absent
    );
    assert_eq!(
        delta(&before, &commandstats(&server)),
        counts(&[("evalsha", 1), ("get", 1)]),
        "inspecting a free key is one script call"
    );
}

/// A real connection that answers `SET … GET` the way Redis before 7.0 does, and says it is
/// Redis 6.2.14 in `INFO`.
#[derive(Clone)]
struct OldRedis(redis::aio::MultiplexedConnection);

impl redis::aio::ConnectionLike for OldRedis {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        if args.first().map(Vec::as_slice) == Some(b"SET") && args.iter().any(|a| a == b"GET") {
            let refused = redis::parse_redis_value(b"-ERR syntax error\r\n")
                .and_then(redis::Value::extract_error);
            return Box::pin(std::future::ready(refused));
        }
        if args.first().map(Vec::as_slice) == Some(b"INFO") {
            let info = self.0.req_packed_command(cmd);
            return Box::pin(async move {
                let redis::Value::BulkString(text) = info.await? else {
                    panic!("INFO answers a bulk string");
                };
                let text = String::from_utf8(text).unwrap();
                let version = text
                    .lines()
                    .find(|l| l.starts_with("redis_version:"))
                    .unwrap()
                    .to_owned();
                Ok(redis::Value::BulkString(
                    text.replace(&version, "redis_version:6.2.14").into_bytes(),
                ))
            });
        }
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// `verify()` on a server older than 7.0 switches claims to the script up front: the first
/// claim is not refused first.
#[tokio::test]
async fn verify_on_a_server_before_7_0_chooses_the_claim_script() {
    let Some(server) = RedisServer::shared() else {
        return;
    };
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = RedisStore::new(OldRedis(conn), "old-redis-verify").unwrap();
    let report = store.verify().await.unwrap();
    assert_eq!(report.version, (6, 2, 14));
    assert!(
        !store.native_claim(),
        "claims go to the script after verify"
    );
    let engine = Engine::new(store);
    let key = StoreKey::derive(
        "old",
        &Scope::principal("old"),
        &IdempotencyKey::new("v").unwrap(),
    );
    assert!(matches!(
        engine.begin(key, fingerprint("a")).await.unwrap(),
        Begin::Run(_)
    ));
}

/// A real connection that counts what the store hands it: single commands and pipelines.
#[derive(Clone)]
struct Counting {
    conn: redis::aio::MultiplexedConnection,
    singles: Arc<std::sync::atomic::AtomicUsize>,
    pipelines: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl redis::aio::ConnectionLike for Counting {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.singles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.pipelines.lock().unwrap().push(count);
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// With pipelining, the commands of requests in flight together leave in one write, and each
/// still gets its own answer: 64 claims at once (8 keys × 8 callers) make one pipeline, with
/// exactly one winner per key; then the winners' completes travel together too.
#[tokio::test]
async fn concurrent_commands_share_one_pipeline_and_keep_their_own_answers() {
    if !redis_server::available() {
        return;
    }
    // A server of its own, which has never seen the scripts.
    let server = RedisServer::start();
    let counting = Counting {
        conn: redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap(),
        singles: Arc::default(),
        pipelines: Arc::default(),
    };
    let store = RedisStore::builder("pipelined")
        .pipelining(true)
        .build(counting.clone())
        .unwrap();
    assert!(store.pipelining());
    let engine = Engine::new(store);
    let keys: Vec<StoreKey> = (0..8).map(|_| random_key()).collect();
    let claims = keys
        .iter()
        .flat_map(|k| std::iter::repeat_n(*k, 8))
        .map(|k| engine.begin(k, fingerprint("a")));
    let answers = futures_join_all(claims).await;
    assert_eq!(
        *counting.pipelines.lock().unwrap(),
        vec![64],
        "one pipeline of all 64 claims"
    );
    let mut winners = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        match answer.unwrap() {
            Begin::Run(t) => winners.push((i / 8, t)),
            Begin::InFlight => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut won: Vec<usize> = winners.iter().map(|(k, _)| *k).collect();
    won.sort_unstable();
    assert_eq!(won, (0..8).collect::<Vec<_>>(), "one winner per key");

    // The completes are script calls, pipelined too. This server has no script yet, so each
    // command in the pipeline meets NOSCRIPT on its own and its caller loads the script and
    // runs it again: one command's error never fails the others.
    let before = commandstats(&server);
    let record = response();
    let completes = winners
        .into_iter()
        .map(|(_, t)| engine.complete(t, &record));
    for done in futures_join_all(completes).await {
        assert!(done.unwrap());
    }
    for key in &keys {
        assert!(matches!(
            engine.begin(*key, fingerprint("a")).await.unwrap(),
            Begin::Replayed(r) if r == response()
        ));
    }
    let pipelines = counting.pipelines.lock().unwrap().clone();
    assert_eq!(
        pipelines[1], 8,
        "the 8 completes left together: {pipelines:?}"
    );
    let after = delta(&before, &commandstats(&server));
    assert!(
        after.get("script|load").is_some_and(|n| *n >= 1),
        "NOSCRIPT met inside the pipeline and the script loaded: {after:?}"
    );
}

/// Polls every future in one task, as a server's concurrent requests are (no extra crate).
async fn futures_join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (fut, slot) in pending.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().map(|v| v.unwrap()).collect()
}

/// Against a server that refuses the native claim, the first claim falls back to the script
/// (nothing was written by the refused command) and later claims go straight to it.
#[tokio::test]
async fn a_server_without_set_nx_get_gets_the_claim_script() {
    let Some(server) = RedisServer::shared() else {
        return;
    };
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = RedisStore::new(OldRedis(conn), "old-redis").unwrap();
    assert!(store.native_claim());
    let engine = Engine::new(store.clone());
    let scope = Scope::principal("old");
    let key = StoreKey::derive("old", &scope, &IdempotencyKey::new("k").unwrap());
    let Begin::Run(t) = engine.begin(key, fingerprint("a")).await.unwrap() else {
        panic!("the first claim runs, through the script")
    };
    assert!(!store.native_claim(), "the store remembers the refusal");
    assert!(matches!(
        engine.begin(key, fingerprint("a")).await.unwrap(),
        Begin::InFlight
    ));
    assert!(engine.complete(t, &response()).await.unwrap());
    assert!(
        matches!(engine.begin(key, fingerprint("a")).await.unwrap(), Begin::Replayed(r) if r == response())
    );
    assert!(matches!(
        engine.begin(key, fingerprint("b")).await.unwrap(),
        Begin::KeyReused
    ));
}

// ---- failures ---------------------------------------------------------------------------

fn is_outage(kind: StoreErrorKind) -> bool {
    matches!(kind, StoreErrorKind::Unavailable | StoreErrorKind::Timeout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_fails_steps_and_the_same_store_recovers_after_a_restart() {
    if !redis_server::available() {
        return;
    }
    let mut server = RedisServer::start();
    // The default operation timeout (1 s): the first claim, on a healthy server, ends far
    // inside it.
    let store = RedisStore::builder("outage")
        .connect(&server.url())
        .await
        .expect("connect");
    let engine = Engine::new(store);
    let fp = fingerprint("a");
    let Begin::Run(ticket) = engine.begin(random_key(), fp).await.unwrap() else {
        panic!("runs")
    };

    // Requests keep arriving while the server dies.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..8)
        .map(|_| {
            let (engine, stop) = (engine.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut errors = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match engine.begin(random_key(), fp).await {
                        Ok(Begin::Run(_)) => {}
                        Ok(other) => panic!("a fresh key must run or fail, got {other:?}"),
                        Err(e) => {
                            assert!(
                                is_outage(e.kind()),
                                "an outage is Unavailable or Timeout, got {e:?}"
                            );
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                errors
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let err = engine
        .complete(ticket, &response())
        .await
        .expect_err("complete while Redis is down");
    assert!(is_outage(err.kind()), "complete during the outage: {err:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the Redis error is kept as the source"
    );
    let err = engine
        .begin(random_key(), fp)
        .await
        .expect_err("claim while Redis is down");
    assert!(is_outage(err.kind()), "claim during the outage: {err:?}");

    server.restart();
    let restarted = Instant::now();
    let mut last = None;
    while restarted.elapsed() < Duration::from_secs(10) {
        match engine.begin(random_key(), fp).await {
            Ok(Begin::Run(_)) => {
                last = None;
                break;
            }
            Ok(other) => panic!("a fresh key must run, got {other:?}"),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        last.is_none(),
        "claims must succeed again after the restart: {last:?}"
    );
    let recovered = restarted.elapsed();
    assert!(
        recovered < Duration::from_secs(5),
        "recovered only after {recovered:?}"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut errors = 0;
    for task in load {
        errors += task.await.expect("no request panics during the outage");
    }
    assert!(errors > 0, "the load saw the outage");
    eprintln!(
        "recovered {recovered:?} after the restart; {errors} requests failed during the outage"
    );
}

#[tokio::test]
async fn a_server_that_stops_answering_times_out() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    // The default operation timeout (1 s): the first claim, on a healthy server, ends far
    // inside it; the bound below is seconds wide.
    let store = RedisStore::builder("hang")
        .connect(&server.url())
        .await
        .expect("connect");
    let key = random_key();
    assert!(matches!(
        store
            .claim(&key, &fingerprint("a"), Duration::from_secs(60))
            .await,
        Ok(Claim::Claimed(_))
    ));

    signal(server.pid(), "-STOP");
    let started = Instant::now();
    let result = store
        .claim(&random_key(), &fingerprint("a"), Duration::from_secs(60))
        .await;
    let took = started.elapsed();
    signal(server.pid(), "-CONT");

    let err = result.expect_err("a paused server cannot answer");
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err:?}");
    assert!(
        took < Duration::from_secs(3),
        "the operation timeout bounds the call, took {took:?}"
    );
    // Once the server answers again, so does the store.
    assert!(matches!(
        store
            .claim(&key, &fingerprint("a"), Duration::from_secs(60))
            .await,
        Ok(Claim::Pending { .. })
    ));
}

/// A fake Redis on a paused clock that takes `delay` over every answer: it refuses
/// `SET … GET` (as before 7.0) and holds no script until `SCRIPT LOAD`.
#[derive(Clone)]
struct SlowWithoutScripts {
    delay: Duration,
    loaded: Arc<std::sync::atomic::AtomicBool>,
}

impl SlowWithoutScripts {
    fn new(delay: Duration) -> Self {
        Self {
            delay,
            loaded: Arc::default(),
        }
    }
}

impl redis::aio::ConnectionLike for SlowWithoutScripts {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        let error =
            |line: &[u8]| redis::parse_redis_value(line).and_then(redis::Value::extract_error);
        let loaded = &self.loaded;
        let answer = match args.first().map(Vec::as_slice) {
            Some(b"SET") => error(b"-ERR syntax error\r\n"),
            Some(b"SCRIPT") => {
                loaded.store(true, std::sync::atomic::Ordering::SeqCst);
                // `SCRIPT LOAD <source>` answers the source's SHA-1, which the client checks.
                let source = std::str::from_utf8(&args[2]).unwrap();
                let sha = redis::Script::new(source).get_hash().to_owned();
                Ok(redis::Value::BulkString(sha.into_bytes()))
            }
            Some(b"EVALSHA") if loaded.load(std::sync::atomic::Ordering::SeqCst) => {
                Ok(redis::Value::Int(1))
            }
            Some(b"EVALSHA") => error(b"-NOSCRIPT No matching script.\r\n"),
            _ => Ok(redis::Value::Okay),
        };
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        unreachable!("the store is built without pipelining")
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A step that meets `NOSCRIPT` sends `SCRIPT LOAD` and the `EVALSHA` again: all of it within
/// one operation timeout, not one timeout for the first `EVALSHA` and another for the rest.
/// Each answer takes 400 ms, the timeout is 1 s: 4 round trips do not fit.
#[tokio::test(start_paused = true)]
async fn loading_a_script_stays_within_the_steps_one_timeout() {
    let timeout = Duration::from_secs(1);
    let store = RedisStore::builder("one-deadline")
        .timeout(timeout)
        .build(SlowWithoutScripts::new(Duration::from_millis(400)))
        .unwrap();
    let token = tower_idempotency::store::Token::generate().unwrap();
    let started = tokio::time::Instant::now();
    let err = store
        .release(&random_key(), &token)
        .await
        .expect_err("4 round trips of 400 ms do not fit in 1 s");
    let took = started.elapsed();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err:?}");
    assert!(
        took <= timeout,
        "the step took {took:?}, over its {timeout:?} timeout"
    );

    // Answers of 200 ms: the same 4 round trips fit, and the step succeeds.
    let store = RedisStore::builder("one-deadline")
        .timeout(timeout)
        .build(SlowWithoutScripts::new(Duration::from_millis(200)))
        .unwrap();
    let started = tokio::time::Instant::now();
    assert!(store.release(&random_key(), &token).await.unwrap());
    assert_eq!(started.elapsed(), Duration::from_millis(800));
}

/// A native claim the server refuses falls back to the script within the same timeout: the
/// refused `SET`, the `EVALSHA`, the `SCRIPT LOAD` and the retry share one deadline.
#[tokio::test(start_paused = true)]
async fn a_claim_falling_back_to_the_script_stays_within_one_timeout() {
    let timeout = Duration::from_secs(1);
    let store = RedisStore::builder("one-deadline")
        .timeout(timeout)
        .build(SlowWithoutScripts::new(Duration::from_millis(300)))
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = store
        .claim(&random_key(), &fingerprint("a"), Duration::from_secs(60))
        .await
        .expect_err("5 round trips of 300 ms do not fit in 1 s");
    let took = started.elapsed();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err:?}");
    assert!(
        took <= timeout,
        "the claim took {took:?}, over its {timeout:?} timeout"
    );
    assert!(!store.native_claim(), "the refusal is remembered");
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

#[tokio::test]
async fn a_foreign_value_under_a_key_is_a_protocol_error_and_never_a_claim() {
    let Some(server) = RedisServer::shared() else {
        return;
    };
    let store = RedisStore::connect(&server.url(), "foreign")
        .await
        .expect("connect");
    let key = random_key();
    server.command(&["SET", &redis_key(store.key_prefix(), &key), "not a record"]);
    let err = store
        .claim(&key, &fingerprint("a"), Duration::from_secs(60))
        .await
        .expect_err("claim");
    assert_eq!(err.kind(), StoreErrorKind::Protocol, "{err:?}");
    let engine = Engine::new(store);
    let err = engine
        .begin(key, fingerprint("a"))
        .await
        .expect_err("begin");
    assert_eq!(
        err.kind(),
        StoreErrorKind::Protocol,
        "the work must not run: {err:?}"
    );
}

#[tokio::test]
async fn connecting_to_nothing_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"), "nothing")
        .await
        .expect_err("nothing listens there");
    assert!(is_outage(err.kind()), "{err:?}");
}

// ---- start-up checks --------------------------------------------------------------------

#[tokio::test]
async fn verify_passes_on_a_real_server() {
    let Some(server) = RedisServer::shared() else {
        return;
    };
    let store = RedisStore::connect(&server.url(), "verify")
        .await
        .expect("connect");
    let report = store.verify().await.expect("verify");
    assert!(report.version >= (5, 0, 0), "{report:?}");
    assert_eq!(report.servers, 1);
    assert!(
        report.is_noeviction(),
        "a default server does not evict: {report:?}"
    );
}

#[tokio::test]
async fn verify_reports_an_evicting_policy() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    assert_eq!(
        server.command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]),
        "OK"
    );
    let store = RedisStore::connect(&server.url(), "verify")
        .await
        .expect("connect");
    let report = store
        .verify()
        .await
        .expect("verify still passes: a warning, not a failure");
    assert!(!report.is_noeviction());
    assert_eq!(
        report.eviction,
        EvictionCheck::Evicts {
            policy: "allkeys-lru".into()
        }
    );
}

#[tokio::test]
async fn verify_passes_where_config_is_disabled() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let store = RedisStore::connect(&server.url(), "verify")
        .await
        .expect("connect");
    let report = store.verify().await.expect("verify without CONFIG");
    assert!(report.is_noeviction(), "INFO shows the policy: {report:?}");
}

/// A connection that answers INFO without a policy and refuses CONFIG (a managed Redis).
#[derive(Clone)]
struct ManagedRedis;

impl redis::aio::ConnectionLike for ManagedRedis {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let first = cmd.args_iter().next().and_then(|a| match a {
            redis::Arg::Simple(b) => Some(b.to_vec()),
            _ => None,
        });
        let answer = match first.as_deref() {
            Some(b"INFO") => Ok(redis::Value::BulkString(
                b"# Server\r\nredis_version:7.2.4\r\n".to_vec(),
            )),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "unknown command 'CONFIG'",
            ))),
        };
        Box::pin(std::future::ready(answer))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(std::future::ready(Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "no pipelines",
        )))))
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[tokio::test]
async fn verify_says_it_could_not_check_when_config_is_refused() {
    let store = RedisStore::new(ManagedRedis, "managed").unwrap();
    let report = store
        .verify()
        .await
        .expect("a refused CONFIG is not a failure");
    assert_eq!(report.version, (7, 2, 4));
    assert!(
        matches!(report.eviction, EvictionCheck::Unknown { .. }),
        "{report:?}"
    );
    assert!(!report.is_noeviction());
}

#[tokio::test]
async fn an_unexpected_script_answer_is_a_protocol_error() {
    let store = RedisStore::new(ManagedRedis, "managed").unwrap();
    let err = store
        .claim(&random_key(), &fingerprint("a"), Duration::from_secs(1))
        .await
        .expect_err("claim");
    assert_eq!(err.kind(), StoreErrorKind::Protocol, "{err:?}");
}

// ---- steps ------------------------------------------------------------------------------

/// A key's steps are one hash beside its record (`<record key>:s`), each call one script call,
/// values kept byte for byte; each recorded step keeps the hash at least its retention.
#[tokio::test]
async fn steps_are_one_hash_beside_the_record_and_each_call_one_script() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), "steps")
        .await
        .expect("connect");
    let minute = Duration::from_secs(60);
    let (a, b) = (StepId::from_bytes([1; 32]), StepId::from_bytes([2; 32]));
    let binary = Bytes::from_static(b"\0\xff\r\n");
    // Warm up: the first EVALSHA of each script meets NOSCRIPT and loads it.
    store
        .record_step(&random_key(), &a, Bytes::new(), minute)
        .await
        .unwrap();
    store.steps(&random_key()).await.unwrap();

    let key = random_key();
    let before = commandstats(&server);
    assert_eq!(
        store
            .record_step(&key, &a, binary.clone(), minute)
            .await
            .unwrap(),
        StepRecorded::Recorded
    );
    assert_eq!(
        delta(&before, &commandstats(&server)),
        counts(&[
            ("evalsha", 1),
            ("hsetnx", 1),
            ("hget", 1),
            ("hset", 1),
            ("get", 1),
            ("pttl", 1),
            ("pexpire", 1)
        ]),
        "a step recorded: one script call"
    );
    let before = commandstats(&server);
    assert_eq!(
        store
            .record_step(&key, &a, Bytes::from_static(b"second"), minute)
            .await
            .unwrap(),
        StepRecorded::Found(binary.clone())
    );
    assert_eq!(
        delta(&before, &commandstats(&server)),
        counts(&[("evalsha", 1), ("get", 1), ("hsetnx", 1), ("hget", 1)]),
        "a step found: one script call, nothing written"
    );
    let before = commandstats(&server);
    assert_eq!(store.steps(&key).await.unwrap(), [(a, binary)]);
    assert_eq!(
        delta(&before, &commandstats(&server)),
        counts(&[("evalsha", 1), ("hgetall", 1)]),
        "reading the steps: one script call"
    );

    let name = format!("{}:s", redis_key(store.key_prefix(), &key));
    assert_eq!(server.command(&["TYPE", &name]), "hash");
    assert_eq!(
        server.command(&["EXISTS", &redis_key(store.key_prefix(), &key)]),
        "0",
        "steps need no record"
    );
    store
        .record_step(&key, &b, Bytes::new(), 2 * minute)
        .await
        .unwrap();
    let left: u64 = server.command(&["PTTL", &name]).parse().unwrap();
    assert!(
        left > 60_000 && left <= 120_000,
        "a step with a longer retention extends the expiry: {left} ms"
    );
    store
        .record_step(&key, &StepId::from_bytes([9; 32]), Bytes::new(), minute)
        .await
        .unwrap();
    let left: u64 = server.command(&["PTTL", &name]).parse().unwrap();
    assert!(
        left > 60_000,
        "a step with a shorter retention never shortens it: {left} ms"
    );
}

/// Renew stays one script call, and keeps the key's steps at least their retention past the
/// new lease end; complete deletes them in its one script call.
#[tokio::test]
async fn renew_keeps_the_steps_past_the_lease_and_complete_deletes_them() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), "steps-renew")
        .await
        .expect("connect");
    let minute = Duration::from_secs(60);
    let retention = Duration::from_secs(10);
    let key = random_key();
    let fp = fingerprint("a");
    let Claim::Claimed(token) = store.claim(&key, &fp, minute).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    store
        .record_step(&key, &StepId::from_bytes([1; 32]), Bytes::new(), retention)
        .await
        .unwrap();
    let name = format!("{}:s", redis_key(store.key_prefix(), &key));
    let left: u64 = server.command(&["PTTL", &name]).parse().unwrap();
    assert!(
        left > 60_000 && left <= 70_000,
        "recorded under a claim: the lease and the retention: {left} ms"
    );

    // Warm up renew's script, then count one renew.
    assert!(store.renew(&key, &token, minute).await.unwrap());
    let before = commandstats(&server);
    assert!(store.renew(&key, &token, 2 * minute).await.unwrap());
    assert_eq!(
        delta(&before, &commandstats(&server)),
        counts(&[
            ("evalsha", 1),
            ("get", 1),
            ("pexpire", 2),
            ("hget", 1),
            ("pttl", 1)
        ]),
        "a renew is one script call"
    );
    let left: u64 = server.command(&["PTTL", &name]).parse().unwrap();
    assert!(
        left > 120_000 && left <= 130_000,
        "renewed: the new lease and the retention: {left} ms"
    );

    assert!(
        store
            .complete(&key, &token, &fp, record("a"), minute)
            .await
            .unwrap()
    );
    assert_eq!(
        server.command(&["EXISTS", &name]),
        "0",
        "a completed key's steps are deleted"
    );
}

/// Forget deletes a key's steps with its record, or when only steps are left, and keeps them
/// when it keeps a pending claim.
#[tokio::test]
async fn forget_keeps_the_steps_of_a_kept_claim() {
    let Some(server) = RedisServer::shared() else {
        return;
    };
    let store = RedisStore::connect(&server.url(), "steps-forget")
        .await
        .expect("connect");
    let minute = Duration::from_secs(60);
    let key = random_key();
    let step = StepId::from_bytes([3; 32]);
    let Claim::Claimed(_token) = store.claim(&key, &fingerprint("a"), minute).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    store
        .record_step(&key, &step, Bytes::from_static(b"x"), minute)
        .await
        .unwrap();
    assert_eq!(
        store.forget(&key, false).await.unwrap(),
        Forgotten::KeptPending
    );
    assert_eq!(
        store.steps(&key).await.unwrap().len(),
        1,
        "a kept claim keeps its steps"
    );
    assert_eq!(store.forget(&key, true).await.unwrap(), Forgotten::Pending);
    assert!(store.steps(&key).await.unwrap().is_empty());

    store
        .record_step(&key, &step, Bytes::from_static(b"x"), minute)
        .await
        .unwrap();
    assert_eq!(store.forget(&key, false).await.unwrap(), Forgotten::Nothing);
    assert!(
        store.steps(&key).await.unwrap().is_empty(),
        "steps without a record are deleted too"
    );
}

// ---- settings ---------------------------------------------------------------------------

/// Settings are made on the builder and fixed when the store is built: a clone has the same,
/// and the shortcuts give the defaults.
#[test]
fn the_builder_fixes_the_settings_and_clones_keep_them() {
    let ms = Duration::from_millis;
    let store = RedisStore::builder("settings")
        .timeout(ms(250))
        .native_claim(false)
        .pipelining(true)
        .build(ManagedRedis)
        .unwrap();
    let clone = store.clone();
    for s in [&store, &clone] {
        assert_eq!(
            (s.timeout(), s.native_claim(), s.pipelining()),
            (ms(250), false, true)
        );
    }
    let defaults = RedisStore::new(ManagedRedis, "settings").unwrap();
    assert_eq!(
        (
            defaults.timeout(),
            defaults.native_claim(),
            defaults.pipelining()
        ),
        (DEFAULT_TIMEOUT, true, false),
        "a store built over a connection: 1 s, native claims, no pipelining"
    );
    assert_eq!(defaults.key_prefix(), store.key_prefix());
    assert!(
        RedisStore::builder("").build(ManagedRedis).is_err(),
        "the builder refuses an empty prefix too"
    );
}

// ---- prefixes ---------------------------------------------------------------------------

#[tokio::test]
async fn an_empty_prefix_is_refused() {
    assert_eq!(
        RedisStore::new(ManagedRedis, "").err().map(|e| e.kind()),
        Some(ConfigErrorKind::InvalidName)
    );
    // Refused before any connection is tried (nothing listens on port 1).
    let err = RedisStore::connect("redis://127.0.0.1:1/", "")
        .await
        .expect_err("empty prefix");
    assert!(
        std::error::Error::source(&err).is_some_and(|s| s.is::<ConfigError>()),
        "{err:?}"
    );
}

#[tokio::test]
async fn prefixes_never_see_each_others_records_and_keys_hold_nothing_raw() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    let (ns_a, ns_b) = ("prefix-alpha-visible", "prefix-beta-visible");
    let a = RedisStore::connect(&server.url(), ns_a)
        .await
        .expect("connect");
    let b = RedisStore::connect(&server.url(), ns_b)
        .await
        .expect("connect");
    assert_ne!(a.key_prefix(), b.key_prefix());

    // The same store key under both prefixes: two separate records.
    let key = StoreKey::derive(
        "shared",
        &Scope::principal("principal-visible"),
        &IdempotencyKey::new("client-key-visible").unwrap(),
    );
    let fp = fingerprint("a");
    let Ok(Claim::Claimed(ta)) = a.claim(&key, &fp, Duration::from_secs(60)).await else {
        panic!("a claims")
    };
    let Ok(Claim::Claimed(tb)) = b.claim(&key, &fp, Duration::from_secs(60)).await else {
        panic!("b must not see a's pending record")
    };
    assert!(
        a.complete(&key, &ta, &fp, record("a"), Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        matches!(
            b.claim(&key, &fp, Duration::from_secs(60)).await,
            Ok(Claim::Pending { .. })
        ),
        "b sees only its own"
    );
    assert!(
        !b.release(&key, &ta).await.unwrap(),
        "a's token means nothing in b"
    );
    assert!(b.release(&key, &tb).await.unwrap());
    assert!(
        matches!(
            a.claim(&key, &fp, Duration::from_secs(60)).await,
            Ok(Claim::Done { .. })
        ),
        "b's release left a alone"
    );

    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "only a's record is left");
    let value: Vec<u8> = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    for raw in [
        ns_a,
        ns_b,
        "shared",
        "principal-visible",
        "client-key-visible",
    ] {
        let contains = |hay: &[u8]| hay.windows(raw.len()).any(|w| w == raw.as_bytes());
        assert!(
            !contains(&keys[0]) && !contains(&value),
            "{raw:?} must not be stored"
        );
    }
    let name = String::from_utf8(keys[0].clone()).unwrap();
    assert_eq!(name, redis_key(a.key_prefix(), &key));
    assert!(
        name.starts_with("ti:") && name.ends_with('}') && name.contains(":{"),
        "{name}"
    );
}

/// A hold that lands once the lease lapsed (a slow write, a stalled process) claims the key
/// again for the hold time, and keeps its steps past the hold as a hold in time does: the
/// retry after the hold answers a done step from its record. Real time: each deadline is
/// missed or met by 2 s.
#[tokio::test]
async fn a_late_hold_keeps_the_key_and_its_steps_past_the_hold() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use tower_idempotency::engine::{Fingerprint, Raw};
    let Some(server) = RedisServer::shared() else {
        return;
    };
    let store = RedisStore::connect(&server.url(), "late-hold")
        .await
        .expect("connect");
    // Steps are kept to 1 s (lease) + 4 s (retention) = 5 s; the hold ends at 3 + 6 = 9 s.
    let engine = Engine::builder(store)
        .lease(Duration::from_secs(1))
        .retention(Duration::from_secs(4))
        .build();
    let key = random_key();
    let fp = Fingerprint::builder().field(b"order 17").finish();
    let charges = AtomicUsize::new(0);
    let charge = || async {
        charges.fetch_add(1, SeqCst);
        Ok::<_, String>("ch_1".to_owned())
    };
    let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("first run")
    };
    engine
        .steps(&ticket)
        .run("charge", Raw, |_| charge())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await; // the lease lapsed at 1 s
    assert!(
        engine.hold(ticket, Duration::from_secs(6)).await.unwrap(),
        "nothing claimed the key since: held"
    );
    assert!(matches!(
        engine.begin(key, fp).await.unwrap(),
        Begin::InFlight
    ));
    tokio::time::sleep(Duration::from_secs(8)).await; // 11 s: the hold ended at 9 s
    let Begin::Run(retry) = engine.begin(key, fp).await.unwrap() else {
        panic!("the hold ended")
    };
    let again: String = engine
        .steps(&retry)
        .run("charge", Raw, |_| charge())
        .await
        .unwrap();
    assert_eq!(again, "ch_1");
    assert_eq!(charges.load(SeqCst), 1, "the charge ran once");
}

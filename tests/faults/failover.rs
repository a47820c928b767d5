//! A duplicate storm over two application processes while Redis fails: a Sentinel failover
//! (`kill -9` of the primary, the replica promoted, the old primary restarted as a replica),
//! and a 3 s partition of one process from a standalone Redis (the fault proxy).
//!
//! Each process is this test binary run again as a child ([`storm_app`]): the HTTP layer over
//! a `RedisStore` with its defaults, in front of a handler that answers 201 with a random run
//! tag. The child logs in its own memory, where a failover cannot reach: every claim (key,
//! token), every handler run (key, tag), every complete (token, tag, written or the error's
//! kind). `GET /log` returns the log. The parent sends each key several times from several
//! clients to both processes over HTTP, injects the fault, and counts from the answers and the
//! logs: records acknowledged (a complete that returned written), acknowledged records lost
//! (the key ran again, or does not replay at the end), duplicate executions and why, failed
//! requests, and the time until requests succeed again.
//!
//! Asserted in every run: nothing ran without a claim, every handler run's response reached its
//! caller (a failed complete still answers the handler's body), every replay is a run of its
//! key. With `wait_for_replicas(1, ..)` no acknowledged record may be lost (asserted; the CI
//! cases). With every default, a key runs again after a 2xx only when its record was lost or
//! its complete failed (asserted; the CI case). The other figures are printed by the `#[ignore]`d tests (see each test).
#![cfg(all(feature = "redis-sentinel", feature = "test-util"))]
#![allow(clippy::unwrap_used)]

use crate::support::apps::{Mix, env_or, run_jobs};
use crate::support::child::{AppProcess, serve, setting};
use crate::support::http::{Answer, Kind, LAYER_NS, client, lock, send, store_key};
use crate::support::observed::{Observed, Step};
use crate::support::proxy::Proxy;
use crate::support::redis_sentinel::{self, SERVICE, SentinelSet};
use crate::support::redis_server::{self, RedisServer};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::conformance::{fingerprint, random_key};
use tower_idempotency::engine::{Begin, Engine, Recorded, Scope};
use tower_idempotency::store::redis::RedisStore;
use tower_idempotency::store::{Claim, Record};

/// The principal of every request: one scope for the whole storm.
const PRINCIPAL: &str = "storm";
/// The `WAIT` bound of `wait_for_replicas`: short beside the 1 s step timeout.
const WAIT_MS: u64 = 50;
/// Clients per application process.
const CLIENTS_PER_APP: usize = 4;

/// Milliseconds since the Unix epoch: one clock for the parent and its children.
fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits u64")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// The application process (the child)
// ---------------------------------------------------------------------------------------------

/// One entry of a child's log.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Event {
    /// `claimed`, `ran` or `complete`.
    event: String,
    /// The store key's hex id (`claimed`, `complete`) or the idempotency key (`ran`).
    key: String,
    ms: u64,
    #[serde(default)]
    token: String,
    /// The handler run's tag (`ran`, and `complete`: read from the record).
    #[serde(default)]
    run: String,
    /// `complete`: `written`, `not_written` (another holder has the key) or the error's kind.
    #[serde(default)]
    result: String,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Event>>>);

impl Log {
    fn push(&self, e: Event) {
        lock(&self.0).push(e);
    }
}

/// The run tag in a record's body (`"run":"<16 hex digits>"`).
fn run_of(record: &Record) -> String {
    let bytes = record.as_bytes();
    let pat = b"\"run\":\"";
    bytes
        .windows(pat.len())
        .position(|w| w == pat)
        .and_then(|i| bytes.get(i + pat.len()..i + pat.len() + 16))
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .unwrap_or_default()
}

/// Logs each claim won and each complete with its result.
fn log_steps(log: Log) -> impl Fn(Step<'_>) + Send + Sync + 'static {
    move |step| match step {
        Step::Claim {
            key,
            result: Ok(Claim::Claimed(token)),
            ..
        } => log.push(Event {
            event: "claimed".into(),
            key: key.id_hex(),
            ms: now_ms(),
            token: hex(token.as_bytes()),
            ..Event::default()
        }),
        Step::Claim { .. } => {}
        Step::Complete {
            key,
            token,
            record,
            result,
            ..
        } => log.push(Event {
            event: "complete".into(),
            key: key.id_hex(),
            ms: now_ms(),
            token: hex(token.as_bytes()),
            run: run_of(record),
            result: match result {
                Ok(true) => "written".into(),
                Ok(false) => "not_written".into(),
                Err(e) => format!("{:?}", e.kind()),
            },
        }),
    }
}

/// The handler: logs its run, works 0–3 ms, answers 201 `{"key", "run"}`.
async fn order(
    State(log): State<Log>,
    headers: HeaderMap,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let mut b = [0u8; 9];
    getrandom::fill(&mut b).expect("OS random source");
    let run = hex(&b[..8]);
    log.push(Event {
        event: "ran".into(),
        key: key.clone(),
        ms: now_ms(),
        run: run.clone(),
        ..Event::default()
    });
    tokio::time::sleep(Duration::from_millis(u64::from(b[8] % 4))).await;
    (
        StatusCode::CREATED,
        axum::Json(serde_json::json!({ "key": key, "run": run })),
    )
}

async fn dump(State(log): State<Log>) -> axum::Json<Vec<Event>> {
    axum::Json(lock(&log.0).clone())
}

/// The application process of the storms, started by them as a child. Settings:
/// `STORM_SENTINELS` (comma-separated sentinel URLs) or `STORM_REDIS` (a Redis URL), and
/// `STORM_WAIT_MS` (`wait_for_replicas(1, ..)` when set). Everything else is the default:
/// step timeout 1 s, lease 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an application process of the storm tests, started by them"]
async fn storm_app() {
    let (sentinels, redis) = (setting("STORM_SENTINELS"), setting("STORM_REDIS"));
    if sentinels.is_none() && redis.is_none() {
        return;
    }
    let mut builder = RedisStore::builder("storm");
    if let Some(ms) = setting("STORM_WAIT_MS") {
        builder = builder.wait_for_replicas(1, Duration::from_millis(ms.parse().unwrap()));
    }
    let store = match (sentinels, redis) {
        (Some(s), _) => {
            let urls: Vec<String> = s.split(',').map(str::to_owned).collect();
            builder.connect_sentinel(urls, SERVICE, None).await
        }
        (None, Some(url)) => builder.connect(&url).await,
        (None, None) => unreachable!(),
    }
    .expect("connect to Redis");
    let log = Log::default();
    let store = Observed::new(store, log_steps(log.clone()));
    let layer = IdempotencyLayer::new(Engine::builder(store).build())
        .principal_fn(|_| Some(Scope::principal(PRINCIPAL)));
    let router = Router::new()
        .route("/orders", post(order))
        .layer(layer)
        .route("/log", get(dump))
        .with_state(log);
    serve(router).await;
}

/// Starts an application process with the settings `env`.
async fn app(env: &[(&str, String)]) -> AppProcess {
    AppProcess::start("failover::storm_app", env).await
}

// ---------------------------------------------------------------------------------------------
// The storm (the parent)
// ---------------------------------------------------------------------------------------------

/// How the replica keeps up when the primary dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replica {
    /// Replicating directly, on loopback: it is rarely behind.
    InStep,
    /// Replicating through the fault proxy, which stops forwarding (a partition) 300 ms
    /// before the kill and then drops what it held: the replica misses those writes.
    Behind,
}

/// What a storm observed. Printed (`Display`) and partly asserted.
#[derive(Debug, Default)]
struct Report {
    label: String,
    load: Load,
    requests: usize,
    /// Answers by kind, per application process.
    answers: Vec<Mix>,
    /// Handler runs, and keys that ran more than once.
    executions: usize,
    keys_run_twice: usize,
    /// Keys that ran again after a client had a 2xx from an earlier run of theirs, and of
    /// those, the ones with a record acknowledged before that run.
    ran_again_after_2xx: usize,
    ran_again_after_acknowledged: usize,
    /// Keys with a complete that returned written.
    acknowledged: usize,
    /// Acknowledged records lost, by how it showed.
    lost: BTreeMap<&'static str, usize>,
    /// When the runs that showed a record lost began, from the fault (first, last), and how
    /// many each app ran.
    lost_window: Option<(Duration, Duration)>,
    lost_by_app: Vec<usize>,
    /// Runs after the first of a key, by why.
    repeats: BTreeMap<String, usize>,
    /// Completes by result.
    completes: BTreeMap<String, usize>,
    /// Per process: when its failed requests ended, from the fault (first, last).
    failed_between: Vec<Option<(Duration, Duration)>>,
    /// Per process: from the fault to the first answer after its last failed request (zero:
    /// none failed).
    recovered_after: Vec<Duration>,
    /// From the start of the storm to the fault.
    fault_at: Duration,
    took: Duration,
}

impl Report {
    fn lost(&self) -> usize {
        self.lost.values().sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let answers: Vec<String> = self.answers.iter().map(|m| format!("[{m}]")).collect();
        write!(
            f,
            "storm, {}: {} requests in {:.1?} ({} keys x {} passes by {} clients on each of 2 \
             apps), fault at {:.1?}; acknowledged {}, LOST {} {:?} (runs that showed it: {:.2?} after \
             the fault, per app {:?}); executions {} (keys run \
             twice {}, run again after a 2xx {} of which acknowledged {}), repeats {:?}; completes {:?}; answers per app {}; failed requests \
             ended (per app, from the fault) {:.2?}; recovered after (per app: the first answer \
             after the last failure) {:.2?}",
            self.label,
            self.requests,
            self.took,
            self.load.keys,
            self.load.passes,
            CLIENTS_PER_APP,
            self.fault_at,
            self.acknowledged,
            self.lost(),
            self.lost,
            self.lost_window,
            self.lost_by_app,
            self.executions,
            self.keys_run_twice,
            self.ran_again_after_2xx,
            self.ran_again_after_acknowledged,
            self.repeats,
            self.completes,
            answers.join(" "),
            self.failed_between,
            self.recovered_after,
        )
    }
}

/// The size of a storm: every client sends each of `keys` keys `passes` times.
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    keys: usize,
    passes: usize,
}

impl Load {
    /// The CI case: short. `FAILOVER_KEYS` and `FAILOVER_PASSES` change it.
    fn ci() -> Self {
        Self::or(240, 2)
    }

    /// The figures: `FAILOVER_KEYS` and `FAILOVER_PASSES` change it.
    fn figures() -> Self {
        Self::or(300, 3)
    }

    fn or(keys: usize, passes: usize) -> Self {
        Self {
            keys: env_or("FAILOVER_KEYS", keys),
            passes: env_or("FAILOVER_PASSES", passes),
        }
    }
}

fn order_request(http: &reqwest::Client, base: &str, k: usize) -> reqwest::RequestBuilder {
    http.post(format!("{base}/orders"))
        .header("idempotency-key", format!("k{k}"))
        .header("content-type", "application/json")
        .body(format!("{{\"n\":{k}}}"))
}

/// The run tag of an answer's JSON body.
fn run_tag(a: &Answer) -> String {
    a.json()["run"].as_str().unwrap_or_default().to_owned()
}

/// Runs the storm over `apps` (client `c` sends to app `c % 2`), injects `fault` once a third
/// of the keys answered fresh, and counts. What `fault` returns (the servers) lives until the
/// counting is done.
async fn drive<K>(
    apps: &[AppProcess],
    load: Load,
    label: &str,
    fault: impl Future<Output = K>,
) -> Report {
    let Load { keys, passes } = load;
    let clients = 2 * CLIENTS_PER_APP;
    let http = client();
    let bases: Arc<Vec<String>> = Arc::new(apps.iter().map(|a| a.url("")).collect());
    let fresh = Arc::new(AtomicUsize::new(0));
    let ends: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0; keys * passes * clients]));
    let started = Instant::now();
    let storm = {
        let (http, bases, fresh, ends) = (
            http.clone(),
            Arc::clone(&bases),
            Arc::clone(&fresh),
            Arc::clone(&ends),
        );
        // Job `i` is request `i / clients` of client `i % clients`: each client walks every
        // key `passes` times, from its own offset.
        tokio::spawn(run_jobs(keys * passes * clients, clients, move |i| {
            let (c, n) = (i % clients, i / clients);
            let k = (c * keys / clients + n) % keys;
            let req = order_request(&http, &bases[c % 2], k);
            let (fresh, ends) = (Arc::clone(&fresh), Arc::clone(&ends));
            async move {
                let a = send(req).await;
                if a.kind() == Kind::Fresh {
                    fresh.fetch_add(1, Ordering::SeqCst);
                }
                lock(&ends)[i] = now_ms();
                a
            }
        }))
    };

    let deadline = Instant::now() + Duration::from_secs(60);
    while fresh.load(Ordering::SeqCst) < keys / 3 {
        assert!(Instant::now() < deadline, "the storm made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fault_at = started.elapsed();
    let fault_ms = now_ms();
    let servers = fault.await;
    let answers = tokio::time::timeout(Duration::from_secs(300), storm)
        .await
        .expect("the storm ends")
        .expect("the storm's tasks");
    let took = started.elapsed();
    let ends = std::mem::take(&mut *lock(&ends));

    // The logs, before anything else runs.
    let mut logs = Vec::new();
    for a in apps {
        let log: Vec<Event> = send(http.get(a.url("/log")))
            .await
            .json()
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|e| serde_json::from_value(e.clone()).expect("a log entry"))
                    .collect()
            })
            .expect("a log");
        logs.push(log);
    }
    let mut report = count(apps, load, &answers, &ends, fault_ms, &logs, &http).await;
    report.label = label.to_owned();
    report.load = load;
    report.requests = answers.len();
    report.fault_at = fault_at;
    report.took = took;
    eprintln!("{report}");
    drop(servers);
    report
}

/// One handler run, from the logs.
#[derive(Debug, Clone)]
struct Run {
    app: usize,
    ran: u64,
    /// The claim's time and the complete's (time, result), by the token.
    claimed: Option<u64>,
    complete: Option<(u64, String)>,
}

/// Checks the invariants and counts (see the module docs).
async fn count(
    apps: &[AppProcess],
    load: Load,
    answers: &[Answer],
    ends: &[u64],
    fault_ms: u64,
    logs: &[Vec<Event>],
    http: &reqwest::Client,
) -> Report {
    let (keys, clients) = (load.keys, 2 * CLIENTS_PER_APP);
    let key_of_job = |i: usize| (i % clients * keys / clients + i / clients) % keys;
    let index: HashMap<String, usize> = (0..keys)
        .map(|k| (store_key(LAYER_NS, PRINCIPAL, &format!("k{k}")).id_hex(), k))
        .collect();

    // Every run by its tag; claims and completes by token.
    let mut runs: HashMap<String, (usize, Run)> = HashMap::new();
    let mut claims: HashMap<String, (usize, u64)> = HashMap::new();
    let mut completes: HashMap<String, (u64, String, String)> = HashMap::new();
    let mut completes_count = BTreeMap::new();
    for (app, log) in logs.iter().enumerate() {
        for e in log {
            match e.event.as_str() {
                "ran" => {
                    let k: usize = e.key.trim_start_matches('k').parse().expect("a storm key");
                    runs.insert(
                        e.run.clone(),
                        (
                            k,
                            Run {
                                app,
                                ran: e.ms,
                                claimed: None,
                                complete: None,
                            },
                        ),
                    );
                }
                "claimed" => {
                    claims.insert(e.token.clone(), (app, e.ms));
                }
                "complete" => {
                    *completes_count.entry(e.result.clone()).or_insert(0) += 1;
                    completes.insert(e.run.clone(), (e.ms, e.token.clone(), e.result.clone()));
                    assert!(index.contains_key(&e.key), "a complete of a storm key");
                }
                other => panic!("unknown log entry {other}"),
            }
        }
    }
    for (tag, (_, run)) in &mut runs {
        let (ms, token, result) = completes
            .get(tag)
            .unwrap_or_else(|| panic!("run {tag} was settled: {run:?}"));
        let (app, claimed) = claims
            .get(token)
            .unwrap_or_else(|| panic!("run {tag} ran under a claim: {run:?}"));
        assert_eq!(*app, run.app, "run {tag} ran in the process that claimed");
        assert!(*claimed <= run.ran, "run {tag} ran after its claim");
        run.claimed = Some(*claimed);
        run.complete = Some((*ms, result.clone()));
    }

    // Every run's response reached its caller, once; every replay is a run of its key.
    let mut delivered: HashMap<String, usize> = HashMap::new();
    for (i, a) in answers.iter().enumerate() {
        match a.kind() {
            Kind::Fresh | Kind::Replay => {
                let tag = run_tag(a);
                let (k, _) = runs
                    .get(&tag)
                    .unwrap_or_else(|| panic!("answer {i} is a handler run's: {}", a.describe()));
                assert_eq!(
                    *k,
                    key_of_job(i),
                    "answer {i} is a run of its key: {}",
                    a.describe()
                );
                if a.kind() == Kind::Fresh {
                    *delivered.entry(tag).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    for tag in runs.keys() {
        assert_eq!(
            delivered.get(tag),
            Some(&1),
            "the response of run {tag} reached its caller once: {:?}",
            runs[tag]
        );
    }

    // Per key: its runs in order, and why each after the first happened.
    let mut per_key: BTreeMap<usize, Vec<(String, Run)>> = BTreeMap::new();
    for (tag, (k, run)) in &runs {
        per_key
            .entry(*k)
            .or_default()
            .push((tag.clone(), run.clone()));
    }
    let mut report = Report::default();
    let mut acknowledged: BTreeMap<usize, String> = BTreeMap::new();
    let lease_ms = 60_000;
    for (k, runs) in &mut per_key {
        runs.sort_by_key(|(_, r)| r.ran);
        for (i, (tag, run)) in runs.iter().enumerate() {
            let (_, result) = run.complete.clone().unwrap();
            if result == "written" && !acknowledged.contains_key(k) {
                acknowledged.insert(*k, tag.clone());
            }
            if i == 0 {
                continue;
            }
            let earlier = &runs[..i];
            let acked_before = earlier.iter().any(|(_, r)| {
                matches!(&r.complete, Some((ms, res)) if res == "written" && *ms <= run.ran)
            });
            let (_, prev) = &earlier[i - 1];
            let (prev_done, prev_result) = prev.complete.clone().unwrap();
            let why = if acked_before {
                "record lost (acknowledged, then run again)".to_owned()
            } else if prev_done > run.ran {
                if run.ran - prev.claimed.unwrap() >= lease_ms {
                    "lease lapsed while the first run went on".to_owned()
                } else {
                    "claim lost (the first run still held it)".to_owned()
                }
            } else if prev_result == "not_written" {
                "after a complete that found another holder".to_owned()
            } else {
                format!("after a failed complete ({prev_result})")
            };
            *report.repeats.entry(why).or_insert(0) += 1;
        }
    }
    // When a client first had a 2xx of each key (the answer's end, on the shared clock).
    let mut first_2xx: HashMap<usize, u64> = HashMap::new();
    for (i, a) in answers.iter().enumerate() {
        if a.kind() == Kind::Fresh {
            let at = first_2xx.entry(key_of_job(i)).or_insert(u64::MAX);
            *at = (*at).min(ends[i]);
        }
    }
    for (k, runs) in &per_key {
        let Some(&delivered) = first_2xx.get(k) else {
            continue;
        };
        if let Some((_, again)) = runs.iter().find(|(_, r)| r.ran > delivered) {
            report.ran_again_after_2xx += 1;
            let acked_before = runs.iter().any(|(_, r)| {
                matches!(&r.complete, Some((ms, res)) if res == "written" && *ms <= again.ran)
            });
            if acked_before {
                report.ran_again_after_acknowledged += 1;
            }
        }
    }
    report.executions = runs.len();
    report.keys_run_twice = per_key.values().filter(|r| r.len() > 1).count();
    report.acknowledged = acknowledged.len();
    report.completes = completes_count;
    // A record is lost when its key ran again after it was acknowledged: the first run of
    // such a key after its acknowledgement, by when (from the fault) and in which app.
    let mut lost_runs: Vec<(u64, usize)> = Vec::new();
    let mut ran_again = Vec::new();
    for (k, tag) in &acknowledged {
        let runs = &per_key[k];
        let acked = runs
            .iter()
            .find(|(t, _)| t == tag)
            .unwrap()
            .1
            .complete
            .clone()
            .unwrap()
            .0;
        if let Some((_, r)) = runs.iter().find(|(t, r)| t != tag && r.ran >= acked) {
            ran_again.push(*k);
            lost_runs.push((r.ran, r.app));
        }
    }
    report.lost.insert(
        "ran again after its record was acknowledged",
        lost_runs.len(),
    );
    let from_fault = |ms: u64| Duration::from_millis(ms.saturating_sub(fault_ms));
    report.lost_window = lost_runs
        .iter()
        .map(|r| r.0)
        .min()
        .zip(lost_runs.iter().map(|r| r.0).max())
        .map(|(a, b)| (from_fault(a), from_fault(b)));
    report.lost_by_app = (0..apps.len())
        .map(|app| lost_runs.iter().filter(|r| r.1 == app).count())
        .collect();

    // At the end, every other acknowledged record answers (a replay of one of its key's runs),
    // on both processes in turn: each has recovered. A key that ran again may be pending
    // (its last complete failed) for the whole lease: it is lost already.
    let (mut not_replayed, mut pending) = (0, 0);
    for k in acknowledged.keys().filter(|k| !ran_again.contains(k)) {
        let base = apps[k % 2].url("");
        let (held, deadline) = (
            Instant::now() + Duration::from_secs(5),
            Instant::now() + Duration::from_secs(30),
        );
        loop {
            let a = send(order_request(http, &base, *k)).await;
            match a.kind() {
                Kind::Replay => {
                    assert!(
                        per_key[k].iter().any(|(t, _)| *t == run_tag(&a)),
                        "key {k} replays one of its runs: {}",
                        a.describe()
                    );
                    break;
                }
                Kind::Fresh => {
                    not_replayed += 1;
                    break;
                }
                // A claim holds the key, not the record: a claim whose answer was lost (it
                // timed out, yet landed) after the record was.
                Kind::InFlight if Instant::now() > held => {
                    pending += 1;
                    break;
                }
                _ => {
                    assert!(
                        Instant::now() < deadline,
                        "key {k} at the end: {}",
                        a.describe()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    report
        .lost
        .insert("ran at the end, not replayed", not_replayed);
    report
        .lost
        .insert("pending at the end, not replayed", pending);

    // Answers and recovery per process.
    for app in 0..apps.len() {
        let mine: Vec<usize> = (0..answers.len())
            .filter(|i| i % clients % 2 == app)
            .collect();
        report
            .answers
            .push(Mix::of(mine.iter().map(|&i| &answers[i])));
        // The store answered: a run, a replay, or a key in flight.
        let answered = |i: usize| {
            matches!(
                answers[i].kind(),
                Kind::Fresh | Kind::Replay | Kind::InFlight
            )
        };
        let failures: Vec<u64> = mine
            .iter()
            .filter(|&&i| !answered(i))
            .map(|&i| ends[i])
            .collect();
        let recovered = failures.iter().max().map(|&last| {
            let next = mine
                .iter()
                .filter(|&&i| answered(i) && ends[i] > last)
                .map(|&i| ends[i])
                .min()
                .unwrap_or(last);
            next.saturating_sub(fault_ms)
        });
        let from_fault = |ms: u64| Duration::from_millis(ms.saturating_sub(fault_ms));
        report.failed_between.push(
            failures
                .iter()
                .min()
                .zip(failures.iter().max())
                .map(|(&a, &b)| (from_fault(a), from_fault(b))),
        );
        report
            .recovered_after
            .push(Duration::from_millis(recovered.unwrap_or(0)));
    }
    report
}

/// The storm over a Sentinel set whose primary is killed mid-storm.
async fn failover_storm(load: Load, wait_for_replicas: bool, replica: Replica) -> Report {
    let primary = RedisServer::start();
    let proxy = Proxy::start(primary.port()).await;
    let mut set = match replica {
        Replica::InStep => {
            let port = primary.port();
            SentinelSet::start_with(primary, port, 2000)
        }
        Replica::Behind => SentinelSet::start_with(primary, proxy.port(), 60_000),
    };
    let mut env = vec![("STORM_SENTINELS", set.urls().join(","))];
    if wait_for_replicas {
        env.push(("STORM_WAIT_MS", WAIT_MS.to_string()));
    }
    let apps = [app(&env).await, app(&env).await];
    let label = format!(
        "failover, wait_for_replicas {}, replica {replica:?}",
        if wait_for_replicas { "on" } else { "off" }
    );
    drive(&apps, load, &label, async move {
        if replica == Replica::Behind {
            proxy.black_hole();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        set.primary().stop();
        let killed = Instant::now();
        proxy.drop_all();
        tokio::task::block_in_place(|| {
            set.wait_for_promotion();
            let promoted = killed.elapsed();
            // Back, empty (no persistence): the sentinels make it a replica of the new primary.
            set.primary().restart();
            eprintln!(
                "failover: replica promoted {promoted:.2?} after the kill; old primary restarted \
                 {:.2?} after",
                killed.elapsed()
            );

            if setting("FAILOVER_TRACE").is_some() {
                trace_roles(&[set.primary().port(), set.replica().port()], killed);
            }
        });
        (set, proxy)
    })
    .await
}

/// Prints the role, primary and size of each server at `ports` each time one changes, for
/// 15 s (`FAILOVER_TRACE`: to see how the set reconfigured).
fn trace_roles(ports: &[u16], since: Instant) {
    let mut last = String::new();
    while since.elapsed() < Duration::from_secs(15) {
        let now: Vec<String> = ports
            .iter()
            .map(|&port| {
                let info =
                    redis_server::command(port, &["INFO", "replication"]).unwrap_or_default();
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.trim().strip_prefix(name))
                        .unwrap_or("-")
                        .to_owned()
                };
                let size = redis_server::command(port, &["DBSIZE"]).unwrap_or_default();
                format!(
                    "{port}: {} of {} link {} replicas {} keys {size}",
                    field("role:"),
                    field("master_port:"),
                    field("master_link_status:"),
                    field("connected_slaves:")
                )
            })
            .collect();
        let now = now.join("; ");
        if now != last {
            eprintln!("failover +{:.2?}: {now}", since.elapsed());
            last = now;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// App A cut off from a standalone Redis for 3 s by the fault proxy (a partition TCP has not
/// given up on), then healed; app B keeps its direct connection.
async fn partition_storm(load: Load) -> Report {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let apps = [
        app(&[("STORM_REDIS", proxy.url())]).await,
        app(&[("STORM_REDIS", server.url())]).await,
    ];
    drive(&apps, load, "partition of app A for 3 s", async move {
        proxy.black_hole();
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.restore();
        (server, proxy)
    })
    .await
}

/// After a failover the old primary, restarted empty (no persistence), answers as a primary
/// until the sentinels demote it, seconds later. A store idle through the failover must not
/// reconnect to it: its first steps after go to the promoted replica, where the record is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_idle_through_a_failover_skips_the_restarted_old_primary() {
    if !redis_sentinel::available() {
        return;
    }
    let mut set = SentinelSet::start();
    let store = RedisStore::builder("idle")
        .wait_for_replicas(1, Duration::from_millis(400))
        .connect_sentinel(set.urls(), SERVICE, None)
        .await
        .expect("connect through the sentinels");
    let engine = Engine::new(store);
    let (key, fp) = (random_key(), fingerprint("a"));
    let response = Recorded::new(201, vec![], Some(Bytes::from_static(b"{}")));
    let Ok(Begin::Run(t)) = engine.begin(key, fp).await else {
        panic!("a fresh key runs")
    };
    assert!(engine.complete(t, &response).await.unwrap(), "acknowledged");

    set.primary().stop();
    tokio::task::block_in_place(|| {
        set.wait_for_promotion();
        set.primary().restart();
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match engine.begin(key, fp).await {
            Ok(Begin::Replayed(r)) => {
                assert_eq!(r, response);
                break;
            }
            Ok(other) => panic!("the acknowledged record answers; found {other:?}"),
            Err(e) => assert!(Instant::now() < deadline, "still failing: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs in CI: with the option on, a primary killed mid-storm while its replica is 300 ms
/// behind loses no acknowledged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_storm_loses_no_acknowledged_record_with_wait_for_replicas() {
    if !redis_sentinel::available() {
        return;
    }
    let load = Load::ci();
    let report = failover_storm(load, true, Replica::Behind).await;
    assert_ci_promises(&report, load);
}

/// Runs in CI: the same with the replica in step, where the promoted replica has no replica of
/// its own until the old primary rejoins and syncs, seconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_storm_with_the_replica_in_step_loses_nothing_with_wait_for_replicas() {
    if !redis_sentinel::available() {
        return;
    }
    let load = Load::ci();
    let report = failover_storm(load, true, Replica::InStep).await;
    assert_ci_promises(&report, load);
}

/// Runs in CI, with every default (`wait_for_replicas` off, the store's and the engine's
/// defaults): a primary killed mid-storm while its replica is 300 ms behind. The records the
/// replica had not received are lost, as the store's docs say; nothing else is. A key runs
/// again after a 2xx only when its acknowledged record was lost or its complete failed, and
/// service comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_storm_with_every_default_runs_again_only_the_keys_whose_record_it_lost() {
    if !redis_sentinel::available() {
        return;
    }
    let load = Load::ci();
    let report = failover_storm(load, false, Replica::Behind).await;
    let failed_completes: usize = report
        .completes
        .iter()
        .filter(|(result, _)| *result != "written")
        .map(|(_, n)| n)
        .sum();
    assert!(
        report.ran_again_after_2xx <= report.lost() + failed_completes,
        "a key runs again after a 2xx only when its record was lost or its complete failed: \
         {report}"
    );
    for recovered in &report.recovered_after {
        assert!(*recovered < Duration::from_secs(20), "{report}");
    }
    assert!(report.acknowledged >= load.keys / 6, "{report}");
}

/// What the option promises under a failover: no acknowledged record lost, so no key runs
/// again after its record was acknowledged; a key may run again after a 2xx only when its
/// complete failed (the caller had the handler's response, the record was not acknowledged);
/// and service comes back.
fn assert_ci_promises(report: &Report, load: Load) {
    assert_eq!(report.lost(), 0, "{report}");
    assert_eq!(report.ran_again_after_acknowledged, 0, "{report}");
    let failed_completes: usize = report
        .completes
        .iter()
        .filter(|(result, _)| *result != "written")
        .map(|(_, n)| n)
        .sum();
    assert!(
        report.ran_again_after_2xx <= failed_completes,
        "a key runs again after a 2xx only after a failed complete: {report}"
    );
    for recovered in &report.recovered_after {
        assert!(*recovered < Duration::from_secs(20), "{report}");
    }
    // A third of the keys answered before the kill; on a loaded machine some of their
    // completes were not acknowledged in 50 ms.
    assert!(report.acknowledged >= load.keys / 6, "{report}");
}

/// The storm at full size with the option off and on, the replica behind and in step: the
/// figures, printed. `FAILOVER_CASES` picks some, as `off-Behind,on-InStep`. Run with `cargo test -p tower-idempotency --all-features --test faults --
/// --ignored failover_storm_figures --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures, printed: run by hand"]
async fn failover_storm_figures() {
    if !redis_sentinel::available() {
        return;
    }
    // Keys run again after a 2xx without the option, by replica: the bound of the option's.
    let mut without = HashMap::new();
    for (wait, replica) in [
        (false, Replica::Behind),
        (true, Replica::Behind),
        (false, Replica::InStep),
        (true, Replica::InStep),
    ] {
        let case = format!("{}-{replica:?}", if wait { "on" } else { "off" });
        if setting("FAILOVER_CASES").is_some_and(|only| !only.split(',').any(|c| c == case)) {
            continue;
        }
        let load = Load::figures();
        let report = failover_storm(load, wait, replica).await;
        assert!(report.acknowledged >= load.keys / 3, "{report}");
        if wait {
            assert_ci_promises(&report, load);
            // The option's target: no more keys run again after a 2xx than without it.
            if let Some(off) = without.get(&format!("{replica:?}")) {
                assert!(
                    report.ran_again_after_2xx <= *off,
                    "with the option {} keys ran again after a 2xx, without it {off}: {report}",
                    report.ran_again_after_2xx
                );
            }
        } else {
            without.insert(format!("{replica:?}"), report.ran_again_after_2xx);
        }
    }
}

/// A partition of one application process from Redis: nothing acknowledged is lost, and the
/// figures are printed. Run with `cargo test -p tower-idempotency --all-features --test
/// faults -- --ignored partition_storm_figures --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures, printed: run by hand"]
async fn partition_storm_figures() {
    if !crate::support::redis_server::available() {
        return;
    }
    let load = Load::figures();
    let report = partition_storm(load).await;
    assert_eq!(report.lost(), 0, "{report}");
    assert!(report.acknowledged >= load.keys / 3, "{report}");
}

/// How long claims take while completes wait for a replica that never acknowledges: `WAIT`
/// holds the store's one connection, so the claims written after it wait too. Printed. Run
/// with `cargo test -p tower-idempotency --all-features --test faults -- --ignored
/// wait_holds_claims_figures --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures, printed: run by hand"]
async fn wait_holds_claims_figures() {
    if !crate::support::redis_server::available() {
        return;
    }
    // No replica: every `WAIT 1` runs to its bound.
    let server = RedisServer::start();
    let store = RedisStore::builder("wait")
        .wait_for_replicas(1, Duration::from_millis(200))
        .connect(&server.url())
        .await
        .expect("connect");
    let engine = Engine::new(store);
    let fp = fingerprint("a");
    let response = Recorded::new(201, vec![], Some(Bytes::from_static(b"{}")));
    let claims = |engine: Engine<RedisStore>| async move {
        let mut took = Vec::new();
        for _ in 0..40 {
            let started = Instant::now();
            let Ok(Begin::Run(t)) = engine.begin(random_key(), fp).await else {
                panic!("a fresh key runs")
            };
            took.push(started.elapsed());
            engine.release(t).await.expect("release");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        took.sort();
        (
            took[took.len() / 2],
            took[took.len() * 9 / 10],
            took[took.len() - 1],
        )
    };
    let idle = claims(engine.clone()).await;
    // One complete after another, each waiting its `WAIT` out.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let completing = {
        let (engine, stop, response) = (engine.clone(), Arc::clone(&stop), response.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let Ok(Begin::Run(t)) = engine.begin(random_key(), fp).await else {
                    panic!("a fresh key runs")
                };
                let _ = engine.complete(t, &response).await;
                n += 1;
            }
            n
        })
    };
    let waiting = claims(engine.clone()).await;
    stop.store(true, Ordering::SeqCst);
    let completes = completing.await.unwrap();
    eprintln!(
        "claims (median, p90, max): idle {idle:.2?}; while completes wait 200 ms for a replica \
         {waiting:.2?} ({completes} completes)"
    );
}

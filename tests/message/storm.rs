//! Redelivery storm: 200 messages, each delivered 10 times, the deliveries spread at random
//! over two consumer processes (this test binary, started twice as a child) that share one
//! `redis-server` as their store. The test plays the broker: it writes deliveries to the
//! children's stdin, reads each outcome back, and redelivers what was not acknowledged.
//!
//! Every tenth message fails on its first attempt (before its side effect), so releases and
//! redeliveries are part of the storm. The side effect is an `INCR` in Redis, so the count is
//! shared by both processes: each message's must end at exactly 1.
//!
//! Size: `STORM_MESSAGES` (default 200) × `STORM_DELIVERIES` (default 10).
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

pub(crate) use crate::support::apps::env_or;
use crate::support::redis_server::{self, RedisServer};
use std::collections::{BTreeMap, VecDeque};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_idempotency::engine::Engine;
use tower_idempotency::message::{Envelope, Handled, MessageErrorKind, MessageIdempotencyLayer};
use tower_idempotency::store::redis::{RedisStore, redis};

/// Set in a child: the Redis URL; its presence makes the child test act.
const CHILD_REDIS: &str = "QUEUES_STORM_CHILD_REDIS";
const CHILD_TEST: &str = "storm::consumer_process";
/// Deliveries in flight per child at once.
const WINDOW: usize = 32;

/// A message by number: half keyed by an `Idempotency-Key`, half by the digest of the body;
/// every tenth is flaky (fails its first attempt).
fn message(n: usize) -> Envelope {
    let flaky = if n.is_multiple_of(10) { " flaky" } else { "" };
    let m = Envelope::new("orders.created", format!("order {n}{flaky}"));
    if n.is_multiple_of(2) {
        m.with_header("Idempotency-Key", format!("order-{n}"))
    } else {
        m
    }
}

/// The consumer process: reads `<delivery> <message>` lines, handles each (concurrently) through
/// the layer on the shared Redis, and prints `OUT <delivery> <outcome>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of redelivery_storm_over_two_consumer_processes"]
async fn consumer_process() {
    let Ok(url) = std::env::var(CHILD_REDIS) else {
        return;
    };
    let store = RedisStore::connect(&url, "storm").await.unwrap();
    let engine = Engine::new(store);
    let conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let handler = service_fn(move |m: Envelope| {
        let mut conn = conn.clone();
        async move {
            let body = String::from_utf8(m.body.to_vec()).unwrap();
            let attempt: u64 = redis::cmd("INCR")
                .arg(format!("attempts:{body}"))
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let pause = u64::from(rand_u32() % 5);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if body.ends_with("flaky") && attempt == 1 {
                return Err("flaky first attempt".to_owned());
            }
            redis::cmd("INCR")
                .arg(format!("effects:{body}"))
                .query_async::<u64>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    });
    let svc = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(engine, "storm-consumers"))
        .service(handler);

    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            out.write_all(line.as_bytes()).await.unwrap();
            out.flush().await.unwrap();
        }
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let (delivery, n) = line.split_once(' ').unwrap();
        let (delivery, n) = (delivery.to_owned(), n.parse::<usize>().unwrap());
        let (svc, tx) = (svc.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let outcome = match svc.oneshot(message(n)).await {
                Ok(Handled::Recorded(())) => "ran",
                Ok(Handled::Replayed(_)) => "repeat",
                Ok(Handled::Skipped) => "skipped",
                Ok(_) => "other",
                // The default: a repeat in flight waits a second, then is refused for a
                // later redelivery (never acknowledged while the first holds the key).
                Err(e) if e.kind() == MessageErrorKind::InFlight => "in_flight",
                Err(e) if e.is_retryable() => "nak",
                Err(_) => "term",
            };
            let _ = tx.send(format!("OUT {delivery} {outcome}\n"));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(tx);
    writer.await.unwrap();
}

/// A small xorshift, seeded from the clock: the spread of deliveries differs per run.
pub(crate) fn rand_u32() -> u32 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            u64::from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos())
                | 1,
        );
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 32) as u32
    })
}

pub(crate) fn shuffle<T>(v: &mut [T]) {
    for i in (1..v.len()).rev() {
        v.swap(i, rand_u32() as usize % (i + 1));
    }
}

struct Consumer {
    child: Child,
    stdin: Option<ChildStdin>,
    in_flight: usize,
}

fn spawn_consumer(
    url: &str,
    index: usize,
    outcomes: mpsc::UnboundedSender<(usize, String)>,
) -> Consumer {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            CHILD_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_REDIS, url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // libtest may print its own "test … " before the first line on the same line.
            if let Some(rest) = line.find("OUT ").map(|i| &line[i + 4..]) {
                let (delivery, outcome) = rest.split_once(' ').unwrap();
                let _ = outcomes.send((delivery.parse().unwrap(), format!("{index}:{outcome}")));
            }
        }
    });
    Consumer {
        stdin: child.stdin.take(),
        child,
        in_flight: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_storm_over_two_consumer_processes_runs_every_message_once() {
    if !redis_server::available() {
        return;
    }
    let messages = env_or("STORM_MESSAGES", 200);
    let deliveries = env_or("STORM_DELIVERIES", 10);
    let redis = RedisServer::start();
    let url = redis.url();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut consumers: Vec<Consumer> = (0..2)
        .map(|i| spawn_consumer(&url, i, tx.clone()))
        .collect();
    drop(tx);

    // The broker's queue: every message `deliveries` times, messages in random order, each
    // message's deliveries shuffled among its neighbours' so they are in flight together.
    let mut order: Vec<usize> = (0..messages).collect();
    shuffle(&mut order);
    let mut queue: Vec<usize> = order
        .into_iter()
        .flat_map(|n| std::iter::repeat_n(n, deliveries))
        .collect();
    for chunk in queue.chunks_mut(WINDOW * 2) {
        shuffle(chunk);
    }
    let mut queue: VecDeque<usize> = queue.into();
    let mut pending: BTreeMap<usize, usize> = BTreeMap::new(); // delivery id -> message
    let mut next_id = 0usize;
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_consumer_ran = [0usize; 2];
    let mut redelivered = 0usize;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);

    while !queue.is_empty() || !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the storm did not finish in 120 s"
        );
        // Hand out deliveries, each to a random consumer with room in its window.
        while let Some(&n) = queue.front() {
            let pick = rand_u32() as usize % 2;
            let c = [pick, 1 - pick]
                .into_iter()
                .find(|&c| consumers[c].in_flight < WINDOW);
            let Some(c) = c else { break };
            queue.pop_front();
            let id = next_id;
            next_id += 1;
            pending.insert(id, n);
            consumers[c].in_flight += 1;
            let stdin = consumers[c].stdin.as_mut().unwrap();
            stdin
                .write_all(format!("{id} {n}\n").as_bytes())
                .await
                .unwrap();
        }
        for c in &mut consumers {
            c.stdin.as_mut().unwrap().flush().await.unwrap();
        }
        let (id, outcome) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a consumer answered within 30 s")
            .expect("the consumers are running");
        let (c, what) = outcome.split_once(':').unwrap();
        let c: usize = c.parse().unwrap();
        consumers[c].in_flight -= 1;
        let n = pending.remove(&id).expect("a delivery answered once");
        *tally.entry(what.to_owned()).or_default() += 1;
        match what {
            "ran" => per_consumer_ran[c] += 1,
            "repeat" | "skipped" => {}
            // Not acknowledged: the broker redelivers it.
            "nak" | "in_flight" => {
                redelivered += 1;
                queue.push_back(n);
            }
            other => panic!("unexpected outcome {other} for message {n}"),
        }
    }
    let elapsed = started.elapsed();
    for mut c in consumers {
        drop(c.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(30), c.child.wait())
            .await
            .expect("the consumer exited")
            .unwrap();
        assert!(status.success(), "consumer process failed: {status}");
    }

    // The side effects, as both processes left them in Redis.
    let mut conn = redis.connection().await;
    let mut effects_per_message: BTreeMap<u64, usize> = BTreeMap::new();
    let mut attempts = 0u64;
    for n in 0..messages {
        let body = String::from_utf8(message(n).body.to_vec()).unwrap();
        let effects: Option<u64> = redis::cmd("GET")
            .arg(format!("effects:{body}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        *effects_per_message.entry(effects.unwrap_or(0)).or_default() += 1;
        let a: Option<u64> = redis::cmd("GET")
            .arg(format!("attempts:{body}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        attempts += a.unwrap_or(0);
    }
    let flaky = messages.div_ceil(10);
    println!(
        "message storm, 2 consumer processes, one Redis: {messages} messages x {deliveries} deliveries \
         = {} deliveries + {redelivered} redeliveries of naks; outcomes {tally:?}; handler runs {attempts} \
         ({} succeeded: {} + {} per process, {flaky} flaky first attempts failed); side effects per message \
         {effects_per_message:?}; {:.1} s",
        messages * deliveries,
        per_consumer_ran[0] + per_consumer_ran[1],
        per_consumer_ran[0],
        per_consumer_ran[1],
        elapsed.as_secs_f64(),
    );
    assert_eq!(
        effects_per_message,
        BTreeMap::from([(1, messages)]),
        "every message's side effect happened exactly once"
    );
    assert_eq!(
        per_consumer_ran[0] + per_consumer_ran[1],
        messages,
        "one successful run per message"
    );
    assert_eq!(
        attempts,
        (messages + flaky) as u64,
        "no run beyond the one retry of each flaky message"
    );
    assert_eq!(
        tally.get("nak").copied().unwrap_or(0),
        flaky,
        "each flaky message naked once"
    );
}

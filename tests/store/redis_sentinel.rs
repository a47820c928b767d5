//! `RedisStore` over Redis Sentinel on real servers: a primary, a replica and three
//! `redis-sentinel` processes on loopback. The store finds the primary through the sentinels,
//! and after the primary is killed (`kill -9`) and the replica promoted, it follows and
//! serves again; a record completed with `wait_for_replicas` before the kill survives it.
//! After a failover that leaves the old primary up and answering as a primary, the store
//! leaves it for the primary the sentinels name.
//!
//! Without `redis-sentinel` on `PATH` these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "redis-sentinel")]
#![allow(clippy::unwrap_used)]

use crate::support::redis_sentinel::{self, SERVICE, SentinelSet};
use crate::support::redis_server::{RedisServer, redis_key};
use bytes::Bytes;
use std::time::{Duration, Instant};
use tower_idempotency::conformance::{fingerprint, random_key};
use tower_idempotency::engine::{Begin, Engine, KeyState, Recorded};
use tower_idempotency::store::StoreErrorKind;
use tower_idempotency::store::redis::RedisStore;

fn response() -> Recorded {
    Recorded::new(201, vec![], Some(Bytes::from_static(b"{\"id\":1}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sentinel_store_follows_a_failover() {
    if !redis_sentinel::available() {
        return;
    }
    let mut set = SentinelSet::start();
    // The store's default operation timeout (1 s): a healthy step, and a `WAIT` of 400 ms,
    // end inside it on a loaded machine.
    let plain = RedisStore::builder("sentinel")
        .connect_sentinel(set.urls(), SERVICE, None)
        .await
        .expect("connect through the sentinels");
    let durable = RedisStore::builder("sentinel")
        .wait_for_replicas(1, Duration::from_millis(400))
        .connect_sentinel(set.urls(), SERVICE, None)
        .await
        .expect("connect through the sentinels");
    let (plain, durable) = (Engine::new(plain), Engine::new(durable));
    let fp = fingerprint("a");

    // Claim and complete through the primary the sentinels named.
    let key = random_key();
    let Begin::Run(t) = plain.begin(key, fp).await.unwrap() else {
        panic!("a fresh key runs")
    };
    assert!(plain.complete(t, &response()).await.unwrap());
    assert!(matches!(
        plain.begin(key, fp).await.unwrap(),
        Begin::Replayed(r) if r == response()
    ));
    assert!(matches!(
        plain.inspect(&key).await.unwrap(),
        KeyState::Done { status: 201, .. }
    ));
    // Completed with the replica's acknowledgement: it must outlive the primary.
    let kept = random_key();
    let Begin::Run(t) = durable.begin(kept, fp).await.unwrap() else {
        panic!("a fresh key runs")
    };
    assert!(durable.complete(t, &response()).await.unwrap());
    let prefix = plain.store().key_prefix().to_owned();
    assert_eq!(
        set.replica()
            .command(&["EXISTS", &redis_key(&prefix, &kept)]),
        "1"
    );

    set.primary().stop(); // SIGKILL: no shutdown, no save
    let killed = Instant::now();
    let (mut failures, deadline) = (0u32, killed + Duration::from_secs(30));
    loop {
        match plain.begin(random_key(), fp).await {
            Ok(Begin::Run(t)) => match plain.complete(t, &response()).await {
                Ok(done) => {
                    assert!(done);
                    break;
                }
                Err(e) => assert!(
                    matches!(
                        e.kind(),
                        StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                    ),
                    "{e:?}"
                ),
            },
            Ok(other) => panic!("a fresh key runs or fails, got {other:?}"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                ),
                "while the primary is gone a claim is Unavailable or Timeout: {e:?}"
            ),
        }
        failures += 1;
        assert!(
            Instant::now() < deadline,
            "the store did not serve again within 30 s of the kill ({failures} failures)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "sentinel failover: serving again {:?} after the kill, {failures} failed steps",
        killed.elapsed()
    );
    set.wait_for_promotion();

    // The acknowledged record survived; the new primary has no replica, so a durable
    // complete now fails with its own kind, and its claim still works.
    assert!(matches!(
        plain.begin(kept, fp).await.unwrap(),
        Begin::Replayed(r) if r == response()
    ));
    // Inspected through the primary the sentinels name now.
    assert!(matches!(
        plain.inspect(&kept).await.unwrap(),
        KeyState::Done { status: 201, .. }
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    let ticket = loop {
        match durable.begin(random_key(), fp).await {
            Ok(Begin::Run(t)) => break t,
            Ok(other) => panic!("a fresh key runs or fails, got {other:?}"),
            Err(e) => assert!(Instant::now() < deadline, "durable store: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let err = durable.complete(ticket, &response()).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::NotReplicated, "{err:?}");
}

/// A name no one can guess, for a command the old primary must not run.
fn hidden_name(command: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    format!("{command}-{:016x}", RandomState::new().hash_one(command))
}

/// `SENTINEL FAILOVER` with an old primary that cannot be demoted (its `REPLICAOF` and
/// `SLAVEOF` renamed, as a primary cut off from the sentinels, or not yet reconfigured, goes
/// on answering): it stays up and answers as a primary, and the store, with every default,
/// must still leave it for the primary the sentinels name, within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sentinel_store_leaves_an_old_primary_that_still_answers() {
    if !redis_sentinel::available() {
        return;
    }
    let (replicaof, slaveof) = (hidden_name("REPLICAOF"), hidden_name("SLAVEOF"));
    let primary = RedisServer::start_with(&[
        "--rename-command",
        "REPLICAOF",
        &replicaof,
        "--rename-command",
        "SLAVEOF",
        &slaveof,
    ]);
    let port = primary.port();
    let mut set = SentinelSet::start_with(primary, port, 2000);
    let store = RedisStore::connect_sentinel(set.urls(), SERVICE, "sentinel-follow")
        .await
        .expect("connect through the sentinels");
    let prefix = store.key_prefix().to_owned();
    let engine = Engine::new(store);
    let fp = fingerprint("a");
    let on = |server: &RedisServer, key| server.command(&["EXISTS", &redis_key(&prefix, &key)]);

    let before = random_key();
    let Begin::Run(t) = engine.begin(before, fp).await.unwrap() else {
        panic!("a fresh key runs")
    };
    assert!(engine.complete(t, &response()).await.unwrap());
    assert_eq!(on(set.primary(), before), "1", "the first primary has it");

    set.failover();
    set.wait_for_promotion();
    let promoted = Instant::now();
    assert!(
        set.primary()
            .command(&["INFO", "replication"])
            .contains("role:master"),
        "the old primary could not be demoted: it still answers as a primary"
    );

    // The store asks the sentinels every second; 15 s is for a loaded machine.
    let deadline = promoted + Duration::from_secs(15);
    let mut old = 0u32;
    loop {
        let key = random_key();
        match engine.begin(key, fp).await {
            Ok(Begin::Run(t)) => match engine.complete(t, &response()).await {
                Ok(done) => assert!(done),
                Err(e) => assert!(
                    matches!(
                        e.kind(),
                        StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                    ),
                    "{e:?}"
                ),
            },
            Ok(other) => panic!("a fresh key runs or fails, got {other:?}"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                ),
                "while the store changes primary a claim is Unavailable or Timeout: {e:?}"
            ),
        }
        if on(set.replica(), key) == "1" {
            break;
        }
        old += u32::from(on(set.primary(), key) == "1");
        assert!(
            Instant::now() < deadline,
            "15 s after the promotion the store still writes to the old primary ({old} keys)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "sentinel follow: on the new primary {:?} after the promotion, {old} keys written to the \
         old one meanwhile",
        promoted.elapsed()
    );

    // From then on, every step goes to the new primary: a claim is not answered by the old
    // one, and the record it completes is on the new one only.
    for _ in 0..3 {
        let key = random_key();
        let Begin::Run(t) = engine.begin(key, fp).await.unwrap() else {
            panic!("a fresh key runs")
        };
        assert_eq!(
            on(set.replica(), key),
            "1",
            "the claim is on the new primary"
        );
        assert_eq!(
            on(set.primary(), key),
            "0",
            "the old primary took the claim"
        );
        assert!(engine.complete(t, &response()).await.unwrap());
        assert!(matches!(
            engine.begin(key, fp).await.unwrap(),
            Begin::Replayed(r) if r == response()
        ));
        assert_eq!(
            on(set.primary(), key),
            "0",
            "the old primary has the record"
        );
    }
    // The record completed before the failover was replicated long before the promotion,
    // and is replayed from the new primary.
    assert!(matches!(
        engine.begin(before, fp).await.unwrap(),
        Begin::Replayed(r) if r == response()
    ));
}

#[tokio::test]
async fn no_sentinel_to_ask_is_unavailable() {
    if !redis_sentinel::available() {
        return;
    }
    let port = crate::support::ports::free_port(false);
    let err = RedisStore::connect_sentinel([format!("redis://127.0.0.1:{port}/")], SERVICE, "x")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err:?}");
    let err = RedisStore::connect_sentinel(Vec::<String>::new(), SERVICE, "x")
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        StoreErrorKind::Unavailable,
        "no sentinel at all: {err:?}"
    );
    let err = RedisStore::builder("")
        .connect_sentinel([format!("redis://127.0.0.1:{port}/")], SERVICE, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        StoreErrorKind::Unavailable,
        "an empty prefix: {err:?}"
    );
}

//! Security on a real `redis-server`: principal isolation, the optional-principal mode's shared
//! anonymous scope, nothing secret at rest, record authentication and keyed fingerprints.
//!
//! The same isolation on the memory store is covered in `tests/http/layer.rs`; a record planted
//! without the secret on the memory store in `tests/http/replay.rs`.
//!
//! Without `redis-server` on `PATH` these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does).
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{http as support_http, raw_http, redis_server};

use bytes::Bytes;
use raw_http::{BODY, Raw, keyed, post};
use redis_server::{RedisServer, available};
use support_http::{LAYER_NS, TestServer, Work, store_key, work_fingerprint};
use tower_idempotency::engine::Recorded;
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::store::redis::{RedisStore, redis};
use tower_idempotency::{IdempotencyLayer, Secret};

async fn store(server: &RedisServer, ns: &str) -> RedisStore {
    RedisStore::connect(&server.url(), ns).await.unwrap()
}

/// An app (auth → idempotency over `store` → handler) and its handler counters.
async fn app(layer: IdempotencyLayer<RedisStore>) -> (TestServer, Work) {
    let work = Work::plain();
    let server = TestServer::start(work.app(layer)).await;
    (server, work)
}

/// Every key in the server with its value and remaining time to live (ms).
async fn dump_all(server: &RedisServer) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    let mut conn = server.connection().await;
    let mut out = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        for k in keys {
            let v: Vec<u8> = redis::cmd("GET")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            let retention: i64 = redis::cmd("PTTL")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.push((k, v, retention));
        }
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

// ---------------------------------------------------------------------------------------------
// Principal isolation
// ---------------------------------------------------------------------------------------------

async fn send(
    server: &TestServer,
    principal: Option<&str>,
    tenant: Option<&str>,
    key: &str,
) -> Raw {
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("content-type", &b"application/json"[..]),
        ("idempotency-key", key.as_bytes()),
    ];
    if let Some(p) = principal {
        headers.push(("x-principal", p.as_bytes()));
    }
    if let Some(t) = tenant {
        headers.push(("x-tenant", t.as_bytes()));
    }
    server.one(&post("/work", &headers, BODY)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_or_tenant_under_the_same_key_runs_its_own_work_on_redis() {
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let (server, work) = app(IdempotencyLayer::new(store(redis, "iso").await)).await;
    let callers = [
        (Some("alice"), None),
        (Some("bob"), None),
        (Some("alice"), Some("acme")),
        (Some("alice"), Some("globex")),
    ];
    let mut firsts = Vec::new();
    for (p, t) in callers {
        let a = send(&server, p, t, "shared-key").await;
        assert_eq!(
            a.status,
            201,
            "{p:?}/{t:?} runs its own work: {}",
            a.describe()
        );
        assert!(!a.is_replay());
        firsts.push(a.execution());
    }
    assert_eq!(work.executions(), 4, "one run per caller");
    for ((p, t), first) in callers.into_iter().zip(firsts) {
        let again = send(&server, p, t, "shared-key").await;
        assert!(again.is_replay(), "{p:?}/{t:?}: {}", again.describe());
        assert_eq!(
            again.execution(),
            first,
            "{p:?}/{t:?} gets its own record back"
        );
    }
    assert_eq!(work.executions(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_principal_mode_shares_one_anonymous_scope_on_redis() {
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let layer =
        IdempotencyLayer::new(store(redis, "anon").await).principal(PrincipalMode::Optional);
    let (server, work) = app(layer).await;
    let first = send(&server, None, None, "anon-key").await;
    assert_eq!(first.status, 201, "{}", first.describe());
    // Another anonymous caller (nothing tells them apart) with the same key gets the first
    // caller's response: the documented risk of `PrincipalMode::Optional`.
    let stranger = send(&server, None, None, "anon-key").await;
    assert!(stranger.is_replay(), "{}", stranger.describe());
    assert_eq!(stranger.execution(), first.execution());
    // An authenticated principal is outside the anonymous scope.
    let alice = send(&server, Some("alice"), None, "anon-key").await;
    assert_eq!(alice.status, 201, "{}", alice.describe());
    assert!(!alice.is_replay());
    assert_eq!(work.executions(), 2);

    // The default (required) mode refuses the anonymous caller instead.
    let (strict, strict_work) = app(IdempotencyLayer::new(store(redis, "anon-strict").await)).await;
    send(&strict, None, None, "anon-key")
        .await
        .assert_problem(401, "idempotency.principal_missing");
    assert_eq!(strict_work.executions(), 0);
}

// ---------------------------------------------------------------------------------------------
// Nothing secret at rest
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_secret_rests_in_redis() {
    if !available() {
        return;
    }
    // A server of its own, so every key in it is this test's.
    let redis = RedisServer::start();
    let ns = "NAMESPACEMARKER-payments";
    let layer = IdempotencyLayer::new(store(&redis, ns).await).namespace("LAYERNSMARKER-refunds");
    let (server, work) = app(layer).await;
    let principals = ["PRINCIPALMARKER-alice", "PRINCIPALMARKER-bob"];
    let tenant = "TENANTMARKER-acme";
    let cookie = "COOKIEMARKER-s3cr3t";
    let body = br#"{"card":"BODYMARKER-4111"}"#;
    let mut requests = 0;
    for (i, p) in principals.iter().enumerate() {
        for tenant in [None, Some(tenant)] {
            for mode in [&b"plain"[..], b"cookies"] {
                let key = format!("IDEMKEYMARKER-{i}-{}-{}", tenant.is_some(), mode.len());
                let mut headers = keyed(p, key.as_bytes());
                headers.push(("x-mode", mode));
                headers.push(("x-marker", cookie.as_bytes()));
                if let Some(t) = tenant {
                    headers.push(("x-tenant", t.as_bytes()));
                }
                let a = server
                    .one(&post("/work?q=QUERYMARKER", &headers, body))
                    .await;
                assert_eq!(a.status, 201, "{}", a.describe());
                assert!(
                    a.header_all("set-cookie")
                        .iter()
                        .any(|c| contains(c, cookie.as_bytes())),
                    "the caller got the cookie"
                );
                requests += 1;
            }
        }
    }
    assert_eq!(work.executions(), requests);

    let all = dump_all(&redis).await;
    assert_eq!(all.len(), requests, "one Redis key per request");
    let markers: [&[u8]; 9] = [
        b"LAYERNSMARKER",
        b"IDEMKEYMARKER",
        b"PRINCIPALMARKER",
        b"TENANTMARKER",
        b"NAMESPACEMARKER",
        b"COOKIEMARKER",
        b"BODYMARKER",
        b"QUERYMARKER",
        b"set-cookie",
    ];
    let mut bytes_searched = 0;
    for (k, v, retention) in &all {
        for m in markers {
            let hex: Vec<u8> = m
                .iter()
                .flat_map(|b| format!("{b:02x}").into_bytes())
                .collect();
            assert!(
                !contains(k, m) && !contains(k, &hex),
                "{:?} in a key name",
                String::from_utf8_lossy(m)
            );
            assert!(
                !contains(v, m) && !contains(v, &hex),
                "{:?} in a value",
                String::from_utf8_lossy(m)
            );
        }
        assert!(*retention > 0, "every key expires (PTTL {retention})");
        bytes_searched += k.len() + v.len();
    }
    // Control: the scan does see what a record keeps (the allowed `Location` header).
    assert!(
        all.iter().all(|(_, v, _)| contains(v, b"/things/")),
        "every value holds its recorded response"
    );
    eprintln!(
        "scanned {} Redis keys ({bytes_searched} bytes of keys and values): no raw key, principal, \
         tenant, namespace, cookie, request body or query",
        all.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Record authentication and keyed fingerprints
// ---------------------------------------------------------------------------------------------

fn secret(tag: u8) -> Secret {
    Secret::new(vec![tag; 32]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_records_written_by_others_are_refused_and_own_records_replay() {
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let ns = "auth";
    let st = store(redis, ns).await;
    let engine_a = tower_idempotency::engine::Engine::builder(st.clone())
        .secret(secret(1))
        .build();
    let engine_b = tower_idempotency::engine::Engine::builder(st.clone())
        .secret(secret(2))
        .build();
    // Where each keeps a key: under its secret, apart from the plain derivation and each other.
    let at = |engine: &tower_idempotency::engine::Engine<_>, key: &str| {
        engine.store_key(
            LAYER_NS,
            &tower_idempotency::engine::Scope::principal("alice"),
            &tower_idempotency::IdempotencyKey::new(key).unwrap(),
        )
    };
    let plain = store_key(LAYER_NS, "alice", "k-b");
    assert_ne!(at(&engine_a, "k-b"), plain);
    assert_ne!(at(&engine_b, "k-b"), plain);
    assert_ne!(at(&engine_a, "k-b"), at(&engine_b, "k-b"));
    let ka = |key: &str| at(&engine_a, key);
    let (a, work_a) = app(IdempotencyLayer::new(engine_a.clone())).await;
    let (b, work_b) = app(IdempotencyLayer::new(engine_b.clone())).await;
    let req = |key: &str| post("/work", &keyed("alice", key.as_bytes()), BODY);

    // A's own record replays; its value tells us A's keyed fingerprint of this request.
    assert_eq!(a.one(&req("k-own")).await.status, 201);
    assert!(a.one(&req("k-own")).await.is_replay());
    let own = redis.get_value(&st, &ka("k-own")).await;
    let fp_a = &own[1..33];

    // A valid record that is not sealed, under the right key and fingerprint.
    let unsealed = Recorded::new(201, vec![], Some(Bytes::from_static(b"{}")))
        .encode()
        .unwrap();
    let value = [&b"D"[..], fp_a, unsealed.as_bytes()].concat();
    redis.set_value(&st, &ka("k-unsealed"), &value).await;
    a.one(&req("k-unsealed"))
        .await
        .assert_problem(503, "idempotency.record_invalid");

    // A's own sealed record copied under another key: the tag binds the key.
    redis.set_value(&st, &ka("k-moved"), &own).await;
    a.one(&req("k-moved"))
        .await
        .assert_problem(503, "idempotency.record_invalid");

    // B (another secret) records the same request; B replays it, A does not accept it.
    assert_eq!(b.one(&req("k-b")).await.status, 201);
    assert!(
        b.one(&req("k-b")).await.is_replay(),
        "B replays its own record"
    );
    let theirs = redis.get_value(&st, &at(&engine_b, "k-b")).await;
    assert_ne!(
        &theirs[1..33],
        fp_a,
        "each secret keys the fingerprint its own way"
    );
    // B's record planted where A keeps that key: another fingerprint, refused.
    redis.set_value(&st, &ka("k-b"), &theirs).await;
    let foreign = a.one(&req("k-b")).await;
    foreign.assert_problem(422, "idempotency.key_reused");
    // Even relabelled with A's fingerprint, B's seal does not verify under A's secret.
    let relabelled = [&b"D"[..], fp_a, &theirs[33..]].concat();
    redis.set_value(&st, &ka("k-b"), &relabelled).await;
    a.one(&req("k-b"))
        .await
        .assert_problem(503, "idempotency.record_invalid");

    assert_eq!(work_a.executions(), 1, "A ran only its own request");
    assert_eq!(work_b.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_fingerprint_keeps_a_low_entropy_body_from_being_confirmed() {
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let ns = "keyed-fp";
    let st = store(redis, ns).await;
    let pin_body = |pin: u32| format!(r#"{{"pin":"{pin:04}"}}"#).into_bytes();
    // The secret body: one of 10 000 PINs.
    let body = pin_body(4217);
    let req = |key: &str| post("/work", &keyed("alice", key.as_bytes()), &body);
    let (plain, _) = app(IdempotencyLayer::new(st.clone())).await;
    let keyed_engine = tower_idempotency::engine::Engine::builder(st.clone())
        .secret(secret(9))
        .build();
    let (keyed_app, _) = app(IdempotencyLayer::new(keyed_engine.clone())).await;
    assert_eq!(plain.one(&req("k-plain")).await.status, 201);
    assert_eq!(keyed_app.one(&req("k-keyed")).await.status, 201);

    let stored_plain = redis
        .get_value(&st, &store_key(LAYER_NS, "alice", "k-plain"))
        .await;
    let stored_keyed = redis
        .get_value(
            &st,
            &keyed_engine.store_key(
                LAYER_NS,
                &tower_idempotency::engine::Scope::principal("alice"),
                &tower_idempotency::IdempotencyKey::new("k-keyed").unwrap(),
            ),
        )
        .await;
    let plain_fp = work_fingerprint(&body);
    assert_eq!(
        &stored_plain[1..33],
        plain_fp.as_bytes(),
        "without a secret: the plain SHA-256"
    );
    assert_ne!(
        &stored_keyed[1..33],
        plain_fp.as_bytes(),
        "with a secret: keyed"
    );

    // Someone with a dump tries every PIN against the stored fingerprints.
    let guess = |stored: &[u8]| {
        (0..10_000).find(|pin| work_fingerprint(&pin_body(*pin)).as_bytes() == stored)
    };
    assert_eq!(
        guess(&stored_plain[1..33]),
        Some(4217),
        "the plain fingerprint gives the PIN away"
    );
    assert_eq!(guess(&stored_keyed[1..33]), None, "the keyed one does not");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_a_record_copied_under_another_key_replays() {
    // The default's limit, stated in RELIABILITY.md: records are not bound to their key.
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let st = store(redis, "copy").await;
    let (server, work) = app(IdempotencyLayer::new(st.clone())).await;
    let req = |key: &str| post("/work", &keyed("alice", key.as_bytes()), BODY);
    assert_eq!(server.one(&req("k-original")).await.status, 201);
    let original = redis
        .get_value(&st, &store_key(LAYER_NS, "alice", "k-original"))
        .await;
    redis
        .set_value(&st, &store_key(LAYER_NS, "alice", "k-copy"), &original)
        .await;
    let copy = server.one(&req("k-copy")).await;
    assert!(copy.is_replay(), "{}", copy.describe());
    assert_eq!(work.executions(), 1, "the copied record stood in for a run");
}

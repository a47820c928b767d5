//! `PostgresStore` on a real PostgreSQL server: the conformance suite, the table `migrate`
//! makes, the purge, hashes only at rest, timeouts, and the storage a record takes.
//!
//! Without PostgreSQL installed these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use crate::support::http::{TestServer, Work};
use crate::support::postgres_server::PostgresServer;
use crate::support::raw_http::{keyed, post};
use bytes::Bytes;
use std::future::Future;
use std::time::{Duration, Instant};
use tower_idempotency::ConfigErrorKind;
use tower_idempotency::conformance::{Harness, LONG, SHORT, fingerprint, random_key, record};
use tower_idempotency::engine::{Begin, Engine, Recorded};
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::store::postgres::sqlx::{self, PgPool, Row};
use tower_idempotency::store::{Claim, StepId, StepRecorded, StoreErrorKind};
use tower_idempotency::{IdempotencyLayer, Store};

/// A store on `table` (created when missing) of the shared server.
pub(crate) async fn store_on(server: &PostgresServer, table: &str, ns: &str) -> PostgresStore {
    let store = PostgresStore::builder(ns)
        .table(table)
        .connect(&server.url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// A fresh table name.
pub(crate) fn fresh_table(prefix: &str) -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).unwrap();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}_{hex}")
}

struct PostgresHarness {
    store: PostgresStore,
}

impl Harness for PostgresHarness {
    type S = PostgresStore;

    fn store(&self) -> &PostgresStore {
        &self.store
    }

    // Expiry is the database's (`statement_timestamp()`), on real time.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// A fresh harness on the shared server (the default table), or `None` (skip).
fn harness() -> Option<impl Future<Output = PostgresHarness>> {
    let server = PostgresServer::shared()?;
    Some(async move {
        PostgresHarness {
            store: store_on(server, "tower_idempotency", "conformance").await,
        }
    })
}

// `return` in the expression leaves the test early (the notice is already printed).
tower_idempotency::store_conformance!(match harness() {
    Some(make) => make,
    None => return,
});

// ---- the table ------------------------------------------------------------------------------

#[tokio::test]
async fn migrate_creates_the_documented_table_once_even_when_replicas_race() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("migrated");
    let store = PostgresStore::builder("m")
        .table(&table)
        .connect(&server.url())
        .await
        .unwrap();
    let runs: Vec<_> = (0..6)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().expect("a concurrent migrate succeeds");
    }
    store.migrate().await.expect("migrate on an existing table");

    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text, is_nullable::text \
         FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
    )
    .bind(&table)
    .fetch_all(store.pool())
    .await
    .unwrap();
    let expected = [
        ("expires_at", "timestamp with time zone", "NO"),
        ("key", "bytea", "NO"),
        ("state", "\"char\"", "NO"),
        ("fingerprint", "bytea", "NO"),
        ("token", "bytea", "YES"),
        ("record", "bytea", "YES"),
    ];
    let got: Vec<(&str, &str, &str)> = columns
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(got, expected, "the columns of the documented DDL");

    let (persistence, partitioned): (i8, bool) = sqlx::query_as(
        "SELECT relpersistence::\"char\", relkind = 'p' FROM pg_class WHERE oid = $1::regclass",
    )
    .bind(&table)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(persistence, b'p' as i8, "a logged (permanent) table");
    assert!(!partitioned, "not partitioned");
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE tablename = $1 ORDER BY 1")
            .bind(&table)
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(
        indexes.len(),
        2,
        "the primary key and the expiry index: {indexes:?}"
    );
    assert!(
        indexes.iter().any(|i| i.contains("(expires_at)")),
        "{indexes:?}"
    );
}

#[tokio::test]
async fn settings_that_would_break_the_sql_are_refused() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let pool = server.pool(1).await;
    assert_eq!(
        PostgresStore::new(pool.clone(), "").unwrap_err().kind(),
        ConfigErrorKind::InvalidName
    );
    for table in ["Orders", "t; DROP TABLE x", "a.b.c", "\"t\""] {
        assert_eq!(
            PostgresStore::builder("n")
                .table(table)
                .build(pool.clone())
                .unwrap_err()
                .kind(),
            ConfigErrorKind::InvalidName,
            "{table}"
        );
    }
    let e = PostgresStore::connect(&server.url(), "").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
}

#[tokio::test]
async fn a_table_named_by_sql_keywords_works_for_every_step() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let pool = server.pool(2).await;
    // A schema and a table that are both reserved words (the schema made fresh per run).
    sqlx::query("CREATE SCHEMA IF NOT EXISTS \"grant\"")
        .execute(&pool)
        .await
        .unwrap();
    let store = store_on(server, "grant.order", "keywords").await;
    assert_eq!(store.table(), "grant.order");
    store.migrate().await.unwrap();

    let (key, fp) = (random_key(), fingerprint("a"));
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    assert!(store.renew(&key, &token, LONG).await.unwrap());
    assert!(
        store
            .complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));
    let step = StepId::from_bytes([3; 32]);
    let value = Bytes::from_static(b"step");
    assert_eq!(
        store
            .record_step(&key, &step, value.clone(), LONG)
            .await
            .unwrap(),
        StepRecorded::Recorded
    );
    // The key is completed: its record answers every repeat, so the step is not kept.
    assert_eq!(store.steps(&key).await.unwrap(), vec![]);
    let pending = random_key();
    let Claim::Claimed(_) = store.claim(&pending, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    store
        .record_step(&pending, &step, value.clone(), LONG)
        .await
        .unwrap();
    assert_eq!(store.steps(&pending).await.unwrap(), vec![(step, value)]);
    let Claim::Claimed(other) = store.claim(&random_key(), &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    assert!(!store.release(&key, &other).await.unwrap());
    assert_eq!(
        store.forget(&key, false).await.unwrap(),
        tower_idempotency::store::Forgotten::Record
    );
    store.purge().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM \"grant\".\"order\"")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 2, "the other claim's row and the pending key's");
    let steps: i64 = sqlx::query_scalar("SELECT count(*) FROM \"grant\".\"order_steps\"")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(steps, 1, "only the pending key's step");
}

// ---- steps ----------------------------------------------------------------------------------

#[tokio::test]
async fn migrate_creates_the_steps_table_beside_an_existing_table() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("stepped");
    let steps = format!("{table}_steps");
    let store = store_on(server, &table, "stepped").await;
    let pool = store.pool();
    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text, is_nullable::text \
         FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
    )
    .bind(&steps)
    .fetch_all(pool)
    .await
    .unwrap();
    let got: Vec<(&str, &str, &str)> = columns
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("expires_at", "timestamp with time zone", "NO"),
            ("key", "bytea", "NO"),
            ("step", "bytea", "NO"),
            ("value", "bytea", "NO"),
            ("retention_ms", "bigint", "NO"),
        ],
        "the columns of the documented DDL"
    );
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE tablename = $1 ORDER BY 1")
            .bind(&steps)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(indexes.len(), 2, "{indexes:?}");
    assert!(
        indexes
            .iter()
            .any(|i| i.contains("UNIQUE") && i.contains("(key, step)")),
        "{indexes:?}"
    );
    assert!(
        indexes.iter().any(|i| i.contains("(expires_at)")),
        "{indexes:?}"
    );

    // A table made before steps: `migrate` adds the steps' table and leaves the records alone.
    let key = random_key();
    let fp = fingerprint("a");
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {steps}")))
        .execute(pool)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    assert!(
        store
            .complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap(),
        "the records were kept"
    );
    let step = StepId::from_bytes([4; 32]);
    assert_eq!(
        store
            .record_step(&key, &step, Bytes::from_static(b"v"), LONG)
            .await
            .unwrap(),
        StepRecorded::Recorded
    );
}

/// A steps' table of the previous layout, without `retention_ms`, gets the column from
/// `migrate`, its rows kept and still renewed with their claim. A table that has it is not
/// altered: `migrate` then waits for no transaction that reads it.
#[tokio::test]
async fn migrate_adds_the_steps_retention_to_a_steps_table_of_the_previous_layout() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("relayout");
    let steps = format!("{table}_steps");
    let store = store_on(server, &table, "relayout").await;
    let pool = store.pool();
    for ddl in [
        format!("DROP TABLE {steps}"),
        format!(
            "CREATE TABLE {steps} (expires_at timestamptz NOT NULL, key bytea NOT NULL, \
             step bytea NOT NULL, value bytea NOT NULL, PRIMARY KEY (key, step))"
        ),
        format!("CREATE INDEX ON {steps} (expires_at)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(ddl.as_str()))
            .execute(pool)
            .await
            .unwrap();
    }
    // A step an older version recorded, with a 300 ms retention, under a key a claim holds.
    let key = random_key();
    let fp = fingerprint("a");
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    let old = StepId::from_bytes([7; 32]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {steps} (expires_at, key, step, value) \
         VALUES (statement_timestamp() + interval '300 milliseconds', $1, $2, 'old')"
    )))
    .bind(&store.row_key(&key)[..])
    .bind(&old.as_bytes()[..])
    .execute(pool)
    .await
    .unwrap();

    store.migrate().await.unwrap();
    let column: (String, String, Option<String>) = sqlx::query_as(
        "SELECT data_type::text, is_nullable::text, column_default::text \
         FROM information_schema.columns WHERE table_name = $1 AND column_name = 'retention_ms'",
    )
    .bind(&steps)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        column,
        ("bigint".into(), "NO".into(), Some("0".into())),
        "the column of the documented DDL"
    );
    assert!(store.renew(&key, &token, LONG).await.unwrap());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        store.steps(&key).await.unwrap(),
        vec![(old, Bytes::from_static(b"old"))],
        "the older version's step is kept, and renewed with its claim past its own expiry"
    );
    let new = StepId::from_bytes([8; 32]);
    assert_eq!(
        store
            .record_step(&key, &new, Bytes::from_static(b"new"), SHORT)
            .await
            .unwrap(),
        StepRecorded::Recorded
    );
    assert_eq!(store.steps(&key).await.unwrap().len(), 2);
    assert!(
        store
            .complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
    assert!(store.steps(&key).await.unwrap().is_empty());

    // Up to date: a second `migrate` does not wait for a reader of the steps' table.
    let mut reader = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {steps}")))
        .execute(&mut *reader)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), store.migrate())
        .await
        .expect("migrate took a lock on an up-to-date steps' table")
        .unwrap();
    reader.rollback().await.unwrap();
}

#[tokio::test]
async fn a_recorded_step_moves_the_keys_live_steps_to_its_expiry_and_never_revives_expired_ones() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let store = store_on(server, "tower_idempotency", "step-expiry").await;
    let (a, b) = (StepId::from_bytes([5; 32]), StepId::from_bytes([6; 32]));
    let v = Bytes::from_static(b"v");

    // Seconds wide: the second step must be recorded while the first is live, on real time.
    let key = random_key();
    store
        .record_step(&key, &a, v.clone(), Duration::from_secs(2))
        .await
        .unwrap();
    store.record_step(&key, &b, v.clone(), LONG).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        store.steps(&key).await.unwrap().len(),
        2,
        "the first step was moved to the second's expiry"
    );

    let key = random_key();
    store.record_step(&key, &a, v.clone(), SHORT).await.unwrap();
    tokio::time::sleep(SHORT + Duration::from_millis(300)).await;
    store.record_step(&key, &b, v.clone(), LONG).await.unwrap();
    assert_eq!(
        store.steps(&key).await.unwrap(),
        vec![(b, v)],
        "an expired step stays expired"
    );
}

#[tokio::test]
async fn concurrent_records_of_one_step_keep_the_first() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let store = store_on(server, "tower_idempotency", "step-race").await;
    for _ in 0..5 {
        let key = random_key();
        let step = StepId::from_bytes([7; 32]);
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        let runs: Vec<_> = (0..8u8)
            .map(|i| {
                let (store, barrier) = (store.clone(), barrier.clone());
                tokio::spawn(async move {
                    let value = Bytes::from(vec![i]);
                    barrier.wait().await;
                    let got = store.record_step(&key, &step, value.clone(), LONG).await;
                    (value, got.unwrap())
                })
            })
            .collect();
        let mut recorded = Vec::new();
        let mut found = Vec::new();
        for run in runs {
            match run.await.unwrap() {
                (value, StepRecorded::Recorded) => recorded.push(value),
                (_, StepRecorded::Found(first)) => found.push(first),
                (_, other) => panic!("{other:?}"),
            }
        }
        assert_eq!(recorded.len(), 1, "one record wins");
        assert!(found.iter().all(|f| *f == recorded[0]), "the rest see it");
        assert_eq!(
            store.steps(&key).await.unwrap(),
            vec![(step, recorded[0].clone())]
        );
    }
}

#[tokio::test]
async fn forget_keeps_the_steps_of_a_pending_claim_it_keeps() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let store = store_on(server, "tower_idempotency", "step-forget").await;
    let key = random_key();
    let Claim::Claimed(_) = store.claim(&key, &fingerprint("a"), LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    let step = StepId::from_bytes([8; 32]);
    store
        .record_step(&key, &step, Bytes::from_static(b"v"), LONG)
        .await
        .unwrap();
    assert_eq!(
        store.forget(&key, false).await.unwrap(),
        tower_idempotency::store::Forgotten::KeptPending
    );
    assert_eq!(store.steps(&key).await.unwrap().len(), 1, "kept");
    assert_eq!(
        store.forget(&key, true).await.unwrap(),
        tower_idempotency::store::Forgotten::Pending
    );
    assert!(store.steps(&key).await.unwrap().is_empty(), "deleted");
}

#[tokio::test]
async fn purge_deletes_expired_steps_and_keeps_live_ones() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("purged_steps");
    let store = store_on(server, &table, "purge-steps").await;
    let v = Bytes::from_static(b"v");
    // More than one batch of expired steps, over many keys and a few steps each.
    for _ in 0..400 {
        let key = random_key();
        for i in 0..3u8 {
            store
                .record_step(&key, &StepId::from_bytes([i; 32]), v.clone(), SHORT)
                .await
                .unwrap();
        }
    }
    let live = random_key();
    let step = StepId::from_bytes([9; 32]);
    store
        .record_step(&live, &step, v.clone(), LONG)
        .await
        .unwrap();
    tokio::time::sleep(SHORT + Duration::from_millis(300)).await;
    assert_eq!(store.purge().await.unwrap(), 1200, "every expired step");
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table}_steps"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(left, 1, "the live step");
    assert_eq!(store.steps(&live).await.unwrap(), vec![(step, v)]);
}

#[tokio::test]
async fn prefixes_share_a_table_without_sharing_keys() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let a = store_on(server, "tower_idempotency", "app-a").await;
    let b = store_on(server, "tower_idempotency", "app-b").await;
    let key = random_key();
    let fp = fingerprint("a");
    let token = match a.claim(&key, &fp, LONG).await.unwrap() {
        Claim::Claimed(t) => t,
        other => panic!("{other:?}"),
    };
    assert!(
        a.complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
    assert!(
        matches!(b.claim(&key, &fp, LONG).await.unwrap(), Claim::Claimed(_)),
        "another prefix's store claims the same StoreKey afresh"
    );
    assert_ne!(a.row_key(&key), b.row_key(&key));
}

// ---- the purge ------------------------------------------------------------------------------

/// How many rows of `table` hold `keys`.
async fn rows_of(pool: &PgPool, table: &str, keys: &[[u8; 40]]) -> i64 {
    let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE key = ANY($1)"
    )))
    .bind(keys)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn purge_deletes_expired_rows_in_batches_and_keeps_live_ones() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("purged");
    let store = store_on(server, &table, "purge").await;
    let fp = fingerprint("a");
    // 1500 expired rows (more than one batch): lapsed leases and ended retentions.
    let mut expired = Vec::new();
    for i in 0..1500 {
        let key = random_key();
        let Claim::Claimed(token) = store.claim(&key, &fp, SHORT).await.unwrap() else {
            panic!("fresh key")
        };
        if i % 2 == 0 {
            store
                .complete(&key, &token, &fp, record("r"), SHORT)
                .await
                .unwrap();
        }
        expired.push(store.row_key(&key));
    }
    let live = random_key();
    let Claim::Claimed(token) = store.claim(&live, &fp, LONG).await.unwrap() else {
        panic!("fresh key")
    };
    store
        .complete(&live, &token, &fp, record("live"), LONG)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;

    assert_eq!(store.purge().await.unwrap(), 1500, "every expired row");
    assert_eq!(rows_of(store.pool(), &table, &expired).await, 0);
    assert_eq!(
        rows_of(store.pool(), &table, &[store.row_key(&live)]).await,
        1
    );
    assert_eq!(store.purge().await.unwrap(), 0, "nothing left to purge");
    assert!(
        matches!(
            store.claim(&live, &fp, LONG).await.unwrap(),
            Claim::Done { .. }
        ),
        "the live record still answers"
    );
}

#[tokio::test]
async fn purge_leaves_a_row_claimed_again_in_an_open_transaction_alone() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("reclaimed");
    let store = store_on(server, &table, "purge").await;
    let key = random_key();
    let row = store.row_key(&key);
    let fp = fingerprint("a");
    assert!(matches!(
        store.claim(&key, &fp, SHORT).await.unwrap(),
        Claim::Claimed(_)
    ));
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Another session takes the expired row over (as a claim does) and holds it uncommitted.
    let pool = server.pool(2).await;
    let mut tx = pool.begin().await.unwrap();
    let updated = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET expires_at = statement_timestamp() + interval '1 minute' \
         WHERE key = $1 AND expires_at <= statement_timestamp()"
    )))
    .bind(&row[..])
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(updated.rows_affected(), 1);

    let started = Instant::now();
    assert_eq!(store.purge().await.unwrap(), 0, "the held row is skipped");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "the purge does not wait for the holder"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        store.purge().await.unwrap(),
        0,
        "the re-claimed row is live"
    );
    assert_eq!(rows_of(store.pool(), &table, &[row]).await, 1);
}

// ---- failures -------------------------------------------------------------------------------

/// How many sessions wait for a lock in a statement on `table`, other than the caller's.
async fn waiting_on(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_claim_stuck_behind_a_lock_times_out_and_the_store_recovers() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    // Seconds: the claim reaches the lock, and is seen waiting there, well inside the server's
    // `statement_timeout` (four fifths of it) on a loaded machine.
    const TIMEOUT: Duration = Duration::from_secs(2);
    let table = fresh_table("stuck");
    store_on(server, &table, "stuck").await;
    let store = PostgresStore::builder("stuck")
        .table(&table)
        .timeout(TIMEOUT)
        .connect(&server.url())
        .await
        .unwrap();
    let key = random_key();
    let fp = fingerprint("a");
    // The store's connection is open before the clock starts: the stuck claim's statement
    // goes straight out.
    assert!(matches!(
        store.claim(&random_key(), &fp, LONG).await.unwrap(),
        Claim::Claimed(_)
    ));
    // A transaction inserts the key's row and holds it: a claim's insert must wait for it.
    let pool = server.pool(1).await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (expires_at, key, state, fingerprint, token) \
         VALUES (now() + interval '1 minute', $1, 'P', $2, $3)"
    )))
    .bind(&store.row_key(&key)[..])
    .bind(&fp.as_bytes()[..])
    .bind(&[7u8; 16][..])
    .execute(&mut *holder)
    .await
    .unwrap();

    let watcher = server.pool(1).await;
    let ((answer, took), seen) = tokio::join!(
        async {
            let started = Instant::now();
            let answer = store.claim(&key, &fp, LONG).await;
            (answer, started.elapsed())
        },
        async {
            let started = Instant::now();
            while started.elapsed() < TIMEOUT + Duration::from_secs(3) {
                if waiting_on(&watcher, &table).await > 0 {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    );
    assert!(seen, "the claim waited for the holder's lock");
    let e = answer.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e:?}");
    assert!(
        took < TIMEOUT + Duration::from_secs(3),
        "bounded by the timeout: {took:?}"
    );
    // The server's `statement_timeout` cancels the claim; were it still waiting, the rollback
    // below would let it insert a pending row that nobody holds. Wait for the server to say
    // so, not for a time.
    let started = Instant::now();
    while waiting_on(&watcher, &table).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server ended the timed-out claim's statement"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.rollback().await.unwrap();
    // The connection the timed-out claim used is usable again, and the key is free.
    let mut answers = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let answer = store.claim(&key, &fp, LONG).await;
        if let Ok(Claim::Claimed(_)) = answer {
            return;
        }
        answers.push(answer);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store must answer again once the holder is gone: {answers:#?}");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    if PostgresServer::shared().is_none() {
        return;
    }
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/x"), "n")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e:?}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "the sqlx error is kept"
    );
}

// ---- at rest --------------------------------------------------------------------------------

#[tokio::test]
async fn nothing_secret_rests_in_the_table() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("at_rest");
    let store = store_on(server, &table, "NAMESPACEMARKER-payments").await;
    let layer = IdempotencyLayer::new(store.clone()).namespace("LAYERNSMARKER-refunds");
    let work = Work::plain();
    let app = TestServer::start(work.app(layer)).await;
    let body = br#"{"card":"BODYMARKER-4111"}"#;
    for i in 0..4 {
        let key = format!("IDEMKEYMARKER-{i}");
        let headers = keyed("PRINCIPALMARKER-alice", key.as_bytes());
        let a = app.one(&post("/work?q=QUERYMARKER", &headers, body)).await;
        assert_eq!(a.status, 201, "{}", a.describe());
    }
    type Row = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT key, fingerprint, record FROM {table}"
    )))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 4, "one row per request");
    let markers: [&[u8]; 6] = [
        b"LAYERNSMARKER",
        b"IDEMKEYMARKER",
        b"PRINCIPALMARKER",
        b"NAMESPACEMARKER",
        b"BODYMARKER",
        b"QUERYMARKER",
    ];
    for (key, fp, rec) in &rows {
        assert_eq!((key.len(), fp.len()), (40, 32), "hashes of fixed size");
        let rec = rec.as_deref().expect("a done row holds its record");
        for m in markers {
            for bytes in [&key[..], &fp[..], rec] {
                assert!(
                    !contains(bytes, m),
                    "{:?} at rest",
                    String::from_utf8_lossy(m)
                );
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// ---- storage --------------------------------------------------------------------------------

/// Prints what a done record of a small JSON response costs in the table, indexes and TOAST
/// included (`pg_total_relation_size` after 5000 records, divided by 5000), and holds it
/// under a generous bound. The figure is quoted in BENCHMARKS.md.
#[tokio::test]
async fn storage_per_record() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    const N: usize = 5000;
    let table = fresh_table("storage");
    let store = store_on(server, &table, "storage").await;
    let engine = Engine::builder(store.clone()).retention(LONG).build();
    let response = Recorded::new(
        201,
        vec![(
            Bytes::from_static(b"content-type"),
            Bytes::from_static(b"application/json"),
        )],
        Some(Bytes::from_static(
            br#"{"id":"o-12345","items":3,"status":"created"}"#,
        )),
    );
    let record_len = response.encode().unwrap().len();
    for _ in 0..N {
        let Begin::Run(ticket) = engine.begin(random_key(), fingerprint("a")).await.unwrap() else {
            panic!("fresh key")
        };
        assert!(engine.complete(ticket, &response).await.unwrap());
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
        .execute(store.pool())
        .await
        .unwrap();
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT pg_total_relation_size('{table}'), pg_relation_size('{table}'), \
         pg_indexes_size('{table}'), (SELECT avg(pg_column_size(t.*))::float8 FROM {table} t)"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    let (total, heap, indexes, tuple): (i64, i64, i64, f64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let per = |b: i64| b as f64 / N as f64;
    eprintln!(
        "storage per done record ({record_len}-byte record, {N} records, after VACUUM): \
         {:.0} bytes in all (heap {:.0}, indexes {:.0}); average row {tuple:.0} bytes",
        per(total),
        per(heap),
        per(indexes),
    );
    assert!(
        per(total) < 600.0,
        "a small record takes {:.0} bytes",
        per(total)
    );
}

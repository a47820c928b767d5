//! `MySqlStore` on a real MariaDB server: the conformance suite, the tables `migrate` makes,
//! the purge beside a second purge, hashes only at rest, and one exchange per step.
//!
//! Without MariaDB installed these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "mysql")]
#![allow(clippy::unwrap_used)]

use crate::support::mariadb_server::MariaDbServer;
use std::future::Future;
use std::time::Duration;
use tower_idempotency::conformance::{Harness, LONG, SHORT, fingerprint, random_key, record};
use tower_idempotency::store::mysql::MySqlStore;
use tower_idempotency::store::mysql::sqlx::{self, MySqlPool};
use tower_idempotency::store::{Claim, StoreErrorKind};
use tower_idempotency::{ConfigErrorKind, Store};

/// A store on `table` (created when missing) of the shared server.
pub(crate) async fn store_on(server: &MariaDbServer, table: &str, ns: &str) -> MySqlStore {
    let store = MySqlStore::builder(ns)
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

struct MySqlHarness {
    store: MySqlStore,
}

impl Harness for MySqlHarness {
    type S = MySqlStore;

    fn store(&self) -> &MySqlStore {
        &self.store
    }

    // Expiry is the database's (`UTC_TIMESTAMP(6)`), on real time.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

fn harness() -> Option<impl Future<Output = MySqlHarness>> {
    let server = MariaDbServer::shared()?;
    Some(async move {
        MySqlHarness {
            store: store_on(server, "tower_idempotency", "conformance").await,
        }
    })
}

tower_idempotency::store_conformance!(match harness() {
    Some(make) => make,
    None => return,
});

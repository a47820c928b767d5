//! `RedisStore` on a real Redis Cluster of three primaries: the conformance suite with keys
//! spread over all slots, and the start-up check on every primary.
//!
//! Without `redis-server` on `PATH` these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "redis-cluster")]

// Only the helpers this suite uses, mounted where `store_conformance!` expects them.
mod support {
    #[path = "conformance.rs"]
    pub mod conformance;
    #[path = "redis_server.rs"]
    pub mod redis_server;
}

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use support::conformance::{Harness, fingerprint, random_key};
use support::redis_server::{self, RedisCluster, redis_key};
use tower_idempotency::store::redis::RedisStore;
use tower_idempotency::store::redis::redis::cluster_async::ClusterConnection;
use tower_idempotency::{Claim, Store};

/// One cluster for the whole suite (creating one takes seconds); the tests use random keys.
fn shared_cluster() -> Option<&'static RedisCluster> {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    redis_server::available().then(|| CLUSTER.get_or_init(RedisCluster::start))
}

async fn connect(cluster: &RedisCluster, namespace: &str) -> RedisStore<ClusterConnection> {
    RedisStore::connect_cluster(cluster.urls(), namespace)
        .await
        .expect("connect to the cluster")
}

struct ClusterHarness {
    store: RedisStore<ClusterConnection>,
}

impl Harness for ClusterHarness {
    type S = RedisStore<ClusterConnection>;

    fn store(&self) -> &Self::S {
        &self.store
    }

    // Expiry is the server's (`PX`), on real time.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// A fresh harness on the shared cluster, or `None` (skip) when no server can be run.
fn harness() -> Option<impl Future<Output = ClusterHarness>> {
    let cluster = shared_cluster()?;
    Some(async move {
        ClusterHarness {
            store: connect(cluster, "conformance").await,
        }
    })
}

// `return` in the expression leaves the test early (the notice is already printed).
store_conformance!(match harness() {
    Some(make) => make,
    None => return,
});

#[tokio::test]
async fn keys_spread_over_every_primary() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let store = connect(cluster, "spread").await;
    let keys: Vec<_> = (0..48).map(|_| random_key()).collect();
    for key in &keys {
        let claimed = store
            .claim(key, &fingerprint("a"), Duration::from_secs(60))
            .await;
        assert!(matches!(claimed, Ok(Claim::Claimed(_))), "{claimed:?}");
    }
    let mut slots = std::collections::BTreeSet::new();
    for key in keys.iter().take(8) {
        let slot = cluster.nodes()[0].command(&[
            "CLUSTER",
            "KEYSLOT",
            &redis_key(store.key_prefix(), key),
        ]);
        slots.insert(slot);
    }
    assert_eq!(
        slots.len(),
        8,
        "each key is its own slot (the hash tag is the key's id): {slots:?}"
    );
    for node in cluster.nodes() {
        let held: u64 = node
            .command(&["DBSIZE"])
            .parse()
            .expect("DBSIZE is a number");
        assert!(
            held > 0,
            "every primary holds some of 48 random keys (port {})",
            node.port()
        );
    }
}

#[tokio::test]
async fn verify_checks_every_primary() {
    let Some(cluster) = shared_cluster() else {
        return;
    };
    let store = connect(cluster, "verify").await;
    let report = store.verify().await.expect("verify");
    assert_eq!(report.servers, 3, "{report:?}");
    assert!(report.version >= (5, 0, 0));
    assert!(report.is_noeviction(), "{report:?}");
}

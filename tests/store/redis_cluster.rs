//! `RedisStore` on a real Redis Cluster of three primaries: the conformance suite with keys
//! spread over all slots, the start-up check on every primary, and the replacement of a
//! connection gone silent (each node behind a TCP proxy, `support/proxy.rs`).
//!
//! Without `redis-server` on `PATH` these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "redis-cluster")]

use crate::support;

// Only the helpers this suite uses, mounted where `store_conformance!` expects them.

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::proxy::Proxy;
use support::redis_server::{self, RedisCluster, redis_key};
use tower_idempotency::Store;
use tower_idempotency::conformance::{Harness, fingerprint, random_key};
use tower_idempotency::store::redis::RedisStore;
use tower_idempotency::store::redis::redis::cluster_async::ClusterConnection;
use tower_idempotency::store::{Claim, StoreErrorKind};

/// Timeouts in a row after which the store replaces its connection, as its docs say.
const RECONNECT_AFTER_TIMEOUTS: u32 = 2;

/// One cluster for the whole suite (creating one takes seconds); the tests use random keys.
fn shared_cluster() -> Option<&'static RedisCluster> {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    redis_server::available().then(|| CLUSTER.get_or_init(RedisCluster::start))
}

async fn connect(cluster: &RedisCluster, prefix: &str) -> RedisStore<ClusterConnection> {
    RedisStore::connect_cluster(cluster.urls(), prefix)
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
tower_idempotency::store_conformance!(match harness() {
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

/// A cluster of its own whose nodes announce a proxy in front of each as their address, so
/// every connection the cluster client makes goes through a proxy the test can freeze.
async fn cluster_behind_proxies() -> (RedisCluster, Vec<Proxy>) {
    let cluster = tokio::task::block_in_place(RedisCluster::start);
    let mut proxies = Vec::new();
    for node in cluster.nodes() {
        let proxy = Proxy::start(node.port()).await;
        let port = proxy.port().to_string();
        assert_eq!(
            node.command(&["CONFIG", "SET", "cluster-announce-port", &port]),
            "OK"
        );
        proxies.push(proxy);
    }
    // Every node learns the others' announced ports by gossip.
    let started = Instant::now();
    let announced = |nodes: String| {
        proxies
            .iter()
            .all(|p| nodes.contains(&format!("127.0.0.1:{}@", p.port())))
    };
    while !cluster
        .nodes()
        .iter()
        .all(|n| announced(n.command(&["CLUSTER", "NODES"])))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the nodes did not announce their proxies"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (cluster, proxies)
}

/// A cluster store whose connections go silent for good but stay open (half-open: no reset
/// arrives) replaces its connection after `RECONNECT_AFTER_TIMEOUTS` timeouts in a row, as a
/// standalone store does; the cluster client's own reconnection reacts to errors, never to
/// timeouts. Every answer until then is a timeout within the operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cluster_connection_is_replaced() {
    if !redis_server::available() {
        return;
    }
    let (_cluster, proxies) = cluster_behind_proxies().await;
    let timeout = Duration::from_millis(300);
    let store = RedisStore::builder("silent-cluster")
        .timeout(timeout)
        .connect_cluster(proxies.iter().map(Proxy::url))
        .await
        .expect("connect to the cluster through the proxies");
    for _ in 0..8 {
        let claimed = store
            .claim(&random_key(), &fingerprint("a"), Duration::from_secs(60))
            .await;
        assert!(matches!(claimed, Ok(Claim::Claimed(_))), "{claimed:?}");
    }
    let connections: usize = proxies.iter().map(Proxy::accepted).sum();

    for p in &proxies {
        p.freeze_existing();
    }
    let frozen = Instant::now();
    let mut timeouts = 0;
    loop {
        assert!(
            frozen.elapsed() < Duration::from_secs(5),
            "still failing 5 s after the connections went silent ({timeouts} timeouts)"
        );
        let started = Instant::now();
        let claimed = store
            .claim(&random_key(), &fingerprint("a"), Duration::from_secs(60))
            .await;
        let took = started.elapsed();
        assert!(
            took < timeout + Duration::from_millis(200),
            "a claim took {took:?}, over the operation timeout"
        );
        match claimed {
            Ok(Claim::Claimed(_)) => break,
            Err(e) if e.kind() == StoreErrorKind::Timeout => timeouts += 1,
            other => panic!("unexpected answer while the connections are silent: {other:?}"),
        }
    }
    let recovered = frozen.elapsed();
    assert!(
        timeouts >= RECONNECT_AFTER_TIMEOUTS,
        "the silent connections timed out before they were replaced ({timeouts})"
    );
    let opened = proxies.iter().map(Proxy::accepted).sum::<usize>() - connections;
    assert!(opened >= 1, "the store made new connections");
    println!(
        "silent cluster connections (timeout {timeout:?}): {timeouts} timeouts, then claims \
         worked again {} ms after the connections went silent; {opened} new connections",
        recovered.as_millis()
    );
}

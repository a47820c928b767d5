//! Exchanges per step of `MySqlStore`, counted on the wire: each exchange with MySQL begins
//! with a client packet of sequence number 0 (a command: a query, a prepared statement's
//! execution, a ping). A counting proxy between the store and the server reads the client's
//! packets and counts those. The count does not depend on timing: it is the protocol the store
//! speaks.
#![cfg(feature = "mysql")]
#![allow(clippy::unwrap_used)]

use super::mysql_store::fresh_table;
use crate::support::mariadb_server::MariaDbServer;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_idempotency::Store;
use tower_idempotency::conformance::{LONG, fingerprint, random_key, record};
use tower_idempotency::store::mysql::MySqlStore;
use tower_idempotency::store::{Claim, Inspected, StepId, StepRecorded};

/// A proxy to the server that counts the commands the client sends.
struct CountingProxy {
    port: u16,
    ready: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts packets of sequence number 0 in the client's stream. Without TLS or compression every
/// byte the client sends is a packet: a 3-byte little-endian length, a sequence number, the
/// payload. The handshake's reply is number 1: only commands are counted.
async fn count_commands(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    ready: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    // Bytes of the current packet still to skip, and a header split across reads.
    let (mut skip, mut header) = (0usize, Vec::with_capacity(4));
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut i = 0;
        while i < n {
            if skip > 0 {
                let take = skip.min(n - i);
                skip -= take;
                i += take;
                continue;
            }
            header.push(buf[i]);
            i += 1;
            if header.len() == 4 {
                if header[3] == 0 {
                    ready.fetch_add(1, Ordering::SeqCst);
                }
                skip = usize::from(header[0])
                    | usize::from(header[1]) << 8
                    | usize::from(header[2]) << 16;
                header.clear();
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

impl CountingProxy {
    async fn start(server: &MariaDbServer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = server.port();
        let ready = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (r, c) = (Arc::clone(&ready), Arc::clone(&connections));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                let (client_r, client_w) = client.into_split();
                let (up_r, up_w) = upstream.into_split();
                let (client_r, client_w) = (client_r, client_w);
                tokio::spawn(count_commands(client_r, up_w, Arc::clone(&r)));
                tokio::spawn(async move {
                    let mut up_r = up_r;
                    let mut client_w = client_w;
                    let _ = tokio::io::copy(&mut up_r, &mut client_w).await;
                    let _ = client_w.shutdown().await;
                });
            }
        });
        Self {
            port,
            ready,
            connections,
            task,
        }
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/app?ssl-mode=disabled", self.port)
    }

    /// The count, once no command has arrived for 30 ms (at most 2 s): work the pool does after
    /// a step returns, such as a check on release, is counted with the step.
    async fn settled(&self) -> u64 {
        let mut last = self.ready.load(Ordering::SeqCst);
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut still = true;
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = self.ready.load(Ordering::SeqCst);
                if now != last {
                    last = now;
                    still = false;
                    break;
                }
            }
            if still {
                return last;
            }
        }
        panic!("the proxy never went quiet")
    }
}

/// Runs `step` and returns the exchanges it took, those after it returned included.
async fn exchanges<T>(proxy: &CountingProxy, step: impl Future<Output = T>) -> (T, u64) {
    let before = proxy.settled().await;
    let out = step.await;
    (out, proxy.settled().await - before)
}

#[tokio::test]
async fn mysql_every_step_of_a_store_made_by_connect_is_one_exchange() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let proxy = CountingProxy::start(server).await;
    let table = fresh_table("exchanges");
    let store = MySqlStore::builder("exchanges")
        .table(&table)
        .connect(&proxy.url())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    // Once per connection, the prepared statements (release, steps) are prepared: one
    // exchange more, the first time.
    let warm = random_key();
    let Claim::Claimed(token) = store.claim(&warm, &fingerprint("a"), LONG).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    assert!(store.renew(&warm, &token, LONG).await.unwrap());
    assert!(store.release(&warm, &token).await.unwrap());
    let Claim::Claimed(token) = store.claim(&warm, &fingerprint("a"), LONG).await.unwrap() else {
        panic!("a released key is claimed")
    };
    let fp = fingerprint("a");
    assert!(
        store
            .complete(&warm, &token, &fp, record("r"), LONG)
            .await
            .unwrap()
    );
    let warm_step = StepId::from_bytes([1; 32]);
    store
        .record_step(&warm, &warm_step, Bytes::from_static(b"s"), LONG)
        .await
        .unwrap();
    store.steps(&warm).await.unwrap();
    store.inspect(&warm).await.unwrap();
    store.forget(&warm, false).await.unwrap();
    let connections = proxy.connections.load(Ordering::SeqCst);

    let key = random_key();
    let (claim, fresh) = exchanges(&proxy, store.claim(&key, &fingerprint("a"), LONG)).await;
    let Claim::Claimed(token) = claim.unwrap() else {
        panic!("a fresh key is claimed")
    };
    let (renewed, renew) = exchanges(&proxy, store.renew(&key, &token, LONG)).await;
    assert!(renewed.unwrap());
    let complete = store.complete(&key, &token, &fp, record("r"), LONG);
    let (done, complete) = exchanges(&proxy, complete).await;
    assert!(done.unwrap());
    let (found, replay) = exchanges(&proxy, store.claim(&key, &fingerprint("a"), LONG)).await;
    assert!(matches!(found.unwrap(), Claim::Done { .. }));
    let (read, inspect) = exchanges(&proxy, store.inspect(&key)).await;
    assert!(matches!(read.unwrap(), Inspected::Done { .. }));
    let (_, forget) = exchanges(&proxy, store.forget(&key, false)).await;
    let other = random_key();
    let Claim::Claimed(token) = store.claim(&other, &fingerprint("b"), LONG).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    let (released, release) = exchanges(&proxy, store.release(&other, &token)).await;
    assert!(released.unwrap());
    let (step, value) = (StepId::from_bytes([2; 32]), Bytes::from_static(b"charged"));
    let recording = store.record_step(&other, &step, value.clone(), LONG);
    let (recorded, record_step) = exchanges(&proxy, recording).await;
    assert_eq!(recorded.unwrap(), StepRecorded::Recorded);
    let again = store.record_step(&other, &step, Bytes::from_static(b"twice"), LONG);
    let (found, record_found) = exchanges(&proxy, again).await;
    assert_eq!(found.unwrap(), StepRecorded::Found(value.clone()));
    let (read, steps) = exchanges(&proxy, store.steps(&other)).await;
    assert_eq!(read.unwrap(), vec![(step, value)]);
    eprintln!(
        "exchanges per step: claim (fresh) {fresh}, renew {renew}, complete {complete}, \
         claim (replay) {replay}, inspect {inspect}, forget {forget}, release {release}, \
         record_step {record_step}, record_step (found) {record_found}, steps {steps}"
    );
    assert_eq!(
        (fresh, renew, complete, replay, inspect, forget, release),
        (1, 1, 1, 1, 1, 1, 1),
        "claim fresh, renew, complete, claim replay, inspect, forget, release"
    );
    assert_eq!(
        (record_step, record_found, steps),
        (1, 1, 1),
        "record_step, record_step found, steps"
    );
    // No step opened a connection: each took the one the warm-up left.
    assert_eq!(proxy.connections.load(Ordering::SeqCst), connections);
}

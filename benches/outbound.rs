//! The outbound door's cost: one send through `SendOnce` over a `MemoryStore` (a fresh key,
//! and a repeat answered from its receipt), next to the bare provider measured in the same run.
//! The provider does no I/O, so the ratios are the door's whole cost over the cheapest send.
//!
//! ```text
//! cargo bench --bench outbound
//! ```

#![allow(missing_docs)] // criterion's macros generate undocumented items

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::MemoryStore;
use tower_idempotency::engine::{Engine, KeyError};
use tower_idempotency::outbound::{Delivery, Identity, SendOnceLayer};

struct Email {
    key: String,
    to: &'static str,
    body: Bytes,
}

fn identify(m: &Email) -> Result<Option<Identity>, KeyError> {
    Identity::of(&m.key, [m.to.as_bytes(), &m.body[..]]).map(Some)
}

fn email(key: String, body: &Bytes) -> Email {
    Email {
        key,
        to: "ada@example.com",
        body: body.clone(),
    }
}

fn send_once(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let body = Bytes::from(vec![b'x'; 1024]);
    let receipt = Bytes::from_static(b"250 2.0.0 queued as 4F1C2A0B3D");
    let provider = service_fn(move |_: Email| {
        let r = receipt.clone();
        async move { Ok::<_, Infallible>(r) }
    });
    let door = || {
        SendOnceLayer::new(
            Engine::new(MemoryStore::new()),
            identify as fn(&Email) -> Result<Option<Identity>, KeyError>,
        )
        .layer(provider.clone())
    };
    // A store of its own for the repeats: the fresh keys of `first_send` fill the other one
    // until it drops its oldest receipts.
    let (door, repeats) = (door(), door());
    rt.block_on(async {
        let first = repeats
            .clone()
            .oneshot(email("repeat".into(), &body))
            .await
            .expect("warm");
        assert!(first.is_sent());
    });
    let n = Arc::new(AtomicU64::new(0));

    let mut g = c.benchmark_group("outbound_1KiB");
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| async {
            let r = provider
                .clone()
                .oneshot(email("bare".into(), &body))
                .await
                .expect("bare");
            assert_eq!(r.len(), 30);
        });
    });
    g.bench_function("first_send", |b| {
        b.to_async(&rt).iter(|| async {
            let k = n.fetch_add(1, Ordering::Relaxed);
            let d = door
                .clone()
                .oneshot(email(format!("k-{k}"), &body))
                .await
                .expect("first");
            assert!(matches!(d, Delivery::Recorded(_)));
        });
    });
    g.bench_function("repeat", |b| {
        b.to_async(&rt).iter(|| async {
            let d = repeats
                .clone()
                .oneshot(email("repeat".into(), &body))
                .await
                .expect("repeat");
            assert!(matches!(d, Delivery::Replayed(_)));
        });
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = send_once
}
criterion_main!(benches);

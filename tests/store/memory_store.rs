//! The store conformance suite over [`MemoryStore`], on a manual clock.

use std::future::Future;
use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency::conformance::Harness;
use tower_idempotency::store::clock::ManualClock;

/// A memory store whose time moves only when the suite says so.
struct MemoryHarness {
    store: MemoryStore,
    clock: ManualClock,
}

impl MemoryHarness {
    async fn new(shards: usize) -> Self {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .shards(shards)
            .clock(clock.clone())
            .build()
            .expect("valid bounds");
        Self { store, clock }
    }
}

impl Harness for MemoryHarness {
    type S = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.clock.advance(d);
        std::future::ready(())
    }
}

tower_idempotency::store_conformance!(MemoryHarness::new(16));

/// The same suite on a single shard (one lock for every scope).
mod one_shard {
    use super::MemoryHarness;

    tower_idempotency::store_conformance!(MemoryHarness::new(1));
}

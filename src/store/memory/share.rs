//! The memory store's gauges and counter. They are the store's own figures, so they live
//! here; the names are listed with every other metric on the crate page.

/// The memory stores' gauges and their early drops, summed over the process's stores. See
/// `MemoryStore::report_metrics`.
const MEMORY_ENTRIES: &str = "idempotency_memory_entries";
const MEMORY_PENDING: &str = "idempotency_memory_pending";
const MEMORY_BYTES: &str = "idempotency_memory_bytes";
const MEMORY_EARLY_DROPS: &str = "idempotency_memory_early_drops_total";

/// What one memory store last added to the process's gauges and counter. Each store moves
/// them by its own change. So two stores add up rather than overwrite each other, and the
/// counter never goes back.
#[derive(Debug, Default)]
pub(crate) struct MemoryShare(std::sync::Mutex<[u64; 4]>);

impl MemoryShare {
    /// Moves the gauges and the counter from this store's last report to these figures.
    pub(crate) fn report(&self, entries: usize, pending: usize, bytes: usize, early_drops: u64) {
        let now = [entries, pending, bytes].map(|n| u64::try_from(n).unwrap_or(u64::MAX));
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (i, name) in [MEMORY_ENTRIES, MEMORY_PENDING, MEMORY_BYTES]
            .into_iter()
            .enumerate()
        {
            let gauge = metrics::gauge!(name);
            // Gauges are f64; a count above 2^53 is not a concern for a store in one
            // process.
            #[allow(clippy::cast_precision_loss)]
            if now[i] >= last[i] {
                gauge.increment((now[i] - last[i]) as f64);
            } else {
                gauge.decrement((last[i] - now[i]) as f64);
            }
            last[i] = now[i];
        }
        // A store's own count never falls.
        let drops = early_drops.max(last[3]);
        metrics::counter!(MEMORY_EARLY_DROPS).increment(drops - last[3]);
        last[3] = drops;
    }

    /// Takes this store's figures out of the gauges, as the store is gone. Its drops stay
    /// counted.
    pub(crate) fn withdraw(&self) {
        let drops = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[3];
        self.report(0, 0, 0, drops);
    }
}

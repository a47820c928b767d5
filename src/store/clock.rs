//! Time for stores that keep their own expiry, injectable for tests.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::store::MemoryStore;
//! use tower_idempotency::store::clock::ManualClock;
//!
//! let clock = ManualClock::new();
//! let store = MemoryStore::builder().clock(clock.clone()).build()?;
//! clock.advance(Duration::from_secs(60)); // the store's leases and records age a minute
//! # let _ = store;
//! # Ok::<(), tower_idempotency::ConfigError>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A monotonic clock: time since an arbitrary, fixed start.
pub trait Clock: Send + Sync + 'static {
    /// The time elapsed since the clock's start.
    fn now(&self) -> Duration;
}

/// The default clock: tokio's monotonic time, so `tokio::time::pause` and `advance` move it in
/// tests too.
#[derive(Clone, Copy)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock starting now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TokioClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokioClock").finish_non_exhaustive()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that moves only when told to, for tests.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now(), Duration::from_secs(5));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at zero.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

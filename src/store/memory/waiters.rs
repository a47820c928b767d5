//! Requests waiting for a pending key to settle (a repeat that waits instead of getting
//! 409): woken in process by the operation that completes or releases the key, so the memory store
//! never needs polling.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::Notify;

/// The waiters of every key, by key id. Empty (one atomic load per completion) unless a
/// repeat waits.
#[derive(Default)]
pub(super) struct Waiters {
    count: AtomicUsize,
    by_key: Mutex<HashMap<[u8; 32], Arc<Notify>>>,
}

impl Waiters {
    /// Registers interest in `id`. Register *before* looking at the key: a completion after
    /// the look then finds the registration (the shard's lock orders the two).
    pub(super) fn subscribe(&self, id: &[u8; 32]) -> Subscription<'_> {
        self.count.fetch_add(1, Ordering::SeqCst);
        let notify = Arc::clone(
            self.lock()
                .entry(*id)
                .or_insert_with(|| Arc::new(Notify::new())),
        );
        Subscription {
            waiters: self,
            id: *id,
            notify,
        }
    }

    /// Wakes every waiter of `id` (called after the key was completed or released).
    pub(super) fn wake(&self, id: &[u8; 32]) {
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(n) = self.lock().get(id) {
            n.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Arc<Notify>>> {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One waiter's interest in one key; unregisters on drop.
pub(super) struct Subscription<'a> {
    waiters: &'a Waiters,
    id: [u8; 32],
    pub(super) notify: Arc<Notify>,
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.lock();
        // Clones are made under this lock: two references (the map's and ours) mean no other
        // waiter is left.
        if Arc::strong_count(&self.notify) == 2 {
            map.remove(&self.id);
        }
        drop(map);
        self.waiters.count.fetch_sub(1, Ordering::SeqCst);
    }
}

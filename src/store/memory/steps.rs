//! The memory store's recorded steps: a table of its own, bounded like the records.

use crate::engine::scope::StoreKey;
use crate::store::{StepId, StepRecorded, StoreError, StoreErrorKind};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The bytes each step is counted for on top of its value, as a record's overhead.
const STEP_OVERHEAD: usize = 96;

/// One key's steps and when they expire, in the store clock's nanoseconds.
struct KeySteps {
    until: u64,
    steps: Vec<(StepId, Bytes)>,
}

struct Table {
    keys: HashMap<StoreKey, KeySteps>,
    /// Steps held, over every key.
    count: usize,
    bytes: usize,
    /// No key expires before this: a sweep before then finds nothing.
    earliest: u64,
}

/// Steps are few beside records, and a step's record is never dropped while it is kept: a
/// dropped step would run its side effect again. So a full table refuses a new step with
/// `StoreFull` rather than dropping a live one. Expired keys go first.
pub(super) struct StepTable {
    table: Mutex<Table>,
    max_steps: usize,
    max_bytes: usize,
}

impl StepTable {
    pub(super) fn new(max_steps: usize, max_bytes: usize) -> Self {
        Self {
            table: Mutex::new(Table {
                keys: HashMap::new(),
                count: 0,
                bytes: 0,
                earliest: u64::MAX,
            }),
            max_steps,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn record(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        until: u64,
        now: u64,
    ) -> Result<StepRecorded, StoreError> {
        let mut t = self.lock();
        if let Some(entry) = t.keys.get_mut(key).filter(|e| e.until > now)
            && let Some((_, first)) = entry.steps.iter().find(|(id, _)| id == step)
        {
            return Ok(StepRecorded::Found(first.clone()));
        }
        let cost = value.len() + STEP_OVERHEAD;
        if t.count + 1 > self.max_steps || t.bytes + cost > self.max_bytes {
            t.sweep(now);
        }
        if t.count + 1 > self.max_steps || t.bytes + cost > self.max_bytes {
            return Err(StoreError::new(
                StoreErrorKind::StoreFull,
                "the memory store's steps are at their bound; none has expired",
            ));
        }
        t.count += 1;
        t.bytes += cost;
        t.earliest = t.earliest.min(until);
        let mut gone = (0, 0);
        let entry = t.keys.entry(*key).or_insert_with(|| KeySteps {
            until,
            steps: Vec::new(),
        });
        if entry.until <= now {
            // Expired steps under the key are gone; the new one starts afresh.
            gone = drained(&mut entry.steps);
        }
        entry.until = until;
        entry.steps.push((*step, value));
        t.count -= gone.0;
        t.bytes -= gone.1;
        Ok(StepRecorded::Recorded)
    }

    pub(super) fn read(&self, key: &StoreKey, now: u64) -> Vec<(StepId, Bytes)> {
        self.lock()
            .keys
            .get(key)
            .filter(|e| e.until > now)
            .map(|e| e.steps.clone())
            .unwrap_or_default()
    }

    pub(super) fn forget(&self, key: &StoreKey) {
        let mut t = self.lock();
        if let Some(mut entry) = t.keys.remove(key) {
            let (count, bytes) = drained(&mut entry.steps);
            t.count -= count;
            t.bytes -= bytes;
        }
    }

    /// Steps held and their counted bytes.
    pub(super) fn usage(&self) -> (usize, usize) {
        let t = self.lock();
        (t.count, t.bytes)
    }
}

impl Table {
    fn sweep(&mut self, now: u64) {
        if self.earliest > now {
            return;
        }
        let mut earliest = u64::MAX;
        let (mut count, mut bytes) = (0, 0);
        self.keys.retain(|_, e| {
            if e.until > now {
                earliest = earliest.min(e.until);
                true
            } else {
                let (c, b) = drained(&mut e.steps);
                count += c;
                bytes += b;
                false
            }
        });
        self.count -= count;
        self.bytes -= bytes;
        self.earliest = earliest;
    }
}

/// Empties `steps`, returning how many there were and their counted bytes.
fn drained(steps: &mut Vec<(StepId, Bytes)>) -> (usize, usize) {
    let bytes = steps.iter().map(|(_, v)| v.len() + STEP_OVERHEAD).sum();
    let count = steps.len();
    steps.clear();
    (count, bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_parts([n; 32], [n; 32])
    }

    fn id(n: u8) -> StepId {
        StepId::from_bytes([n; 32])
    }

    #[test]
    fn a_full_table_refuses_rather_than_drops_and_takes_again_once_steps_expire() {
        let t = StepTable::new(2, 1 << 20);
        let v = Bytes::from_static(b"v");
        assert_eq!(
            t.record(&key(1), &id(1), v.clone(), 100, 0).unwrap(),
            StepRecorded::Recorded
        );
        assert_eq!(
            t.record(&key(2), &id(1), v.clone(), 200, 0).unwrap(),
            StepRecorded::Recorded
        );
        let full = t.record(&key(3), &id(1), v.clone(), 300, 50).unwrap_err();
        assert_eq!(full.kind(), StoreErrorKind::StoreFull);
        assert_eq!(t.read(&key(1), 50).len(), 1, "no live step was dropped");
        // Past key 1's expiry its room is taken back.
        assert_eq!(
            t.record(&key(3), &id(1), v, 300, 150).unwrap(),
            StepRecorded::Recorded
        );
        assert!(t.read(&key(1), 150).is_empty());
        assert_eq!(t.usage(), (2, 2 * (1 + STEP_OVERHEAD)));
    }

    #[test]
    fn the_byte_bound_holds_and_forget_gives_the_room_back() {
        let t = StepTable::new(100, 2 * (10 + STEP_OVERHEAD));
        let v = Bytes::from(vec![0u8; 10]);
        t.record(&key(1), &id(1), v.clone(), 100, 0).unwrap();
        t.record(&key(1), &id(2), v.clone(), 100, 0).unwrap();
        assert!(t.record(&key(2), &id(1), v.clone(), 100, 0).is_err());
        t.forget(&key(1));
        assert_eq!(t.usage(), (0, 0));
        t.record(&key(2), &id(1), v, 100, 0).unwrap();
    }

    #[test]
    fn an_expired_keys_steps_start_afresh() {
        let t = StepTable::new(10, 1 << 20);
        t.record(&key(1), &id(1), Bytes::from_static(b"old"), 100, 0)
            .unwrap();
        assert_eq!(
            t.record(&key(1), &id(1), Bytes::from_static(b"new"), 300, 200)
                .unwrap(),
            StepRecorded::Recorded
        );
        assert_eq!(
            t.read(&key(1), 200),
            vec![(id(1), Bytes::from_static(b"new"))]
        );
        assert_eq!(t.usage().0, 1, "the expired step is no longer counted");
    }
}

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

//! The scopes of a shard that have a completed record, heaviest first. They form an indexed
//! binary max-heap of `(weight, slot)`. Each scope slot knows its place in the heap. So a
//! change of weight moves it in `O(log n)` without allocating. The heaviest scope is at the
//! root.

use super::slab::{NIL, ScopeSlot, at};

#[derive(Debug, Default)]
pub(super) struct ByWeight {
    heap: Vec<(u64, u32)>,
}

impl ByWeight {
    /// The heaviest scope and its weight. On a tie, the higher slot wins.
    pub(super) fn top(&self) -> Option<(u64, u32)> {
        self.heap.first().copied()
    }

    /// The weight the scope is ranked at, if it is ranked.
    pub(super) fn weight_of(&self, scopes: &[ScopeSlot], s: u32) -> Option<u64> {
        match scopes[at(s)].rank {
            NIL => None,
            i => Some(self.heap[at(i)].0),
        }
    }

    /// Ranks the scope at `weight`, or takes it out with `None`.
    pub(super) fn set(&mut self, scopes: &mut [ScopeSlot], s: u32, weight: Option<u64>) {
        match (scopes[at(s)].rank, weight) {
            (NIL, None) => {}
            (NIL, Some(w)) => {
                let i = self.heap.len();
                self.heap.push((w, s));
                scopes[at(s)].rank = place(i);
                self.up(scopes, i);
            }
            (i, None) => {
                let i = at(i);
                let last = self.heap.len() - 1;
                self.swap(scopes, i, last);
                self.heap.pop();
                scopes[at(s)].rank = NIL;
                if i < last {
                    self.up(scopes, i);
                    self.down(scopes, i);
                }
            }
            (i, Some(w)) => {
                let i = at(i);
                let old = self.heap[i];
                self.heap[i] = (w, s);
                if (w, s) > old {
                    self.up(scopes, i);
                } else {
                    self.down(scopes, i);
                }
            }
        }
    }

    /// Calls `found` on the scopes of weight `min` or more until it returns `true`. Each is
    /// called once, parents before children. Returns whether `found` did. Those scopes are
    /// the top of the heap, so the walk visits no other.
    pub(super) fn any_at_least(&self, min: u64, found: &mut impl FnMut(u64, u32) -> bool) -> bool {
        self.visit(0, min, found)
    }

    fn visit(&self, i: usize, min: u64, found: &mut impl FnMut(u64, u32) -> bool) -> bool {
        match self.heap.get(i) {
            Some(&(w, s)) if w >= min => {
                found(w, s)
                    || self.visit(2 * i + 1, min, found)
                    || self.visit(2 * i + 2, min, found)
            }
            _ => false,
        }
    }

    fn up(&mut self, scopes: &mut [ScopeSlot], mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[i] <= self.heap[parent] {
                break;
            }
            self.swap(scopes, i, parent);
            i = parent;
        }
    }

    fn down(&mut self, scopes: &mut [ScopeSlot], mut i: usize) {
        loop {
            let left = 2 * i + 1;
            if left >= self.heap.len() {
                break;
            }
            let right = left + 1;
            let child = if right < self.heap.len() && self.heap[right] > self.heap[left] {
                right
            } else {
                left
            };
            if self.heap[child] <= self.heap[i] {
                break;
            }
            self.swap(scopes, i, child);
            i = child;
        }
    }

    fn swap(&mut self, scopes: &mut [ScopeSlot], i: usize, j: usize) {
        self.heap.swap(i, j);
        scopes[at(self.heap[i].1)].rank = place(i);
        scopes[at(self.heap[j].1)].rank = place(j);
    }

    /// Every ranked scope, for the tests' invariant checks.
    #[cfg(test)]
    pub(super) fn check(&self, scopes: &[ScopeSlot]) -> std::collections::BTreeSet<(u64, u32)> {
        for (i, &(w, s)) in self.heap.iter().enumerate() {
            assert_eq!(at(scopes[at(s)].rank), i, "the scope knows its place");
            if i > 0 {
                assert!(self.heap[(i - 1) / 2] >= (w, s), "heap order");
            }
        }
        self.heap.iter().copied().collect()
    }
}

/// A heap position as stored in a scope slot. Scope slots are `u32`-indexed. The heap has one
/// place per slot, so it never outgrows `u32` either.
fn place(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NIL)
}

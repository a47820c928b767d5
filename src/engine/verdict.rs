//! What becomes of a key once its work has run: recorded, released or held.

/// What becomes of a key once its work has run. Every door asks the same question of a result,
/// and answers with one of these.
///
/// | verdict | the key | a repeat under it |
/// | --- | --- | --- |
/// | `Record` | completed: the result is recorded | is answered from the record |
/// | `Release` | freed | runs the work again |
/// | `Fail` | freed; the door reports a permanent failure | runs the work again, and fails the same way |
/// | `Hold` | kept pending until its lease (or the door's hold time) ends | waits, then runs |
///
/// `Record` is for work that is done, whatever its answer. `Release` is for work that did
/// nothing and may succeed later. `Fail` is for work that did nothing and will fail the same
/// way every time. A JetStream message is terminated, an apalis task aborted, and an outbound
/// send refused as not retryable. The HTTP layer treats it as `Release`. `Hold` is for work
/// that may or may not have happened: neither replaying nor running again is safe yet.
///
/// ```
/// use tower_idempotency::engine::{Classify, Verdict};
///
/// // Record what succeeded, release what failed.
/// let by_result = |r: &Result<u32, String>| match r {
///     Ok(_) => Verdict::Record,
///     Err(_) => Verdict::Release,
/// };
/// assert_eq!(by_result.classify(&Ok(1)), Verdict::Record);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// The work is done: its result is recorded and a repeat is answered from it.
    Record,
    /// Nothing was done, and it may succeed later: the key is freed for a retry.
    Release,
    /// Nothing was done, and it fails the same way every time: the key is freed and the door
    /// reports a permanent failure.
    Fail,
    /// The work may or may not have happened. The key stays pending. So a repeat neither
    /// replays nor runs until the lease or hold time ends.
    Hold,
}

impl Verdict {
    /// Whether the key is freed: `Release` or `Fail`.
    #[must_use]
    pub fn releases(self) -> bool {
        matches!(self, Self::Release | Self::Fail)
    }
}

/// Gives the [`Verdict`] on a result: the one hook of every door.
///
/// Any `Fn(&T) -> Verdict` is one. Each door says what `T` is: the HTTP layer's response
/// parts, a message handler's `Result`, an outbound send's `Result`.
pub trait Classify<T: ?Sized>: Send + Sync + 'static {
    /// The verdict on `outcome`.
    fn classify(&self, outcome: &T) -> Verdict;
}

impl<T: ?Sized, F> Classify<T> for F
where
    F: Fn(&T) -> Verdict + Send + Sync + 'static,
{
    fn classify(&self, outcome: &T) -> Verdict {
        self(outcome)
    }
}

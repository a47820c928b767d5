//! Batches: claim every key, send only the fresh requests, answer the repeats in place.

use super::classify::Classify;
use super::delivery::{Delivery, OutboundError, Unknown};
use super::identify::Identify;
use super::receipt::Receipt;
use super::service::{Door, HoldOnDrop, SendOnce, Start, Step};
use crate::engine::{Engine, Fingerprint, Ticket};
use crate::store::Store;
use std::collections::HashMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use tower_service::Service;

/// A service with a path that sends many requests in one exchange (a provider's batch
/// endpoint). [`SendOnce::send_batch`] sends a batch's fresh requests through it.
pub trait SendBatch<Req>: Service<Req> {
    /// Sends `reqs` together: one result per request, in order.
    fn send_batch(
        &mut self,
        reqs: Vec<Req>,
    ) -> impl Future<Output = Vec<Result<Self::Response, Self::Error>>> + Send;
}

/// The answer to each request of a batch, in order.
pub type BatchResults<R, E> = Vec<Result<Delivery<R, E>, OutboundError<E>>>;

/// One request's answer.
type Answer<R, E> = Result<Delivery<R, E>, OutboundError<E>>;
/// One round of renewals of a batch's claims: the claims still held after it.
type Renewing<'a> = Pin<Box<dyn Future<Output = Vec<usize>> + Send + 'a>>;

/// Where a request's answer comes from.
enum Slot<R, E> {
    /// Answered without sending (a replay, in flight, an error).
    Done(Answer<R, E>),
    /// Sent, as the `n`th fresh request.
    Fresh(usize),
    /// A repeat, in this batch, of the `n`th fresh request (same key and fingerprint).
    Repeat(usize),
}

impl<S, St, I, C> SendOnce<S, St, I, C> {
    /// Sends a batch through the inner service's batch path ([`SendBatch`]): every key is
    /// claimed first, only the requests whose key was free are sent (in one call), and the
    /// others are answered in place: a completed key with its receipt, a held key
    /// [`Delivery::InFlight`], another request under a used key
    /// [`OutboundError::KeyReused`].
    ///
    /// A key repeated inside the batch is sent once: the repeat (same fingerprint) is answered
    /// [`Delivery::Replayed`] with the first's receipt when the first went,
    /// [`OutboundError::RepeatFailed`] when the first failed before anything went, and
    /// [`Delivery::Held`] when the first's delivery is unknown; a repeat with another
    /// fingerprint is [`OutboundError::KeyReused`]. A batch path that returns fewer results
    /// than requests leaves the others [`Unknown::NoAnswer`] with their keys held.
    ///
    /// The leases of the batch's keys are renewed while it is sent (one loop for them all);
    /// a batch future dropped mid-send holds its keys for the hold time.
    pub async fn send_batch<Req>(&mut self, reqs: Vec<Req>) -> BatchResults<S::Response, S::Error>
    where
        S: SendBatch<Req>,
        S::Response: Receipt,
        St: Store,
        I: Identify<Req>,
        C: Classify<S::Response, S::Error>,
    {
        let (door, inner) = self.parts();
        door.batch(reqs, |fresh| inner.send_batch(fresh)).await
    }

    /// Like [`send_batch`](Self::send_batch) for a service without a batch path: the fresh
    /// requests are sent one after another through `poll_ready` and `call`.
    pub async fn send_each<Req>(&mut self, reqs: Vec<Req>) -> BatchResults<S::Response, S::Error>
    where
        S: Service<Req>,
        S::Response: Receipt,
        St: Store,
        I: Identify<Req>,
        C: Classify<S::Response, S::Error>,
    {
        let (door, inner) = self.parts();
        door.batch(reqs, |fresh| async move {
            let mut out = Vec::with_capacity(fresh.len());
            for req in fresh {
                match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
                    Ok(()) => out.push(inner.call(req).await),
                    Err(e) => out.push(Err(e)),
                }
            }
            out
        })
        .await
    }
}

impl<St: Store, I, C> Door<St, I, C> {
    async fn batch<Req, R, E, F, Fut>(&self, reqs: Vec<Req>, send: F) -> BatchResults<R, E>
    where
        R: Receipt,
        I: Identify<Req>,
        C: Classify<R, E>,
        F: FnOnce(Vec<Req>) -> Fut,
        Fut: Future<Output = Vec<Result<R, E>>>,
    {
        let mut slots: Vec<Slot<R, E>> = Vec::with_capacity(reqs.len());
        let mut fresh = Vec::new();
        let mut tickets: Vec<Option<Ticket>> = Vec::new();
        // The fresh requests of this batch by store key: a repeat is answered from its first.
        let mut firsts: HashMap<[u8; 32], (usize, Fingerprint)> = HashMap::new();
        for req in reqs {
            let identity = match self.identify.identify(&req) {
                Err(e) => {
                    slots.push(Slot::Done(Err(OutboundError::KeyInvalid(e))));
                    continue;
                }
                Ok(None) if self.requires_key() => {
                    slots.push(Slot::Done(Err(OutboundError::KeyMissing)));
                    continue;
                }
                Ok(None) => {
                    slots.push(Slot::Fresh(fresh.len()));
                    fresh.push(req);
                    tickets.push(None);
                    continue;
                }
                Ok(Some(identity)) => identity,
            };
            let id = *self.store_key(&identity).id();
            if let Some((first, fingerprint)) = firsts.get(&id) {
                slots.push(if fingerprint == identity.fingerprint() {
                    Slot::Repeat(*first)
                } else {
                    Slot::Done(Err(OutboundError::KeyReused))
                });
                continue;
            }
            match self.begin(&identity).await {
                Start::Send(ticket) => {
                    firsts.insert(id, (fresh.len(), *identity.fingerprint()));
                    slots.push(Slot::Fresh(fresh.len()));
                    fresh.push(req);
                    tickets.push(Some(ticket));
                }
                Start::Answered(answer) => slots.push(Slot::Done(answer)),
            }
        }

        // Dropped mid-send, every claimed key is held: its message may have gone.
        let guards: Vec<Option<HoldOnDrop<St>>> = tickets
            .into_iter()
            .map(|t| t.map(|t| HoldOnDrop::new(self.keys(), t)))
            .collect();
        let results = if fresh.is_empty() {
            Vec::new()
        } else {
            let claimed: Vec<&Ticket> = guards.iter().flatten().map(HoldOnDrop::ticket).collect();
            renewing(&self.engine, &claimed, send(fresh)).await
        };

        let mut results = results.into_iter();
        let mut settled: Vec<Option<Answer<R, E>>> = Vec::with_capacity(guards.len());
        let mut steps = Vec::new();
        for guard in guards {
            let answer = match (guard, results.next()) {
                (Some(guard), Some(result)) => {
                    let ticket = guard.disarm();
                    let (step, answer) = self.verdict(ticket.key(), result);
                    steps.push(self.keys().finish_detached(ticket, step));
                    answer
                }
                (None, Some(result)) => self.unkeyed(result),
                (Some(guard), None) => {
                    steps.push(self.keys().finish_detached(guard.disarm(), Step::Hold));
                    Ok(Delivery::Unknown(Unknown::NoAnswer))
                }
                (None, None) => Ok(Delivery::Unknown(Unknown::NoAnswer)),
            };
            settled.push(Some(answer));
        }
        for step in steps {
            step.await;
        }

        // Repeats first (they read their first's answer), then the fresh answers move out.
        let repeats: Vec<Option<Answer<R, E>>> = slots
            .iter()
            .map(|slot| match slot {
                Slot::Repeat(first) => Some(repeat_of(settled[*first].as_ref())),
                _ => None,
            })
            .collect();
        slots
            .into_iter()
            .zip(repeats)
            .map(|(slot, repeat)| match (slot, repeat) {
                (Slot::Done(answer), _) => answer,
                (Slot::Fresh(n), _) => settled[n]
                    .take()
                    .unwrap_or(Ok(Delivery::Unknown(Unknown::NoAnswer))),
                (Slot::Repeat(_), Some(answer)) => answer,
                (Slot::Repeat(_), None) => Ok(Delivery::Held),
            })
            .collect()
    }
}

/// Runs `work` while the claims' leases are renewed every third of the lease: one timer and
/// one round of renewals at a time for the whole batch. A claim whose renewal finds it lost
/// is not renewed again.
async fn renewing<St: Store, F: Future>(
    engine: &Engine<St>,
    claimed: &[&Ticket],
    work: F,
) -> F::Output {
    let period = engine.lease() / 3;
    let mut work = pin!(work);
    let mut sleep = pin!(tokio::time::sleep(period));
    let mut live: Vec<usize> = (0..claimed.len()).collect();
    let mut round: Option<Renewing<'_>> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        loop {
            if let Some(r) = round.as_mut() {
                let Poll::Ready(still) = r.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                live = still;
                round = None;
                sleep
                    .as_mut()
                    .reset(tokio::time::Instant::now() + period);
            }
            if live.is_empty() || sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let ids = std::mem::take(&mut live);
            round = Some(Box::pin(async move {
                let mut still = Vec::with_capacity(ids.len());
                for i in ids {
                    let ticket = claimed[i];
                    match engine.renew(ticket).await {
                        Ok(true) => still.push(i),
                        Ok(false) => {
                            tracing::warn!(key = ?ticket.key(), "outbound lease lost while the batch was out; a duplicate may send");
                        }
                        Err(e) => {
                            tracing::warn!(key = ?ticket.key(), error = %e, "outbound lease renewal failed; retrying");
                            still.push(i);
                        }
                    }
                }
                still
            }));
        }
    })
    .await
}

/// The answer to an in-batch repeat of a fresh request: its receipt when it went (read back
/// through the receipt's encoding, as a later repeat would get it), its failure when nothing
/// went, else held (its delivery is unknown).
fn repeat_of<R: Receipt, E>(first: Option<&Answer<R, E>>) -> Answer<R, E> {
    match first {
        Some(Ok(Delivery::Sent(r) | Delivery::Replayed(r))) => Ok(r
            .to_bytes()
            .and_then(R::from_bytes)
            .map_or(Delivery::Held, Delivery::Replayed)),
        Some(
            Ok(Delivery::Rejected { retryable, .. }) | Err(OutboundError::Failed { retryable, .. }),
        ) => Err(OutboundError::RepeatFailed {
            retryable: *retryable,
        }),
        _ => Ok(Delivery::Held),
    }
}

//! The service: steps 1–5 of the check order at once, then the keyed sequence in one future.
//! The sequence is buffer, fingerprint, claim, run, classify and record.

use super::body::{BodyEnd, EndHook, ReadError, RequestBody, ResponseBody, read_limited};
use super::classify::{Judged, classify};
use super::config::{Config, LayerState};
use super::extensions::{ClaimedKey, KeyMissing};
use super::future::ResponseFuture;
use super::grpc::is_grpc;
use super::headers::REPLAYED_HEADER;
use super::rejection::{Rejection, RejectionKind};
use super::replay::replay;
use crate::engine::key::IdempotencyKey;
use crate::engine::record::Draft;
use crate::engine::scope::Scope;
use crate::engine::settle::{Recording, Settle, Tally};
use crate::engine::steps::{Found, StepSource};
use crate::engine::{Begin, Ticket, Verdict};
use crate::metrics::{self, Settled};
use crate::store::StoreKey;
use crate::store::{Store, StoreError, StoreErrorKind};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body::Body;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tower_service::Service;
use tracing::Instrument;

/// Retry-After for a retryable rejection: in flight, store failure, full store or scope.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The idempotency middleware service. See the [module docs](crate::http).
pub struct Idempotency<S, St> {
    pub(crate) inner: S,
    pub(crate) state: Arc<LayerState<St>>,
}

impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, St> Idempotency<S, St> {
    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S, St>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let config = &self.state.config;
        let (mut parts, body) = req.into_parts();
        // A gRPC request: classified by its gRPC status, rejected with gRPC statuses.
        let grpc = is_grpc(&parts.headers);
        let (key, scope) = match plan(config, &parts) {
            Plan::Pass => {
                let req = Request::from_parts(parts, RequestBody::passthrough(body));
                return ResponseFuture::passthrough(self.inner.call(req));
            }
            Plan::Unkeyed => {
                observe(config, grpc, metrics::Outcome::Untracked);
                // Lets the extractors tell "no key sent" from "layer not installed".
                parts.extensions.insert(KeyMissing);
                let req = Request::from_parts(parts, RequestBody::passthrough(body));
                return ResponseFuture::passthrough(self.inner.call(req));
            }
            Plan::Reject(rejection) => return self.reject(rejection, grpc),
            Plan::Keyed(key, scope) => (key, scope),
        };
        self.keyed(parts, body, key, scope, grpc)
    }
}

impl<S, St> Idempotency<S, St> {
    /// Steps 6 and on: the keyed sequence in one future.
    fn keyed<ReqB, ResB>(
        &mut self,
        parts: Parts,
        body: ReqB,
        key: IdempotencyKey,
        scope: Scope,
        grpc: bool,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        St: Store,
        ReqB: Body<Data = Bytes> + Send + 'static,
        ResB: Body<Data = Bytes> + Send + 'static,
        ResB::Error: Send,
    {
        // Keep the instance that was polled ready; the clone takes its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let state = Arc::clone(&self.state);
        // One span per keyed request; `outcome`, `result` and `key` are filled in as they are
        // known, the status when the response is.
        let door = if grpc {
            metrics::Door::Grpc
        } else {
            state.config.metrics.door()
        };
        let span = crate::trace::http_span(
            state.engine.span_level(),
            door.as_str(),
            grpc,
            parts.method.as_str(),
        );
        #[cfg(feature = "axum")]
        if let Some(route) = parts.extensions.get::<axum::extract::MatchedPath>() {
            span.record("http.route", route.as_str());
        }
        // The span is entered around each poll by the response future, not held in the box:
        // the box stays under the allocator's small-size cache (1 KiB), and is written once.
        let fut = keyed(state, inner, parts, body, key, scope, grpc);
        ResponseFuture::keyed(Box::pin(fut), span)
    }
}

/// What the layer does with a request before it reads the body. That covers steps 1–5, the
/// check for an outer layer's claim, and the declared body length. `#[idempotent]` asks too,
/// and runs the handler's extractors between this and the claim.
pub(crate) enum Plan {
    /// Not acted on: a method outside the set, or a request an outer layer claimed under the
    /// same store key. It is passed through.
    Pass,
    /// No key and none required: passed through, marked [`KeyMissing`].
    Unkeyed,
    /// Refused before the body is read.
    Reject(Rejection),
    /// Keyed: buffer and fingerprint the body, then claim.
    Keyed(IdempotencyKey, Scope),
}

pub(crate) fn plan(config: &Config, parts: &Parts) -> Plan {
    // 1. Methods the layer does not act on pass through without a store call.
    if !config.applies_to(&parts.method) {
        return Plan::Pass;
    }
    // 2. The key.
    let key = config.key(parts);
    // 3. No key, not required: pass through before any principal check.
    if key.is_none() && !config.require_key {
        return Plan::Unkeyed;
    }
    // 4. The principal.
    let Some(scope) = config.scope(parts) else {
        return Plan::Reject(principal_missing());
    };
    // 5. Missing or invalid key.
    let key = match key {
        None => {
            return Plan::Reject(key_missing(config));
        }
        Some(Err(e)) => {
            tracing::debug!(reason = %e, "idempotency key refused");
            return Plan::Reject(Rejection::new(RejectionKind::KeyInvalid, e.to_string()));
        }
        Some(Ok(k)) => k,
    };
    // Already claimed under this store key by an idempotency layer outside this one (two
    // layers on one route, or a layer and `#[idempotent]`): claiming again would find the
    // outer claim pending and answer 409. The outer layer records or releases.
    if let Some(claimed) = parts.extensions.get::<ClaimedKey>()
        && *claimed.store_key() == config.store_key(&scope, &key)
    {
        nested(claimed.store_key());
        return Plan::Pass;
    }
    match declared_too_large(config, parts) {
        Some(rejection) => Plan::Reject(rejection),
        None => Plan::Keyed(key, scope),
    }
}

/// 6a. A declared length over the limit is refused before reading.
fn declared_too_large(config: &Config, parts: &Parts) -> Option<Rejection> {
    let limit = config.max_request_body;
    content_length(&parts.headers)
        .is_some_and(|n| n > limit as u64)
        .then(|| Rejection::body_too_large(limit))
}

/// The rejection of a request body that could not be buffered.
pub(crate) fn read_rejection(e: ReadError, limit: usize) -> Rejection {
    match e {
        ReadError::TooLarge => Rejection::body_too_large(limit),
        ReadError::Failed => Rejection::new(
            RejectionKind::BodyUnreadable,
            "the request body could not be read",
        ),
    }
}

fn principal_missing() -> Rejection {
    Rejection::new(
        RejectionKind::PrincipalMissing,
        "an idempotent request must be authenticated",
    )
}

/// A stored record that failed validation: refused instead of replayed.
fn record_invalid() -> Rejection {
    Rejection::new(
        RejectionKind::RecordInvalid,
        "the stored response for this key could not be replayed",
    )
}

fn key_missing(config: &Config) -> Rejection {
    Rejection::new(RejectionKind::KeyMissing, config.missing_key_detail())
}

impl<S, St> Idempotency<S, St> {
    fn reject<F, B: Body, E>(&self, rejection: Rejection, grpc: bool) -> ResponseFuture<F, B, E> {
        ResponseFuture::ready(render(&self.state, rejection, grpc))
    }
}

pub(crate) fn render<St, B: Body>(
    state: &LayerState<St>,
    rejection: Rejection,
    grpc: bool,
) -> Response<ResponseBody<B>> {
    tracing::debug!(code = rejection.kind().code(), "idempotency rejection");
    observe(&state.config, grpc, rejected(rejection.kind()));
    // A gRPC caller gets a gRPC status; a custom renderer applies to HTTP only.
    let res = if grpc {
        rejection.to_grpc_response()
    } else {
        state.config.render(&rejection)
    };
    let mut res = res.map(|b| ResponseBody::buffered(b, None));
    res.extensions_mut().insert(rejection);
    res
}

/// Counts a request's outcome, and names it on the request's span.
fn observe(config: &Config, grpc: bool, outcome: metrics::Outcome) {
    config.metrics.request(grpc, outcome);
    crate::trace::record_on_door("outcome", outcome.as_str());
}

/// Where the layer counts how its keys ended.
fn tally(config: &Config, grpc: bool) -> Tally<'_> {
    Tally::Layer(&config.metrics, grpc)
}

/// The outcome a rejection counts as.
fn rejected(kind: RejectionKind) -> metrics::Outcome {
    use metrics::Outcome as O;
    match kind {
        RejectionKind::KeyMissing => O::KeyMissing,
        RejectionKind::KeyInvalid => O::KeyInvalid,
        RejectionKind::PrincipalMissing => O::PrincipalMissing,
        RejectionKind::InFlight => O::InFlight,
        RejectionKind::KeyReused => O::KeyReused,
        RejectionKind::BodyTooLarge => O::BodyTooLarge,
        RejectionKind::BodyUnreadable => O::BodyUnreadable,
        RejectionKind::Store => O::StoreFailed,
        RejectionKind::ScopeFull => O::ScopeFull,
        RejectionKind::StoreFull => O::StoreFull,
        RejectionKind::RecordInvalid => O::RecordInvalid,
    }
}

/// Logs a request passed through because an outer layer claimed its store key. It is a
/// warning the first time in the process, then at debug level.
fn nested(key: &StoreKey) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        tracing::debug!(outcome = "untracked", key = ?key, "idempotency key already claimed by an outer idempotency layer; passed through");
    } else {
        tracing::warn!(
            outcome = "untracked",
            key = ?key,
            "two idempotency layers act on one route (e.g. a router-wide IdempotencyLayer and \
             #[idempotent], or the layer added twice): the inner one passes requests the outer \
             one claimed under the same store key through, and the outer one's settings apply; \
             remove one of them (logged once)"
        );
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Steps 6–9 for a keyed request: buffer and fingerprint, claim, run, classify, record.
// Deliberately not an `async fn` (see the body's first comment).
#[allow(clippy::manual_async_fn)]
fn keyed<S, St, ReqB, ResB>(
    state: Arc<LayerState<St>>,
    inner: S,
    mut parts: Parts,
    body: ReqB,
    key: IdempotencyKey,
    scope: Scope,
    grpc: bool,
) -> impl Future<Output = Result<Response<ResponseBody<ResB>>, S::Error>>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send,
{
    // An `async move` block, not an `async fn`: it uses the arguments where they are
    // captured, where an `async fn` would also keep a second copy of each in its state.
    async move {
        let config = &state.config;
        let engine = &state.engine;
        let body = match read_limited(body, config.max_request_body).await {
            Ok(b) => b,
            Err(e) => {
                let rejection = read_rejection(e, config.max_request_body);
                return Ok(render(&state, rejection, grpc));
            }
        };
        let fingerprint = config.fingerprint(&parts, &body);
        let store_key = config.store_key(&scope, &key);
        crate::trace::record_key(&tracing::Span::current(), &store_key);

        // Set once the store answered that the key is in flight: a later failure of the wait
        // is no outage of a free key, and never fails open beside the run in flight.
        let mut in_flight = false;
        let begun = if config.wait_in_flight.is_zero() {
            engine.begin(store_key, fingerprint).await
        } else {
            // Boxed, as the 409 path's lookup below: rare paths that would otherwise size every
            // keyed request's future.
            Box::pin(engine.begin_waiting_seen(
                store_key,
                fingerprint,
                config.wait_in_flight,
                &mut in_flight,
            ))
            .await
        };
        let ticket = match begun {
            Ok(Begin::Run(ticket)) => ticket,
            Ok(Begin::Replayed(record)) => {
                return Ok(match replay(&config.headers, record, grpc) {
                    Ok(res) => {
                        observe(config, grpc, metrics::Outcome::Replayed);
                        tracing::debug!(outcome = "replayed", key = ?store_key, "idempotency replay");
                        res
                    }
                    Err(reason) => {
                        tracing::warn!(outcome = "record_invalid", key = ?store_key, reason, "stored record failed re-validation; not replayed");
                        render(&state, record_invalid(), grpc)
                    }
                });
            }
            Ok(Begin::InFlight) => {
                tracing::info!(outcome = "in_flight", key = ?store_key, "idempotent request already in progress");
                return Ok(render(
                    &state,
                    Rejection::new(
                        RejectionKind::InFlight,
                        "a request with this key is still being processed; retry later",
                    )
                    .with_retry_after(whole_seconds(
                        Box::pin(engine.in_flight_retry_after(&store_key)).await,
                    )),
                    grpc,
                ));
            }
            Ok(Begin::KeyReused) => {
                tracing::warn!(outcome = "key_reused", key = ?store_key, "idempotency key reused with a different request");
                return Ok(render(
                    &state,
                    Rejection::new(
                        RejectionKind::KeyReused,
                        "this key was already used for a different request",
                    ),
                    grpc,
                ));
            }
            Ok(Begin::RecordInvalid(e)) => {
                tracing::warn!(outcome = "record_invalid", key = ?store_key, error = %e, "stored record failed validation; not replayed");
                return Ok(render(&state, record_invalid(), grpc));
            }
            Err(e) if config.fail_open && !in_flight && store_down(&e) => {
                observe(config, grpc, metrics::Outcome::RanUnclaimed);
                tracing::warn!(outcome = "ran_unclaimed", key = ?store_key, error = %e, "idempotency store down; the handler runs without a claim (fail open): a repeat may run it again, and its response is not recorded");
                // The key for the extractors; no claim, so a step refuses to run.
                parts.extensions.insert(ClaimedKey::new(
                    key,
                    Arc::clone(&config.namespace),
                    scope,
                    store_key,
                ));
                let req = Request::from_parts(parts, RequestBody::buffered(body));
                let work = run_unclaimed(inner, req);
                return if config.run_to_completion {
                    state.drain.detachable(work).await
                } else {
                    Box::pin(state.drain.counted(work)).await
                };
            }
            Err(e) => return Ok(render(&state, store_rejection(&e), grpc)),
        };
        observe(config, grpc, metrics::Outcome::Ran);
        tracing::debug!(outcome = "ran", key = ?store_key, "idempotency key claimed");

        // One extension; the derived key is only hashed if a handler asks for it.
        let engine_ref: Arc<dyn StepSource> = Arc::clone(&state) as Arc<LayerState<St>>;
        parts.extensions.insert(
            ClaimedKey::new(key, Arc::clone(&config.namespace), scope, store_key)
                .claimed(engine_ref, Arc::clone(ticket.claim())),
        );
        let req = Request::from_parts(parts, RequestBody::buffered(body));

        // Polled in the request's span (entered by the response future); a detached task
        // enters it too (`detachable` keeps the current span).
        let work = run_claimed(Arc::clone(&state), inner, req, ticket, store_key, grpc);
        if config.run_to_completion {
            // Finishes (and records) on a task of its own if this future is dropped first.
            state.drain.detachable(work).await
        } else {
            // Boxed as the detachable work is, so that this branch does not make every keyed
            // request's future (replays too) as large as the handler's.
            Box::pin(state.drain.counted(work)).await
        }
    }
}

/// Whether a claim's error means the store could not be reached or did not answer: the only
/// errors [`fail_open`](crate::IdempotencyLayer::fail_open) runs the work on. A full store or
/// scope is a bound, and an answer not understood may hide a record: those still refuse.
fn store_down(e: &StoreError) -> bool {
    matches!(
        e.kind(),
        StoreErrorKind::Unavailable | StoreErrorKind::Timeout
    )
}

/// A keyed request run without a claim while the store is down: the handler's response is
/// passed on as it comes, nothing recorded or released.
async fn run_unclaimed<S, ReqB, ResB>(
    mut inner: S,
    req: Request<RequestBody<ReqB>>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
{
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let res = inner.call(req).await?;
    Ok(res.map(ResponseBody::passthrough))
}

/// The claimed part of a keyed request: the handler and the reading of its body under lease
/// renewal, then the record or release. It owns everything it uses. So it can finish on a
/// task of its own when the caller goes away.
// Deliberately not an `async fn` (see the body's first comment).
#[allow(clippy::manual_async_fn)]
fn run_claimed<S, St, ReqB, ResB>(
    state: Arc<LayerState<St>>,
    mut inner: S,
    req: Request<RequestBody<ReqB>>,
    ticket: Ticket,
    store_key: StoreKey,
    grpc: bool,
) -> impl Future<Output = Result<Response<ResponseBody<ResB>>, S::Error>>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    St: Store,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    // An `async move` block, not an `async fn`: it uses the arguments where they are
    // captured, where an `async fn` would also keep a second copy of each in its state.
    async move {
        let config = &state.config;
        let engine = &state.engine;
        // Room the record leaves for what is added before it is stored.
        let tail = engine.tag_len();
        // The handler and the reading of its body both run under lease renewal.
        let outcome = engine
            .run(&ticket, async {
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                let res = inner.call(req).await?;
                let max = engine.max_record_body();
                Ok(classify(config, max, tail, &store_key, res, grpc).await)
            })
            .await;

        // The steps found the key bound to another request, or a step record that fails
        // validation: that is the answer, whatever the handler returned. The claim is released,
        // never completed, so the first request's steps stay for its retry.
        if let Some(found) = ticket.claim().found() {
            drop(outcome);
            engine
                .settle(ticket, Settle::Release, tally(config, grpc))
                .await;
            let rejection = match found {
                Found::KeyReused => {
                    tracing::warn!(outcome = "key_reused", key = ?store_key, "idempotency key's steps belong to a different request; answered as a reused key");
                    Rejection::new(
                        RejectionKind::KeyReused,
                        "this key was already used for a different request",
                    )
                }
                Found::RecordInvalid => {
                    tracing::warn!(outcome = "record_invalid", key = ?store_key, "idempotency step record failed validation; answered as an invalid record");
                    record_invalid()
                }
            };
            return Ok(render(&state, rejection, grpc));
        }

        let Judged {
            mut response,
            verdict,
            record,
            at_end,
        } = match outcome {
            Ok(judged) => judged,
            Err(e) => {
                engine
                    .settle(ticket, Settle::Release, tally(config, grpc))
                    .await;
                return Err(e);
            }
        };
        // After the record was drafted: the mark is of this answer, never stored.
        if config.mark_first_runs {
            response
                .headers_mut()
                .insert(REPLAYED_HEADER, HeaderValue::from_static("false"));
        }
        let settle = match (verdict, record) {
            (Verdict::Record, Some(record)) if at_end => {
                // The body streams on; a task holds the key until it has ended.
                let (report, ended) = oneshot::channel();
                // The task runs in the request's span: its end names the span's `result`.
                let settled = tokio::spawn(
                    state
                        .drain
                        .counted(settle_at_end(
                            Arc::clone(&state),
                            ticket,
                            store_key,
                            record,
                            ended,
                            grpc,
                        ))
                        .in_current_span(),
                );
                return Ok(response.map(|body| body.settled_by(EndHook::new(report, settled))));
            }
            (Verdict::Record, Some(record)) => Settle::Record(Recording::Draft(record)),
            // Kept for one lease from now, as a run that stopped renewing.
            (Verdict::Hold, _) => Settle::Hold(engine.lease()),
            (Verdict::Fail, _) => Settle::Fail,
            _ => Settle::Release,
        };
        engine.settle(ticket, settle, tally(config, grpc)).await;
        Ok(response)
    }
}

/// Holds the key of a response whose body streams on, then settles it by how the body ended:
/// ended → complete, failed → release. Its lease is renewed for at most the stream lease
/// limit. A body dropped before its end settles nothing, as when the client went away. The
/// work happened but its answer was not delivered. So the key stays pending until its lease
/// lapses: 409 until then, a re-run after. This is as when the client goes away before the
/// handler finished.
async fn settle_at_end<St: Store>(
    state: Arc<LayerState<St>>,
    ticket: Ticket,
    key: StoreKey,
    record: Draft,
    mut ended: oneshot::Receiver<BodyEnd>,
    grpc: bool,
) {
    let engine = &state.engine;
    let limit = state.config.streaming.lease_limit;
    let end = match engine
        .run(&ticket, tokio::time::timeout(limit, &mut ended))
        .await
    {
        Ok(end) => end,
        Err(_) => {
            // A stream that never ends must not hold its key forever: the lease now lapses,
            // and a retry after it runs again while this stream goes on.
            tracing::warn!(key = ?key, limit = ?limit, "response body still streaming at the stream lease limit; its lease is no longer renewed");
            (&mut ended).await
        }
    };
    let tally = tally(&state.config, grpc);
    match end {
        Ok(BodyEnd::Ended) => {
            let settle = Settle::Record(Recording::Draft(record));
            engine.settle(ticket, settle, tally).await;
        }
        Ok(BodyEnd::Failed) => {
            tracing::debug!(key = ?key, "response body failed while streamed");
            engine.settle(ticket, Settle::Release, tally).await;
        }
        Err(_) => {
            tracing::debug!(result = "abandoned", key = ?key, "response body dropped before its end (the client went away); the key stays pending until its lease lapses");
            tally.count(Settled::Abandoned);
        }
    }
}

/// `Retry-After` for a request found in flight: the engine's wait (the lease the first run
/// has left, at most a third of the lease) in whole seconds rounded up, at least 1.
fn whole_seconds(wait: Duration) -> Duration {
    Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(RETRY_AFTER)
}

fn store_rejection(e: &StoreError) -> Rejection {
    match e.kind() {
        StoreErrorKind::ScopeFull => {
            tracing::warn!(outcome = "scope_full", error = %e, "idempotency scope full");
            Rejection::new(
                RejectionKind::ScopeFull,
                "too many requests of this caller are in progress",
            )
            .with_retry_after(RETRY_AFTER)
        }
        StoreErrorKind::StoreFull => {
            tracing::warn!(outcome = "store_full", error = %e, "idempotency store full");
            Rejection::new(
                RejectionKind::StoreFull,
                "the idempotency store is full; retry later",
            )
            .with_retry_after(RETRY_AFTER)
        }
        _ => {
            tracing::warn!(outcome = "store_failed", error = %e, "idempotency claim failed; the handler did not run");
            Rejection::new(
                RejectionKind::Store,
                "the idempotency store is unavailable; retry later",
            )
            .with_retry_after(RETRY_AFTER)
        }
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl<S: tonic::server::NamedService, St> tonic::server::NamedService for Idempotency<S, St> {
    const NAME: &'static str = S::NAME;
}

//! [`RetryPolicy`] as a `tower::retry::Policy` for `http` clients: hyper-util's client, a tonic
//! channel with a body that can be cloned, any `Service<http::Request<B>>`.

use super::buffer::Streamed;
use super::classify::attempt_failure_of_any;
use super::error::RetryError;
use super::policy::{Attempt, Attempts, Decision, RetryPolicy, key_prefix, log_attempt};
use super::reply::Reply;
use super::reply::RetryErrorKind;
use http::{HeaderMap, Request, Response};
use std::any::Any;
use std::time::Instant;
use tokio::time::Sleep;

/// The attempt count and start of one logical request. They ride in the extensions of the
/// clone that the retry layer keeps. Tower clones the policy per call but asks the service's
/// own policy for the first clone, so the policy itself holds no per-request state.
#[derive(Clone, Copy, Debug)]
struct Progress {
    started: Instant,
    /// Attempts made once the request holding this has been sent.
    number: u32,
}

/// The rules of [`RetryPolicy::decide`] for `tower::retry::Retry`.
///
/// A request is cloned before each attempt, its key header with it. Its body must be `Clone`,
/// as `Full<Bytes>` is. The final response gets an [`Attempts`] extension. Whether the server
/// honours keys is read from the request URI's host and port. A URI without a host, as a
/// tonic client sends, honours only under [`RetryPolicy::keys_honoured_by_all`].
///
/// When the attempts end in an error of type `tower::BoxError`, it is replaced by a boxed
/// [`RetryError`]. That holds the attempts and the key; its source is the last attempt's
/// error.
///
/// A delay is a `tokio::time::sleep`, so the service runs on a Tokio runtime with time.
impl<B, R, E> tower::retry::Policy<Request<B>, Response<R>, E> for RetryPolicy
where
    B: Clone,
    E: 'static,
{
    type Future = Sleep;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<R>, E>,
    ) -> Option<Self::Future> {
        let progress = req
            .extensions()
            .get::<Progress>()
            .copied()
            .unwrap_or(Progress {
                started: Instant::now(),
                number: 1,
            });
        let keyed = req.headers().contains_key(self.key_header_name());
        let attempt = Attempt::new(
            req.method(),
            keyed,
            progress.number,
            progress.started.elapsed(),
        )
        .key_honoured(self.honours_uri(req.uri()));
        let reply = match result {
            Ok(res) => Reply::response(res.status(), res.headers()),
            Err(e) => Reply::Failed(attempt_failure_of_any(e)),
        };
        let failure = match reply {
            Reply::Failed(f) => Some(f),
            Reply::Response { .. } => None,
        };
        let decision = self.decide(&attempt, &reply);
        let key = key_prefix(req.headers(), self.key_header_name());
        log_attempt(&attempt, &key, &reply, decision);
        match decision {
            Decision::Retry(delay) => {
                req.extensions_mut().insert(Progress {
                    number: progress.number.saturating_add(1),
                    ..progress
                });
                Some(tokio::time::sleep(delay))
            }
            Decision::Stop(reason) => {
                let header = self.key_header_name();
                match result {
                    Ok(res) => {
                        let attempts = Attempts::new(
                            progress.number,
                            res.headers(),
                            reason,
                            req.headers(),
                            header,
                        );
                        res.extensions_mut().insert(attempts);
                    }
                    Err(e) => {
                        let attempts = Attempts::new(
                            progress.number,
                            &HeaderMap::new(),
                            reason,
                            req.headers(),
                            header,
                        );
                        give_up(e, failure.unwrap_or(RetryErrorKind::Transport), attempts);
                    }
                }
                None
            }
        }
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        // A streamed body from `BufferRequestLayer` is sent once.
        if req.extensions().get::<Streamed>().is_some() {
            return None;
        }
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        if clone.extensions().get::<Progress>().is_none() {
            clone.extensions_mut().insert(Progress {
                started: Instant::now(),
                number: 1,
            });
        }
        Some(clone)
    }
}

/// Turns the last attempt's error into a [`RetryError`] with the attempts and the key, when
/// the stack's error type can hold one: `tower::BoxError`. Another type is left as is.
fn give_up<E: 'static>(err: &mut E, failure: RetryErrorKind, attempts: Attempts) {
    let any: &mut dyn Any = err;
    if let Some(boxed) = any.downcast_mut::<tower::BoxError>() {
        let source = std::mem::replace(boxed, Box::from(""));
        *boxed = Box::new(RetryError::new(failure, attempts, source));
    }
}

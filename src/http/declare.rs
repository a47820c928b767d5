//! The verdict a handler declares for its response, read by the layer before it classifies
//! the response by status.
//!
//! Classifying by status is a guess about what the work did. A 500 may come after the payment
//! was taken; a 201 may come from a handler that changed nothing. The handler knows. It says
//! so with a [`Verdict`] in the response's extensions, and the layer follows it.

use crate::engine::Verdict;
use http::Response;

/// Declares what the work behind `response` did: puts `verdict` into its extensions.
///
/// The layer then records, releases or holds the key by it, not by the status. An earlier
/// declaration is replaced.
///
/// | declared | the key | a retry under the key |
/// | --- | --- | --- |
/// | `Release` (or `Fail`) | released, whatever the status | runs the handler again |
/// | `Record` | recorded, whatever the status (200–599 but 304) and whatever its body does | is replayed this response |
/// | `Hold` | held: its claim is kept for one lease from the response | gets 409 until then, runs again after |
///
/// **Why a 5xx may be recorded.** The IETF `Idempotency-Key` draft says a server should
/// answer a repeat with the first request's result, success or error. By default this layer
/// releases a 5xx instead: most 5xx mean the work did not happen, a database down or a
/// dependency timing out, and a retry is the cure. Only the resource knows whether the error came before or after the side effect. A handler
/// that failed *after* an effect it cannot undo must not run again on retry: the charge went
/// through, writing the order failed. Declare the 500 `Record`, and the retry gets the same
/// 500 instead of a second charge. A handler that cannot tell whether the effect happened
/// declares `Hold`: a payment provider timed out, say. The key stays held for the lease, time
/// for a reconciliation job to settle it.
///
/// **A declared `Record` whose body cannot be recorded whole** never frees the key. That is a
/// body over the record limit, slower than the collection bound, of a streaming type, or
/// failing while read. Its status and headers are recorded at once, before the body goes on.
/// A retry is replayed them with an empty body, whatever the body then does. Undeclared, such
/// a body is recorded only once it has ended, and released if it fails. A gRPC response keeps
/// its status in its trailers, at the end of such a body. With nothing a replay could answer,
/// its key is held until its lease lapses instead, never released. A `304 Not Modified` is
/// never recorded: it means nothing without the request's validators.
///
/// A declaration wins over the classification table and the
/// [`classify`](super::IdempotencyLayer::classify) hook. A rejection of another idempotency
/// layer inside this one is still never recorded.
///
/// With axum, return the verdict as a response part:
///
/// ```
/// use axum::http::StatusCode;
/// use tower_idempotency::engine::Verdict;
///
/// async fn charge() -> (StatusCode, Verdict, &'static str) {
///     // The card was charged, but storing the order failed: never charge again on retry.
///     (StatusCode::INTERNAL_SERVER_ERROR, Verdict::Record, "charged; order not stored")
/// }
///
/// async fn validate() -> (StatusCode, Verdict, &'static str) {
///     // Nothing happened: the corrected request may use the same key.
///     (StatusCode::OK, Verdict::Release, "dry run: nothing was done")
/// }
/// ```
///
/// Any other stack:
///
/// ```
/// use tower_idempotency::engine::Verdict;
///
/// let mut response = http::Response::new(());
/// tower_idempotency::http::declare(&mut response, Verdict::Hold);
/// assert_eq!(response.extensions().get::<Verdict>(), Some(&Verdict::Hold));
/// ```
pub fn declare<B>(response: &mut Response<B>, verdict: Verdict) {
    response.extensions_mut().insert(verdict);
}

/// The verdict declared on `response`, if any.
pub(crate) fn declared<B>(response: &Response<B>) -> Option<Verdict> {
    response.extensions().get::<Verdict>().copied()
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponseParts for Verdict {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut res: axum_core::response::ResponseParts,
    ) -> Result<axum_core::response::ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

//! The outcome a handler declares for its response, read by the layer before it classifies the
//! response by status.
//!
//! Classifying by status is a guess about what the work did: a 500 may come after the payment
//! was taken, a 201 may come from a handler that changed nothing. The handler knows; it says
//! so with a [`Declared`] marker in the response's extensions, and the layer follows it.

use http::Response;

/// What the work did, as the handler (or a layer inside the idempotency layer) declares it.
/// Put into the response's extensions; the layer then records, releases or keeps the key by
/// it instead of by the status.
///
/// | declared | the key | a retry under the key |
/// | --- | --- | --- |
/// | [`NotStarted`](Self::NotStarted) | released, whatever the status | runs the handler again |
/// | [`Definitive`](Self::Definitive) | recorded, whatever the status (2xx–5xx, not 304), and whatever its body does | is replayed this response |
/// | [`Ambiguous`](Self::Ambiguous) | neither: pending until its lease lapses | gets 409 until then, runs again after |
///
/// **Why a 5xx may be recorded.** By default a 5xx is released: most 5xx mean the work did not
/// happen (a database down, a dependency timing out), and a retry is the cure. The open
/// discussion of the IETF `Idempotency-Key` draft leaves to the resource whether an error
/// response is stored, because only the resource knows whether the error came before or after
/// the side effect. A handler that failed *after* an effect it cannot undo (the charge went
/// through, writing the order failed) must not run again on retry: declare the 500
/// definitive, and the retry gets the same 500 instead of a second charge. A handler that
/// cannot tell whether the effect happened (a payment provider timed out) declares the
/// outcome ambiguous: the key stays held for the lease, time for a reconciliation job to
/// settle it, instead of a retry running the work at once.
///
/// **A definitive body that cannot be recorded whole** (over the record limit, slower than the
/// collection bound, a streaming media type, or failing while read) never frees the key: the
/// status and headers are recorded at once, before the body goes on, and a retry is replayed
/// them with an empty body, whether the body then ends, fails, or its client leaves. (Without
/// the declaration such a body is recorded only once it has ended, and released if it
/// fails.) A gRPC response keeps its status in its trailers, at the end of such a body: with
/// nothing a replay could answer, its key is held until its lease lapses instead (409 until
/// then, a re-run after), never released.
///
/// Precedence: a marker wins over the classification table and the
/// [`classify`](super::IdempotencyLayer::classify) hook. A rejection of another idempotency
/// layer inside this one is still never recorded.
///
/// With axum, return it as a response part:
///
/// ```
/// use axum::http::StatusCode;
/// use tower_idempotency::http::Declared;
///
/// async fn charge() -> (StatusCode, Declared, &'static str) {
///     // The card was charged, but storing the order failed: never charge again on retry.
///     (StatusCode::INTERNAL_SERVER_ERROR, Declared::Definitive, "charged; order not stored")
/// }
///
/// async fn validate() -> (StatusCode, Declared, &'static str) {
///     // Nothing happened: the corrected request may use the same key.
///     (StatusCode::OK, Declared::NotStarted, "dry run: nothing was done")
/// }
/// ```
///
/// Any other stack: `Declared::Ambiguous.insert_into(&mut response)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Declared {
    /// Nothing happened (validation failed, a precondition was not met): the key is released,
    /// so the corrected request can be sent with the same key.
    NotStarted,
    /// The work's final answer, whatever the status (a 500 after an effect that cannot be
    /// undone): recorded and replayed (as status and headers when the body cannot be recorded
    /// whole). A `304 Not Modified` is never recorded (it means nothing without the request's
    /// validators) and is released.
    Definitive,
    /// The work may or may not have happened: the key stays pending until its lease lapses,
    /// so a retry neither replays nor runs at once (409 until then).
    Ambiguous,
}

impl Declared {
    /// Puts the marker into `response`'s extensions (replacing an earlier one).
    pub fn insert_into<B>(self, response: &mut Response<B>) {
        response.extensions_mut().insert(self);
    }

    /// The marker of `response`, if it has one.
    #[must_use]
    pub fn of<B>(response: &Response<B>) -> Option<Self> {
        response.extensions().get::<Self>().copied()
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponseParts for Declared {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut res: axum_core::response::ResponseParts,
    ) -> Result<axum_core::response::ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}

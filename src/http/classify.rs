//! Step 9: what becomes of the handler's response, HTTP and gRPC side by side. A response is
//! recorded, then sent. Or it is released: sent, with the key freed for a retry.
//!
//! HTTP: 2xx, 3xx but 304, and 4xx but 408, 425 and 429 are recorded. A classification hook
//! may release them. Some responses are sent on as they come: a streaming one, and a body over
//! the record limit. A response is streaming when it has a streaming media type, or its body
//! does not end within the collection bound. These are recorded as status and headers only
//! once they have ended. They are released if they fail. A declared response whose
//! body cannot be recorded whole is recorded as status and headers at once. Its work is done,
//! whatever its body does after.
//!
//! gRPC covers an HTTP 200 to a gRPC request. The outcome is the gRPC status. It is read from
//! the headers of a Trailers-Only response, or else from the trailers. So the body is read
//! first. See [gRPC mode](super#grpc-classification).

use super::body::{Collected, ResponseBody, collect_limited};
use super::config::{Config, ResponseMode};
use super::declare::declared;
use super::grpc::{GrpcCode, status_of};
use super::headers::GRPC_STATUS;
use super::rejection::Rejection;
use crate::engine::Verdict;
use crate::engine::record::{Draft, FieldRef};
use crate::store::StoreKey;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::Body;

/// Whether a response with this status is recorded. 2xx is, and 4xx except 408, 425 and 429.
/// 3xx is, except 304. A redirect, such as a `303 See Other` after a create, is the work's
/// final answer.
pub(crate) fn is_recordable(status: u16) -> bool {
    matches!(status, 200..=299)
        || (matches!(status, 300..=399) && status != 304)
        || (matches!(status, 400..=499) && !matches!(status, 408 | 425 | 429))
}

/// Whether a gRPC response with this status is recorded. `OK` and the codes the caller caused
/// are: the same request gets the same answer. The transient ones are released.
pub(crate) fn is_recorded_code(code: GrpcCode) -> bool {
    use GrpcCode::*;
    match code {
        Ok | InvalidArgument | NotFound | AlreadyExists | PermissionDenied | FailedPrecondition
        | OutOfRange | Unimplemented | Unauthenticated => true,
        Cancelled | Unknown | DeadlineExceeded | ResourceExhausted | Aborted | Internal
        | Unavailable | DataLoss => false,
    }
}

/// Whether a `grpc-status` number is recorded. A number that is no gRPC code is not.
pub(crate) fn is_recorded_status(status: i32) -> bool {
    GrpcCode::from_i32(status).is_some_and(is_recorded_code)
}

/// Whether a declared response is recorded. Any final status a replay can give is,
/// 200–599, but `304 Not Modified`. A 304 means nothing without the request's validators.
pub(crate) fn is_recordable_declared(status: u16) -> bool {
    matches!(status, 200..=599) && status != 304
}

/// The handler's response judged: the verdict its key is settled with, and the response that
/// goes out either way.
pub(crate) struct Judged<B: Body> {
    pub(crate) response: Response<ResponseBody<B>>,
    pub(crate) verdict: Verdict,
    /// The record, with [`Verdict::Record`] only.
    pub(crate) record: Option<Draft>,
    /// Sent on before its body has ended: recorded once the body has ended, released if it
    /// fails.
    pub(crate) at_end: bool,
}

impl<B: Body> Judged<B> {
    fn release(response: Response<ResponseBody<B>>) -> Self {
        Self::of(response, Verdict::Release, None, false)
    }

    /// Declared or classified [`Verdict::Hold`], or a record that cannot be written.
    fn hold(response: Response<ResponseBody<B>>) -> Self {
        Self::of(response, Verdict::Hold, None, false)
    }

    /// Recorded now, then sent. The body was read whole.
    fn record(response: Response<ResponseBody<B>>, draft: Draft) -> Self {
        Self::of(response, Verdict::Record, Some(draft), false)
    }

    fn record_at_end(response: Response<ResponseBody<B>>, draft: Draft) -> Self {
        Self::of(response, Verdict::Record, Some(draft), true)
    }

    fn of(
        response: Response<ResponseBody<B>>,
        verdict: Verdict,
        record: Option<Draft>,
        at_end: bool,
    ) -> Self {
        Self {
            response,
            verdict,
            record,
            at_end,
        }
    }
}

/// No trailers, for [`Draft::write`].
const NO_TRAILERS: Option<fn() -> std::iter::Empty<FieldRef<'static>>> = None;

/// Writes a record, or holds the key when it cannot be written. Only a status outside
/// 100–999 stops it, and an `http::StatusCode` never is one.
fn keep_unless_written<B: Body>(
    res: Response<ResponseBody<B>>,
    key: &StoreKey,
    written: Result<Draft, crate::engine::record::RecordError>,
    judged: fn(Response<ResponseBody<B>>, Draft) -> Judged<B>,
) -> Judged<B> {
    match written {
        Ok(draft) => judged(res, draft),
        Err(e) => {
            tracing::warn!(key = ?key, reason = e.reason(), "response cannot be recorded; the key is held for one lease");
            Judged::hold(res)
        }
    }
}

/// A record of status and headers only. The headers that describe a body are dropped, since
/// its replay has none.
fn status_only(
    config: &Config,
    status: u16,
    headers: &HeaderMap,
    declared: bool,
    tail: usize,
) -> Result<Draft, crate::engine::record::RecordError> {
    let fields = || config.headers.recorded_without_body(headers);
    Draft::write(status, fields, None, NO_TRAILERS, declared, tail)
}

/// Classifies the handler's response. It reads the body up to `max` bytes when the response is
/// to be recorded, or in gRPC mode to find the status.
pub(crate) async fn classify<B>(
    config: &Config,
    max: usize,
    tail: usize,
    key: &StoreKey,
    res: Response<B>,
    grpc: bool,
) -> Judged<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    // A rejection of another idempotency layer inside this one (its key in flight, reused, its
    // store down, …) is that layer's answer about its own key, not the work's: never recorded.
    if res.extensions().get::<Rejection>().is_some() {
        tracing::debug!(key = ?key, status = res.status().as_u16(), "a rejection of an inner idempotency layer; released, not recorded");
        return Judged::release(res.map(ResponseBody::passthrough));
    }
    // The handler's own word wins over the status (one extension lookup when there is none).
    let declared = match declared(&res) {
        None => false,
        Some(Verdict::Record) => true,
        Some(Verdict::Hold) => {
            tracing::debug!(key = ?key, status = res.status().as_u16(), "declared hold");
            return Judged::hold(res.map(ResponseBody::passthrough));
        }
        // `Release` and `Fail` (and any verdict added later) free the key.
        Some(_) => {
            tracing::debug!(key = ?key, status = res.status().as_u16(), "declared release; released");
            return Judged::release(res.map(ResponseBody::passthrough));
        }
    };
    // gRPC mode: the outcome is in the gRPC status (a non-200 follows the HTTP table).
    if grpc && res.status() == StatusCode::OK {
        classify_grpc(config, max, tail, key, res, declared).await
    } else {
        classify_http(config, max, tail, key, res, declared).await
    }
}

/// HTTP mode: a recordable response's body is read up to the record limit and the collection
/// bound. A body read whole is recorded, then sent. Its bytes are recorded only in full mode.
/// A streaming media type, a longer body or a slower one is sent on as it comes. It is
/// recorded as status and headers once it has ended. A declared response is
/// recorded whatever its status, but 304, without asking the hook. Its body may not be
/// recordable whole: a streaming type, over the limit, slower than the bound, or failing while
/// read. Then its status and headers are recorded at once, whatever the body does after. The
/// work is done, and a retry must be answered, never run again.
async fn classify_http<B>(
    config: &Config,
    max: usize,
    tail: usize,
    key: &StoreKey,
    res: Response<B>,
    declared: bool,
) -> Judged<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let status = res.status().as_u16();
    let recordable = if declared {
        is_recordable_declared(status)
    } else {
        is_recordable(status)
    };
    if !recordable {
        return Judged::release(res.map(ResponseBody::passthrough));
    }
    let (parts, body) = res.into_parts();
    if !declared && let Some(hook) = &config.classify_fn {
        match hook.classify(&parts) {
            Verdict::Record => {}
            Verdict::Hold => {
                tracing::debug!(key = ?key, status, "held by the classification hook");
                return Judged::hold(Response::from_parts(parts, ResponseBody::passthrough(body)));
            }
            _ => {
                tracing::debug!(key = ?key, status, "released by the classification hook");
                return Judged::release(Response::from_parts(
                    parts,
                    ResponseBody::passthrough(body),
                ));
            }
        }
    }
    let full = config.response_mode == ResponseMode::Full;
    // The record carries the declaration only where the table would not record the status,
    // so a flipped flag on any other record is refused at replay.
    let flagged = declared && !is_recordable(status);
    // A body that goes out as it comes: recorded once it has ended, or at once when declared
    // (its end, a failure or the client leaving must not free or lapse the key).
    let at_end = if declared {
        Judged::record
    } else {
        Judged::record_at_end
    };
    let over_limit = || {
        if full {
            tracing::warn!(key = ?key, "response body over the record limit; recording status and headers only");
        }
    };
    // A body with nothing to send is read at once (a streamed empty body may not be polled).
    let empty = body.is_end_stream() || body.size_hint().exact() == Some(0);
    if !empty && config.is_streaming(&parts.headers) {
        tracing::debug!(key = ?key, "streaming response; sent as it comes, recorded as status and headers");
        let written = status_only(config, status, &parts.headers, flagged, tail);
        let res = Response::from_parts(parts, ResponseBody::passthrough(body));
        return keep_unless_written(res, key, written, at_end);
    }
    if body.size_hint().lower() > max as u64 {
        over_limit();
        let written = status_only(config, status, &parts.headers, flagged, tail);
        let res = Response::from_parts(parts, ResponseBody::passthrough(body));
        return keep_unless_written(res, key, written, at_end);
    }
    match collect_limited(body, max, config.streaming.collect_timeout).await {
        Collected::Whole { data, trailers } => {
            let written = if full {
                // Written from the response's own headers, body and trailers: no copies
                // between them and the record.
                let headers = || config.headers.recorded(&parts.headers);
                let kept = trailers
                    .as_ref()
                    .map(|t| || config.headers.recorded_trailers(t));
                Draft::write(status, headers, Some(&data), kept, flagged, tail)
            } else {
                status_only(config, status, &parts.headers, flagged, tail)
            };
            let res = Response::from_parts(parts, ResponseBody::buffered(data, trailers));
            keep_unless_written(res, key, written, Judged::record)
        }
        Collected::TooLarge { prefix, rest } => {
            over_limit();
            let written = status_only(config, status, &parts.headers, flagged, tail);
            let res = Response::from_parts(parts, ResponseBody::prefixed(prefix, rest));
            keep_unless_written(res, key, written, at_end)
        }
        Collected::Slow { prefix, rest } => {
            tracing::info!(key = ?key, timeout = ?config.streaming.collect_timeout, "response body not ended within the collection bound; sent as it comes, recorded as status and headers");
            let written = status_only(config, status, &parts.headers, flagged, tail);
            let res = Response::from_parts(parts, ResponseBody::prefixed(prefix, rest));
            keep_unless_written(res, key, written, at_end)
        }
        Collected::Failed { prefix, error } if declared => {
            tracing::warn!(key = ?key, status, "declared response failed while its body was read; recording status and headers only");
            let written = status_only(config, status, &parts.headers, flagged, tail);
            let res = Response::from_parts(parts, ResponseBody::failed(prefix, error));
            keep_unless_written(res, key, written, Judged::record)
        }
        Collected::Failed { prefix, error } => Judged::release(Response::from_parts(
            parts,
            ResponseBody::failed(prefix, error),
        )),
    }
}

/// A declared gRPC response whose status cannot be read. Its body is over the
/// record limit, slower than the bound, or failed. Nothing a replay could answer with can be
/// recorded, and the work must not run again at once. So the key is held until its lease
/// lapses. Otherwise it is released.
fn unread_grpc<B: Body>(
    key: &StoreKey,
    res: Response<ResponseBody<B>>,
    declared: bool,
    why: &'static str,
) -> Judged<B> {
    if declared {
        tracing::warn!(key = ?key, why, "declared gRPC response whose status cannot be recorded; the key is held for one lease");
        Judged::hold(res)
    } else {
        tracing::info!(key = ?key, why, "gRPC response released, not recorded");
        Judged::release(res)
    }
}

/// gRPC mode, for an HTTP 200 response. Reads the body up to the record limit and finds the
/// gRPC status. Then it records or releases. When declared, it records whatever
/// the status.
async fn classify_grpc<B>(
    config: &Config,
    max: usize,
    tail: usize,
    key: &StoreKey,
    res: Response<B>,
    declared: bool,
) -> Judged<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let (parts, body) = res.into_parts();
    const OVER: &str = "over the record limit";
    if body.size_hint().lower() > max as u64 {
        let res = Response::from_parts(parts, ResponseBody::passthrough(body));
        return unread_grpc(key, res, declared, OVER);
    }
    let (data, trailers) = match collect_limited(body, max, config.streaming.collect_timeout).await
    {
        Collected::Whole { data, trailers } => (data, trailers),
        Collected::TooLarge { prefix, rest } => {
            let res = Response::from_parts(parts, ResponseBody::prefixed(prefix, rest));
            return unread_grpc(key, res, declared, OVER);
        }
        Collected::Slow { prefix, rest } => {
            // As over the limit: the status comes at the end, and an empty stream is no answer.
            let res = Response::from_parts(parts, ResponseBody::prefixed(prefix, rest));
            return unread_grpc(key, res, declared, "not ended within the collection bound");
        }
        Collected::Failed { prefix, error } => {
            let res = Response::from_parts(parts, ResponseBody::failed(prefix, error));
            return unread_grpc(key, res, declared, "failed while read");
        }
    };
    // A Trailers-Only response has its status in the headers (tonic's clients look there first).
    let trailers_only = parts.headers.contains_key(GRPC_STATUS);
    let code = if trailers_only {
        status_of(&parts.headers)
    } else {
        trailers.as_ref().and_then(status_of)
    };
    if !(code.is_some_and(is_recorded_status) || declared && code.is_some()) {
        tracing::debug!(key = ?key, grpc_status = ?code, "gRPC status not recorded");
        return Judged::release(Response::from_parts(
            parts,
            ResponseBody::buffered(data, trailers),
        ));
    }
    let policy = &config.headers;
    // The headers of a Trailers-Only response are its trailers; the status trailers are kept
    // as trailers in either form.
    let kept_trailers = || {
        trailers_only
            .then(|| policy.recorded_trailers_only(&parts.headers))
            .into_iter()
            .flatten()
            .chain(
                trailers
                    .as_ref()
                    .map(|t| policy.recorded_trailers(t))
                    .into_iter()
                    .flatten(),
            )
    };
    // Marked only where the table would not record the code (see `classify_http`).
    let declared = declared && !code.is_some_and(is_recorded_status);
    let status = StatusCode::OK.as_u16();
    let written = if config.response_mode == ResponseMode::Full {
        let headers = || policy.recorded(&parts.headers);
        Draft::write(
            status,
            headers,
            Some(&data),
            Some(kept_trailers),
            declared,
            tail,
        )
    } else {
        let headers = || policy.recorded_without_body(&parts.headers);
        Draft::write(status, headers, None, Some(kept_trailers), declared, tail)
    };
    let res = Response::from_parts(parts, ResponseBody::buffered(data, trailers));
    keep_unless_written(res, key, written, Judged::record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        for s in [
            200, 201, 204, 299, 300, 301, 302, 303, 307, 308, 399, 400, 401, 404, 409, 422, 499,
        ] {
            assert!(is_recordable(s), "{s} is recorded");
        }
        for s in [100, 101, 199, 304, 408, 425, 429, 500, 502, 503, 599] {
            assert!(!is_recordable(s), "{s} is released");
        }
    }

    #[test]
    fn the_validation_preset_releases_400_413_415_422_only() {
        use super::super::config::ValidationClassifier;
        use crate::engine::Classify;
        for s in 200..=499u16 {
            let (parts, ()) = Response::builder()
                .status(s)
                .body(())
                .expect("response")
                .into_parts();
            let expected = if matches!(s, 400 | 413 | 415 | 422) {
                Verdict::Release
            } else {
                Verdict::Record
            };
            assert_eq!(ValidationClassifier.classify(&parts), expected, "{s}");
        }
    }

    #[test]
    fn every_code_is_classified() {
        let recorded = [0, 3, 5, 6, 7, 9, 11, 12, 16];
        for c in 0..=16 {
            assert_eq!(is_recorded_status(c), recorded.contains(&c), "code {c}");
        }
        assert!(!is_recorded_status(-1));
        assert!(!is_recorded_status(17));
    }
}

//! Reading a reply: which statuses, gRPC codes and failures may be retried, and the delay
//! a server asked for in `Retry-After` or `grpc-retry-pushback-ms`.

use super::reply::{Reply, RetryErrorKind};
use crate::protocol::{
    self, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, IN_FLIGHT_CODE, LAYER_CODE_PREFIX, grpc_code,
};
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, StatusCode};
use std::any::Any;
use std::error::Error;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Whether a reply may be retried, after the delay the server asked for if it did. `unrun`
/// says the attempt ran nothing: a repeat cannot run the work twice, even on a server that
/// ignores keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Final,
    Retry {
        after: Option<Duration>,
        unrun: bool,
    },
}

impl Verdict {
    fn retry(after: Option<Duration>, unrun: bool) -> Self {
        Self::Retry { after, unrun }
    }
}

pub(crate) fn classify(reply: &Reply<'_>) -> Verdict {
    match *reply {
        Reply::Failed(RetryErrorKind::Other) => Verdict::Final,
        // Only a failed connect is sure to have sent nothing.
        Reply::Failed(f) => Verdict::retry(None, f == RetryErrorKind::Connect),
        Reply::Response { status, headers } => {
            if status == StatusCode::OK && protocol::is_grpc(headers) {
                classify_grpc(headers)
            } else {
                classify_http(status, headers)
            }
        }
    }
}

/// 408, 425, 429 and 5xx are transient. The exceptions are the 5xx that say the server cannot
/// serve this request at all: 501, 505, 506, 508, 510, 511. A 409 means "in flight, retry
/// later" only when it says when, in `Retry-After`, as the layer's `idempotency.in_flight`
/// does. A 409 without it is an application conflict that a repeat would meet again.
///
/// The 4xx among them refuse the request, so nothing ran. 408: it did not arrive whole. 425:
/// too early to risk. 429: too many. 409: the same key still runs. A 5xx may follow a run: a
/// proxy's 502 or 503 after it forwarded the request, a handler that failed half way.
fn classify_http(status: StatusCode, headers: &HeaderMap) -> Verdict {
    let after = || retry_after(headers, SystemTime::now());
    match status.as_u16() {
        501 | 505 | 506 | 508 | 510 | 511 => Verdict::Final,
        408 | 425 | 429 => Verdict::retry(after(), true),
        409 if headers.contains_key(RETRY_AFTER) => Verdict::retry(after(), true),
        _ if status.is_server_error() => Verdict::retry(after(), false),
        _ => Verdict::Final,
    }
}

/// A gRPC response whose status arrived as headers: Trailers-Only, how servers send an error
/// without messages. A status in the trailers comes with a response that has started. It is
/// final for a retry layer, which has already passed the response on.
///
/// - `UNAVAILABLE`: retried. The server did not run the call, or a retry under the same key
///   is answered from its record.
/// - `ABORTED` with `idempotency.in_flight`: retried after the pushback. Another `ABORTED` is
///   an application conflict.
/// - `RESOURCE_EXHAUSTED` with a pushback: retried. It is the layer's
///   `idempotency.scope_full`; a message over the size limit carries no pushback.
/// - A pushback that is negative or not a number: the server asks not to retry, per gRPC A6.
/// - Everything else is final, `FAILED_PRECONDITION` for `idempotency.key_reused` included.
///
/// A status whose message is the layer's own code, `idempotency.…`, was sent by the layer in
/// place of the call: nothing ran. Any other `UNAVAILABLE` may follow a run.
fn classify_grpc(headers: &HeaderMap) -> Verdict {
    let Some(code) = protocol::status_of(headers) else {
        return Verdict::Final;
    };
    let pushback = match headers.get(GRPC_RETRY_PUSHBACK_MS) {
        None => None,
        Some(v) => match parse_millis(v) {
            Some(d) => Some(d),
            None => return Verdict::Final,
        },
    };
    let message = headers
        .get(GRPC_MESSAGE)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let in_flight = message.starts_with(IN_FLIGHT_CODE.as_bytes());
    let layer = message.starts_with(LAYER_CODE_PREFIX.as_bytes());
    match code {
        grpc_code::UNAVAILABLE => Verdict::retry(pushback, layer),
        grpc_code::ABORTED if in_flight => Verdict::retry(pushback, true),
        grpc_code::RESOURCE_EXHAUSTED if pushback.is_some() => Verdict::retry(pushback, layer),
        _ => Verdict::Final,
    }
}

fn parse_millis(v: &HeaderValue) -> Option<Duration> {
    let s = v.to_str().ok()?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // More digits than a u64 holds: longer than any cap.
    Some(Duration::from_millis(s.parse().unwrap_or(u64::MAX)))
}

/// `Retry-After` as delay-seconds or an IMF-fixdate, such as `Sun, 06 Nov 1994 08:49:37 GMT`.
/// A date in the past is no delay. Anything else is ignored, the obsolete date formats
/// included, and the backoff applies.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let s = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(s.parse().unwrap_or(u64::MAX)));
    }
    let at = UNIX_EPOCH + Duration::from_secs(parse_imf_fixdate(s)?);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Seconds since the Unix epoch of an IMF-fixdate, as RFC 9110 §5.6.7 defines it.
fn parse_imf_fixdate(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 29 || &b[3..5] != b", " || &b[25..] != b" GMT" {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| s.get(8..11) == Some(*m))? + 1;
    let (day, year) = (num(5..7)?, num(12..16)?);
    let (hour, min, sec) = (num(17..19)?, num(20..22)?, num(23..25)?);
    if b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[19] != b':' || b[22] != b':' {
        return None;
    }
    if !(1..=31).contains(&day) || year < 1970 || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let days = days_from_civil(year, u64::try_from(month).ok()?, day);
    Some(days * 86_400 + hour * 3600 + min * 60 + sec)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar, year ≥ 1970.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What an error says about the exchange, read from its chain of sources: I/O error kinds, and
/// the elapsed timers of Tokio and `tower::timeout`. `fallback` when nothing in the chain tells.
pub(crate) fn failure_of(err: &(dyn Error + 'static), fallback: RetryErrorKind) -> RetryErrorKind {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<tokio::time::error::Elapsed>() || e.is::<tower::timeout::error::Elapsed>() {
            return RetryErrorKind::Timeout;
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::AddrNotAvailable
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable => return RetryErrorKind::Connect,
                io::ErrorKind::TimedOut => return RetryErrorKind::Timeout,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::NotConnected => return RetryErrorKind::ConnectionLost,
                _ => {}
            }
        }
        next = e.source();
    }
    fallback
}

/// The failure of a tower stack's error. A client service fails only when no response came.
/// An HTTP error status is a response. So an error of any type is a transport failure. A
/// `tower::BoxError`, as timeouts and buffers produce, or an I/O error is read for its detail.
pub(crate) fn failure_of_any<E: 'static>(err: &E) -> RetryErrorKind {
    let any: &dyn Any = err;
    if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send + Sync>>() {
        return failure_of(&**boxed, RetryErrorKind::Transport);
    }
    if let Some(io) = any.downcast_ref::<io::Error>() {
        return failure_of(io, RetryErrorKind::Transport);
    }
    RetryErrorKind::Transport
}

/// The failure of a client stack's error, as [`failure_of_any`] reads it. `Connect` is kept
/// only when the client says its connect stage failed. An I/O error kind alone cannot tell a
/// refused connect from an error on a connection that had sent the request.
pub(crate) fn attempt_failure_of_any<E: 'static>(err: &E) -> RetryErrorKind {
    match (failure_of_any(err), stage_of_any(err)) {
        (RetryErrorKind::Timeout, _) => RetryErrorKind::Timeout,
        (_, Some(Stage::Connect)) => RetryErrorKind::Connect,
        (RetryErrorKind::Connect, _) => RetryErrorKind::Transport,
        // hyper-util failed past its connect stage: the connection ended mid-exchange.
        (RetryErrorKind::Transport, Some(Stage::Exchange)) => RetryErrorKind::ConnectionLost,
        (f, _) => f,
    }
}

/// Where a client says its error arose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Only the clients of features `tonic` (connect) and `hyper-util` (both) say.
#[cfg_attr(not(feature = "hyper-util"), allow(dead_code))]
enum Stage {
    /// Connecting: nothing was sent.
    Connect,
    /// Sending the request or reading the answer.
    Exchange,
}

/// The stage a client reports in the error. With feature `tonic`, that is tonic's
/// `ConnectError` from a channel's connector. With feature `hyper-util`, it is hyper-util's
/// `is_connect()`.
fn stage_of_any<E: 'static>(err: &E) -> Option<Stage> {
    let any: &dyn Any = err;
    if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send + Sync>>() {
        return stage_of(&**boxed);
    }
    #[cfg(feature = "hyper-util")]
    if let Some(e) = any.downcast_ref::<hyper_util::client::legacy::Error>() {
        return stage_of(e);
    }
    None
}

fn stage_of(err: &(dyn Error + 'static)) -> Option<Stage> {
    let mut next = Some(err);
    while let Some(e) = next {
        #[cfg(feature = "tonic")]
        if e.is::<tonic::ConnectError>() {
            return Some(Stage::Connect);
        }
        #[cfg(feature = "hyper-util")]
        if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            return Some(if h.is_connect() {
                Stage::Connect
            } else {
                Stage::Exchange
            });
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::header::CONTENT_TYPE;

    fn grpc(code: &'static str, extra: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from_static(code));
        for (n, v) in extra {
            h.insert(*n, HeaderValue::from_static(v));
        }
        h
    }

    fn verdict(h: &HeaderMap) -> Verdict {
        classify(&Reply::response(StatusCode::OK, h))
    }

    #[test]
    fn grpc_unavailable_is_retried_after_its_pushback() {
        let h = grpc("14", &[("grpc-retry-pushback-ms", "1000")]);
        assert_eq!(
            verdict(&h),
            Verdict::retry(Some(Duration::from_secs(1)), false)
        );
        assert_eq!(verdict(&grpc("14", &[])), Verdict::retry(None, false));
        let store_failed = grpc("14", &[("grpc-message", "idempotency.store_failed: down")]);
        assert_eq!(
            verdict(&store_failed),
            Verdict::retry(None, true),
            "the layer's own"
        );
    }

    #[test]
    fn grpc_aborted_is_retried_only_when_in_flight() {
        let in_flight = grpc(
            "10",
            &[
                ("grpc-message", "idempotency.in_flight: still running"),
                ("grpc-retry-pushback-ms", "1000"),
            ],
        );
        assert_eq!(
            verdict(&in_flight),
            Verdict::retry(Some(Duration::from_secs(1)), true)
        );
        let conflict = grpc("10", &[("grpc-message", "transaction aborted")]);
        assert_eq!(verdict(&conflict), Verdict::Final);
    }

    #[test]
    fn grpc_failed_precondition_for_a_reused_key_is_final() {
        let h = grpc(
            "9",
            &[("grpc-message", "idempotency.key_reused: another request")],
        );
        assert_eq!(verdict(&h), Verdict::Final);
    }

    #[test]
    fn grpc_resource_exhausted_is_retried_only_with_a_pushback() {
        let scope_full = grpc(
            "8",
            &[
                ("grpc-retry-pushback-ms", "500"),
                ("grpc-message", "idempotency.scope_full: too many"),
            ],
        );
        assert_eq!(
            verdict(&scope_full),
            Verdict::retry(Some(Duration::from_millis(500)), true)
        );
        assert_eq!(verdict(&grpc("8", &[])), Verdict::Final);
    }

    #[test]
    fn grpc_caller_errors_and_ok_are_final() {
        for code in [
            "0", "3", "5", "6", "7", "9", "11", "12", "16", "2", "13", "4", "99",
        ] {
            assert_eq!(
                verdict(&grpc(code, &[])),
                Verdict::Final,
                "grpc-status {code}"
            );
        }
        let mut no_status = HeaderMap::new();
        no_status.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        assert_eq!(
            verdict(&no_status),
            Verdict::Final,
            "status in the trailers"
        );
    }

    #[test]
    fn a_negative_or_broken_pushback_means_do_not_retry() {
        for bad in ["-1", "soon", ""] {
            let h = grpc("14", &[("grpc-retry-pushback-ms", bad)]);
            assert_eq!(verdict(&h), Verdict::Final, "pushback {bad:?}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_static(v));
            retry_after(&h, now)
        };
        assert_eq!(with("3"), Some(Duration::from_secs(3)));
        assert_eq!(
            with("Sun, 06 Nov 1994 08:50:07 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(with("Sun, 06 Nov 1994 08:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(with("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(with("-1"), None);
        assert_eq!(
            with("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_imf_fixdate("Thu, 29 Feb 2024 23:59:59 GMT"),
            Some(1_709_251_199)
        );
    }

    #[test]
    fn io_errors_are_told_apart() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            failure_of(&refused, RetryErrorKind::Other),
            RetryErrorKind::Connect
        );
        let reset: tower::BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(failure_of_any(&reset), RetryErrorKind::ConnectionLost);
        let elapsed: tower::BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(failure_of_any(&elapsed), RetryErrorKind::Timeout);
        let other: tower::BoxError = "an unknown failure".into();
        assert_eq!(failure_of_any(&other), RetryErrorKind::Transport);
        assert_eq!(failure_of_any(&42_u8), RetryErrorKind::Transport);
    }

    #[test]
    fn a_refused_io_error_alone_does_not_prove_a_failed_connect() {
        let refused: tower::BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(attempt_failure_of_any(&refused), RetryErrorKind::Transport);
        let elapsed: tower::BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(attempt_failure_of_any(&elapsed), RetryErrorKind::Timeout);
    }

    #[test]
    fn only_the_idempotency_layers_own_answers_and_refusals_show_nothing_ran() {
        let none = HeaderMap::new();
        let http = |status: u16, h: &HeaderMap| {
            classify(&Reply::response(StatusCode::from_u16(status).unwrap(), h))
        };
        for s in [408, 425, 429] {
            assert_eq!(http(s, &none), Verdict::retry(None, true), "{s}");
        }
        let mut ra = HeaderMap::new();
        ra.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        assert_eq!(
            http(409, &ra),
            Verdict::retry(Some(Duration::from_secs(1)), true)
        );
        for s in [500, 502, 503, 504, 520] {
            assert_eq!(
                http(s, &none),
                Verdict::retry(None, false),
                "{s} may follow a run"
            );
        }
        for s in [501, 505, 506, 508, 510, 511] {
            assert_eq!(http(s, &none), Verdict::Final, "{s} is permanent");
        }
        let connect = classify(&Reply::Failed(RetryErrorKind::Connect));
        assert_eq!(connect, Verdict::retry(None, true));
        for f in [
            RetryErrorKind::Timeout,
            RetryErrorKind::ConnectionLost,
            RetryErrorKind::Transport,
        ] {
            assert_eq!(
                classify(&Reply::Failed(f)),
                Verdict::retry(None, false),
                "{f:?}"
            );
        }
    }
}

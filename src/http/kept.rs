//! Telling the client how long the key's record is kept, and how old a replayed one is
//! ([`IdempotencyLayer::record_times`](super::IdempotencyLayer::record_times), off by default).
//!
//! The IETF `Idempotency-Key` draft says a resource should publish how long it keeps keys, but
//! names no header for it; until it does, the headers carry this crate's own prefix, so that
//! a name the draft picks later cannot clash with a meaning of ours.

use crate::engine::record::{Draft, RecordTimes};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::{Duration, SystemTime};

/// Until when the key's record is kept (an HTTP-date), on a recorded response and its replays.
pub const KEPT_UNTIL_HEADER: HeaderName = HeaderName::from_static("tower-idempotency-kept-until");

/// The age of a replayed record in whole seconds (as `Age` counts), on replays. Not `Age`
/// itself: a cache would take that header as its own and judge the response's freshness by it.
pub const RECORD_AGE_HEADER: HeaderName = HeaderName::from_static("tower-idempotency-age");

/// Stamps a record about to be written with its times, and the response that goes out with
/// the time it is kept until.
pub(crate) fn stamp(record: &mut Draft, headers: &mut HeaderMap, ttl: Duration) {
    let times = RecordTimes::new(SystemTime::now(), ttl);
    record.stamp(times);
    headers.insert(KEPT_UNTIL_HEADER, date(times.kept_until));
}

/// Adds the kept-until time and the age of a replayed record (one written with its times).
pub(crate) fn on_replay(headers: &mut HeaderMap, times: Option<RecordTimes>) {
    let Some(times) = times else {
        return;
    };
    headers.insert(KEPT_UNTIL_HEADER, date(times.kept_until));
    // A clock that went back since the record was written gives age 0.
    let age = SystemTime::now()
        .duration_since(times.written_at)
        .map_or(0, |d| d.as_secs());
    headers.insert(RECORD_AGE_HEADER, HeaderValue::from(age));
}

/// The bytes the times add to a record.
pub(crate) const TIMES_LEN: usize = 16;

fn date(t: SystemTime) -> HeaderValue {
    HeaderValue::try_from(httpdate::fmt_http_date(t))
        .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}

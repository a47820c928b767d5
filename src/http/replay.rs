//! How a record becomes a response again. A record is re-validated at every replay, against
//! the *current* header lists and the classification rules: one that fails is refused (503,
//! or `UNAVAILABLE` in gRPC mode) instead of replayed. A record without a body never replays
//! the headers that describe a body ([`REPRESENTATION_HEADERS`](super::REPRESENTATION_HEADERS)).

use super::body::ResponseBody;
use super::classify::{is_recordable, is_recordable_declared, is_recorded_status};
use super::grpc::parse_status;
use super::headers::{GRPC_STATUS, HeaderPolicy, REPLAYED_HEADER, describes_body, is_denied_bytes};
use crate::engine::record::Recorded;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body::Body;

/// Re-validates a record and builds the replayed response (in gRPC mode, for a gRPC
/// request); the reason a record was refused otherwise.
pub(crate) fn replay<B: Body>(
    policy: &HeaderPolicy,
    record: Recorded,
    grpc: bool,
) -> Result<Response<ResponseBody<B>>, &'static str> {
    if grpc {
        replay_grpc(policy, record)
    } else {
        replay_http(policy, record)
    }
}

/// The HTTP replay: stored status, allowed headers, `idempotent-replayed: true`, stored body
/// and trailers.
fn replay_http<B: Body>(
    policy: &HeaderPolicy,
    record: Recorded,
) -> Result<Response<ResponseBody<B>>, &'static str> {
    // A declared record carries the flag only for a status the table would not record: the
    // flag on any other status is a damaged record.
    let recordable = if record.declared {
        is_recordable_declared(record.status) && !is_recordable(record.status)
    } else {
        is_recordable(record.status)
    };
    if !recordable {
        return Err("status is not recordable");
    }
    let status = StatusCode::from_u16(record.status).map_err(|_| "invalid status")?;
    let mut headers = HeaderMap::with_capacity(record.headers.len() + 1);
    let bodiless = record.body.is_none();
    for (name, value) in record.headers {
        // The allow list never holds a denied header: finding the name there is the whole
        // check, and gives the parsed name.
        let Some(allowed) = policy.allowed_name(&name) else {
            return Err("header not on the allow list");
        };
        // A record without a body (one written before such headers were dropped) does not
        // replay the headers that describe a body.
        if bodiless && describes_body(&name) {
            continue;
        }
        headers.append(allowed.clone(), to_value(value)?);
    }
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    let trailers = match record.trailers {
        None => None,
        Some(fields) => {
            let mut t = HeaderMap::with_capacity(fields.len());
            for (name, value) in fields {
                if is_denied_bytes(&name) {
                    return Err("denied trailer");
                }
                if !policy.allows_trailer(&name) {
                    return Err("trailer not on the allow list");
                }
                t.append(to_name(&name)?, to_value(value)?);
            }
            Some(t)
        }
    };
    let mut res = Response::new(ResponseBody::buffered(
        record.body.unwrap_or_default(),
        trailers,
    ));
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    Ok(res)
}

/// The gRPC replay: the HTTP re-validation, plus a recorded 200 must carry a recorded
/// `grpc-status`. A record without messages is sent Trailers-Only.
fn replay_grpc<B: Body>(
    policy: &HeaderPolicy,
    mut record: Recorded,
) -> Result<Response<ResponseBody<B>>, &'static str> {
    if record.status == StatusCode::OK.as_u16() {
        // The flag of a declared 200 is about its gRPC code, checked here, not its status.
        let declared = std::mem::take(&mut record.declared);
        let code = record
            .trailers
            .iter()
            .flatten()
            .chain(&record.headers)
            .find(|(n, _)| n.as_ref() == GRPC_STATUS.as_str().as_bytes())
            .and_then(|(_, v)| parse_status(v));
        match code {
            Some(c) if declared != is_recorded_status(c) => {}
            Some(_) if declared => return Err("needless declared flag"),
            Some(_) => return Err("gRPC status is not recordable"),
            None => return Err("gRPC status missing"),
        }
    }
    let trailers_only = record.body.as_ref().is_none_or(Bytes::is_empty);
    let mut res = replay_http(policy, record)?;
    if trailers_only
        && res.status() == StatusCode::OK
        && let Some(trailers) = res.body_mut().take_trailers()
    {
        let headers = res.headers_mut();
        for (name, value) in &trailers {
            headers.append(name.clone(), value.clone());
        }
    }
    Ok(res)
}

fn to_name(name: &[u8]) -> Result<HeaderName, &'static str> {
    HeaderName::from_bytes(name).map_err(|_| "invalid header name")
}

fn to_value(value: Bytes) -> Result<HeaderValue, &'static str> {
    HeaderValue::from_maybe_shared(value).map_err(|_| "invalid header value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::Field;

    fn f(name: &'static str, value: &'static str) -> Field {
        (
            Bytes::from_static(name.as_bytes()),
            Bytes::from_static(value.as_bytes()),
        )
    }

    fn grpc_record(body: Option<&'static [u8]>, trailers: Vec<Field>) -> Recorded {
        Recorded::new(
            200,
            vec![f("content-type", "application/grpc")],
            body.map(Bytes::from_static),
        )
        .with_trailers(trailers)
    }

    type Res = Response<ResponseBody<http_body_util::Empty<Bytes>>>;

    fn replayed(record: Recorded) -> Result<Res, &'static str> {
        replay(&HeaderPolicy::default(), record, true)
    }

    #[test]
    fn a_5xx_record_is_replayed_only_when_declared() {
        let record = || Recorded::new(500, vec![], Some(Bytes::from_static(b"charged")));
        let http = |r| replay::<http_body_util::Empty<Bytes>>(&HeaderPolicy::default(), r, false);
        assert!(
            http(record()).is_err(),
            "an undeclared 500 is never replayed"
        );
        let res = http(record().declared()).expect("a declared 500 is replayed");
        assert_eq!(res.status(), 500);
        assert!(
            http(Recorded::new(304, vec![], None).declared()).is_err(),
            "a 304 never"
        );
        assert!(
            http(Recorded::new(201, vec![], None).declared()).is_err(),
            "a flag the status does not need is a damaged record"
        );
        // gRPC: a declared `INTERNAL` is replayed, an undeclared one is not.
        let internal = || grpc_record(None, vec![f("grpc-status", "13")]);
        assert!(replayed(internal()).is_err());
        assert!(replayed(internal().declared()).is_ok());
        let ok = || grpc_record(None, vec![f("grpc-status", "0")]);
        assert!(replayed(ok().declared()).is_err(), "a needless flag");
    }

    #[test]
    fn a_replay_needs_a_recorded_grpc_status() {
        let frame: &'static [u8] = b"\0\0\0\0\0";
        let res = replayed(grpc_record(Some(frame), vec![f("grpc-status", "0")])).expect("ok");
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        assert!(
            !res.headers().contains_key("grpc-status"),
            "sent as a trailer"
        );
        for (trailers, reason) in [
            (
                vec![f("grpc-status", "14")],
                "gRPC status is not recordable",
            ),
            (vec![f("grpc-status", "x")], "gRPC status missing"),
            (vec![f("x-other", "1")], "gRPC status missing"),
        ] {
            let err = replayed(grpc_record(Some(frame), trailers)).expect_err(reason);
            assert_eq!(err, reason);
        }
        let no_trailers = Recorded::new(200, vec![], Some(Bytes::from_static(frame)));
        assert_eq!(
            replayed(no_trailers).expect_err("missing"),
            "gRPC status missing"
        );
        // A non-200 recorded under the HTTP table replays as in HTTP mode.
        let http_404 = Recorded::new(404, vec![], Some(Bytes::from_static(b"gone")));
        assert_eq!(
            replayed(http_404).expect("404").status(),
            StatusCode::NOT_FOUND
        );
        // The deny list still applies to trailers.
        let denied = grpc_record(None, vec![f("grpc-status", "3"), f("set-cookie", "a=b")]);
        assert_eq!(replayed(denied).expect_err("denied"), "denied trailer");
    }

    #[test]
    fn a_replay_without_messages_is_trailers_only() {
        let record = || {
            grpc_record(
                None,
                vec![
                    f("grpc-status", "3"),
                    f("grpc-message", "bad%20quantity"),
                    f("x-field", "quantity"),
                ],
            )
        };
        // Trailers pass the current allow list (the gRPC status trailers always do).
        assert_eq!(
            replayed(record()).expect_err("x-field is not allowed"),
            "trailer not on the allow list"
        );
        let mut policy = HeaderPolicy::default();
        assert!(policy.allow(HeaderName::from_static("x-field")));
        let res: Res = replay(&policy, record(), true).expect("replay");
        let h = res.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "3");
        assert_eq!(h["grpc-message"], "bad%20quantity");
        assert_eq!(h["x-field"], "quantity");
        assert_eq!(h["idempotent-replayed"], "true");
        assert!(res.body().is_end_stream(), "no body, no trailers left");
    }
}

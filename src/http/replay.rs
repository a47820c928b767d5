//! How a record becomes a response again. A record is re-validated at every replay, against
//! the *current* header lists and the classification rules: one that fails is refused (503)
//! instead of replayed.

use super::body::ResponseBody;
use super::headers::{HeaderPolicy, REPLAYED_HEADER, is_denied_bytes};
use crate::record::StoredResponse;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body::Body;

/// Whether a response with this status is recorded: 2xx, and 4xx except 408, 425 and 429.
pub(crate) fn is_recordable(status: u16) -> bool {
    matches!(status, 200..=299)
        || (matches!(status, 400..=499) && !matches!(status, 408 | 425 | 429))
}

impl HeaderPolicy {
    /// Re-validates a record against the current rules and builds the replayed response.
    pub(crate) fn replay<B: Body>(
        &self,
        record: StoredResponse,
    ) -> Result<Response<ResponseBody<B>>, &'static str> {
        if !is_recordable(record.status) {
            return Err("status is not recordable");
        }
        let status = StatusCode::from_u16(record.status).map_err(|_| "invalid status")?;
        let mut headers = HeaderMap::with_capacity(record.headers.len() + 1);
        for (name, value) in record.headers {
            if is_denied_bytes(&name) || !self.allows(&name) {
                return Err("header not on the allow list");
            }
            headers.append(to_name(&name)?, to_value(value)?);
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

    #[test]
    fn classification_table() {
        for s in [200, 201, 204, 299, 400, 401, 404, 409, 422, 499] {
            assert!(is_recordable(s), "{s} is recorded");
        }
        for s in [100, 101, 199, 300, 304, 408, 425, 429, 500, 502, 503, 599] {
            assert!(!is_recordable(s), "{s} is released");
        }
    }
}

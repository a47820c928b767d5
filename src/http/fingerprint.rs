//! What the fingerprint covers, when the defaults (method, path, raw query, content-type, body
//! bytes) do not fit: fields of a JSON body left out or picked, the route template instead of
//! the path, request headers, the query in any order.
//!
//! Users of idempotency libraries ask for these when a retry differs from the first attempt in
//! ways that do not change the request's meaning: a timestamp or nonce rotated per attempt, a
//! credential refreshed in the body, a client that orders query parameters at random. Each
//! option is off by default; the defaults are unchanged.

use crate::engine::fingerprint::Fingerprint;
use crate::json::{JsonField, is_json};
use bytes::Bytes;
use http::HeaderName;
use http::request::Parts;

/// Tells these fingerprints apart from the default one (never equal by accident).
const SPEC_TAG: &[u8] = b"fingerprint-spec/v1";

/// The fingerprint options of one layer; in use once any is set.
#[derive(Clone, Debug, Default)]
pub(crate) struct FingerprintSpec {
    /// JSON pointers whose values alone are fingerprinted (empty: the whole body).
    pub(crate) include: Vec<JsonField>,
    /// JSON pointers left out of the fingerprint.
    pub(crate) exclude: Vec<JsonField>,
    /// The route template (axum's `MatchedPath`) instead of the path.
    #[cfg(feature = "axum")]
    pub(crate) route_template: bool,
    /// Request headers fingerprinted too, in this order.
    pub(crate) headers: Vec<HeaderName>,
    /// The query's parameters sorted, so their order does not count.
    pub(crate) canonical_query: bool,
}

impl FingerprintSpec {
    /// SHA-256 over the tag, method, path (or template), query (raw or sorted), content-type,
    /// the chosen headers, and the body (filtered by value when it is JSON and pointers are
    /// set, by value when `json_by_value`, else its bytes).
    pub(crate) fn fingerprint(
        &self,
        parts: &Parts,
        body: &Bytes,
        content_type: &[u8],
        json_by_value: bool,
    ) -> Fingerprint {
        let mut fp = Fingerprint::builder()
            .field(SPEC_TAG)
            .field(parts.method.as_str().as_bytes())
            .field(self.path(parts).as_bytes());
        let query = parts.uri.query().unwrap_or_default();
        fp = if self.canonical_query {
            let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
            pairs.sort_unstable();
            pairs
                .iter()
                .fold(fp.field(&(pairs.len() as u64).to_be_bytes()), |fp, p| {
                    fp.field(p.as_bytes())
                })
        } else {
            fp.field(query.as_bytes())
        };
        fp = fp.field(content_type);
        for name in &self.headers {
            let values = parts.headers.get_all(name);
            let count = values.iter().count() as u64;
            fp = fp
                .field(name.as_str().as_bytes())
                .field(&count.to_be_bytes());
            for v in values {
                fp = fp.field(v.as_bytes());
            }
        }
        let filtered = !self.include.is_empty() || !self.exclude.is_empty();
        if is_json(content_type) && filtered {
            fp.json_filtered(body, &self.include, &self.exclude)
                .finish()
        } else if is_json(content_type) && json_by_value {
            fp.json_value(body).finish()
        } else {
            fp.field(body).finish()
        }
    }

    #[cfg(feature = "axum")]
    fn path<'p>(&self, parts: &'p Parts) -> &'p str {
        if self.route_template {
            if let Some(m) = parts.extensions.get::<axum::extract::MatchedPath>() {
                return m.as_str();
            }
            no_template();
        }
        parts.uri.path()
    }

    #[cfg(not(feature = "axum"))]
    fn path<'p>(&self, parts: &'p Parts) -> &'p str {
        parts.uri.path()
    }
}

/// Warns once that a route template was asked for where axum has not matched the route yet.
#[cfg(feature = "axum")]
fn no_template() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "fingerprint_route_template is on, but the request has no MatchedPath: the layer \
             runs before axum's routing (added with Router::layer). Add it with \
             Router::route_layer or on the route; the path is fingerprinted meanwhile (logged once)"
        );
    }
}

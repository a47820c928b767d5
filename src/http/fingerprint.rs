//! What the fingerprint covers: [`Fingerprinting`], given to
//! [`IdempotencyLayer::fingerprint`](super::IdempotencyLayer::fingerprint).

#[cfg(feature = "json")]
use super::json::{JsonField, is_json};
use crate::store::Fingerprint;
use bytes::Bytes;
use http::HeaderName;
use http::request::Parts;
use std::fmt;
use std::sync::Arc;

/// Tells these fingerprints apart from the default one, so they are never equal by accident.
const SPEC_TAG: &[u8] = b"fingerprint-spec/v1";

pub(crate) type FingerprintFn = Arc<dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync>;

/// What the request fingerprint covers. It tells a retry from another request under one key.
///
/// By default the fingerprint is a SHA-256 over the method, the path, the raw query, the
/// `Content-Type` and the body's bytes. Each option here widens or narrows that. Use them when
/// a retry differs from the first attempt without changing its meaning: a timestamp in the
/// body, a client that orders query parameters at random.
///
/// Changing an option changes the fingerprint of the requests it touches. A retry sent across
/// that change is answered 422.
///
/// ```
/// use http::HeaderName;
/// use tower_idempotency::http::{Fingerprinting, IdempotencyLayer};
///
/// let layer = IdempotencyLayer::default().fingerprint(
///     Fingerprinting::default()
///         .canonical_query(true)
///         .headers([HeaderName::from_static("x-account")]),
/// );
/// ```
#[derive(Clone, Default)]
#[must_use]
pub struct Fingerprinting {
    custom: Option<FingerprintFn>,
    #[cfg(feature = "json")]
    json_by_value: bool,
    /// JSON pointers whose values alone are fingerprinted. Empty means the whole body.
    #[cfg(feature = "json")]
    include: Vec<JsonField>,
    /// JSON pointers left out of the fingerprint.
    #[cfg(feature = "json")]
    exclude: Vec<JsonField>,
    /// The route template, axum's `MatchedPath`, instead of the path.
    #[cfg(feature = "axum")]
    route_template: bool,
    /// Request headers fingerprinted too, in this order.
    headers: Vec<HeaderName>,
    /// The query's parameters sorted, so their order does not count.
    canonical_query: bool,
}

impl fmt::Debug for Fingerprinting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Fingerprinting");
        d.field("custom", &self.custom.is_some());
        #[cfg(feature = "json")]
        d.field("json_by_value", &self.json_by_value)
            .field("include", &self.include)
            .field("exclude", &self.exclude);
        #[cfg(feature = "axum")]
        d.field("route_template", &self.route_template);
        d.field("headers", &self.headers)
            .field("canonical_query", &self.canonical_query)
            .finish()
    }
}

impl Fingerprinting {
    /// The default fingerprint: method, path, raw query, `Content-Type` and body bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Computes the fingerprint with your own function instead. It is given the request head
    /// and the buffered body, and replaces every other option here.
    ///
    /// ```
    /// use tower_idempotency::engine::Fingerprint;
    /// use tower_idempotency::http::Fingerprinting;
    ///
    /// // The path and the body only: the method and query never differ on this route.
    /// let by_path = Fingerprinting::default().custom(|parts, body| {
    ///     Fingerprint::builder().field(parts.uri.path().as_bytes()).field(body).finish()
    /// });
    /// ```
    pub fn custom(
        mut self,
        f: impl Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.custom = Some(Arc::new(f));
        self
    }

    /// Compares a JSON body by its value, not its bytes. Default: off.
    ///
    /// A client library that serialises the body again for a retry then gets a replay, not
    /// 422: `{"item": "book"}` and `{"item":"book"}` are one request. It applies to
    /// `application/json` and `application/*+json` bodies, parameters ignored.
    ///
    /// Whitespace, the order of object members and string escapes are ignored. Everything
    /// else counts: array order, every value and type, and each number's literal text. So
    /// `1`, `1.0` and `1e0` differ. A name repeated in one object keeps its members in order.
    /// A body that does not parse, or nests deeper than 128, is fingerprinted by its bytes.
    ///
    /// The cost is one parse of the body per keyed request. The canonical form is streamed
    /// into the hash, never built whole.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::Request;
    /// use http_body_util::Full;
    /// use std::convert::Infallible;
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    /// use tower_idempotency::http::{Fingerprinting, IdempotencyLayer, Principal};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let layer = IdempotencyLayer::default()
    ///     .fingerprint(Fingerprinting::default().json_by_value(true));
    /// let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req| async {
    ///     Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("created"))))
    /// }));
    /// let request = |body: &'static str| {
    ///     let mut req = Request::post("/orders")
    ///         .header("content-type", "application/json")
    ///         .header("idempotency-key", "order-7")
    ///         .body(Full::new(Bytes::from(body)))
    ///         .unwrap();
    ///     req.extensions_mut().insert(Principal::new("alice"));
    ///     req
    /// };
    /// svc.clone().oneshot(request(r#"{"item": "book", "qty": 1}"#)).await.unwrap();
    /// let again = svc.clone().oneshot(request(r#"{"qty":1,"item":"book"}"#)).await.unwrap();
    /// assert_eq!(again.headers()["idempotent-replayed"], "true");
    /// let other = svc.clone().oneshot(request(r#"{"qty":1.0,"item":"book"}"#)).await.unwrap();
    /// assert_eq!(other.status(), 422);
    /// # });
    /// ```
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn json_by_value(mut self, on: bool) -> Self {
        self.json_by_value = on;
        self
    }

    /// Leaves these fields of a JSON body out of the fingerprint. Default: none.
    ///
    /// Use it for values that change between attempts without changing the request: a
    /// timestamp, a nonce, a refreshed credential. Each field is an RFC 6901 JSON pointer,
    /// such as `/meta/sent_at` or `/items/0`, or a top-level name. In a pointer, `~1` stands
    /// for `/` and `~0` for `~`. The body is then compared by value, as with
    /// [`json_by_value`](Self::json_by_value). Every member of a repeated name goes. A body
    /// that is not JSON is fingerprinted by its bytes.
    ///
    /// # Errors
    /// [`ConfigErrorKind::InvalidName`](crate::ConfigErrorKind::InvalidName) for an empty
    /// name, or a pointer with a `~` not followed by `0` or `1`.
    ///
    /// ```
    /// use tower_idempotency::http::Fingerprinting;
    ///
    /// let options = Fingerprinting::default().json_exclude(["/sent_at", "nonce"]).unwrap();
    /// assert!(Fingerprinting::default().json_exclude([""]).is_err());
    /// ```
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn json_exclude<'a>(
        mut self,
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, crate::ConfigError> {
        self.exclude = json_fields(pointers)?;
        Ok(self)
    }

    /// Fingerprints only these fields of a JSON body. Default: the whole body.
    ///
    /// The values are compared by value, in the order given. An absent field counts as
    /// absent, so anything else in the body may change between attempts. Pointers are written
    /// as for [`json_exclude`](Self::json_exclude), which still applies inside the included
    /// values. A body that is not JSON is fingerprinted by its bytes.
    ///
    /// # Errors
    /// [`ConfigErrorKind::InvalidName`](crate::ConfigErrorKind::InvalidName) for an empty
    /// name or a malformed pointer.
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn json_include<'a>(
        mut self,
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, crate::ConfigError> {
        self.include = json_fields(pointers)?;
        Ok(self)
    }

    /// Fingerprints axum's route template, such as `/orders/{id}`, instead of the request path.
    /// Default: off.
    ///
    /// With a key that names the resource already, `/orders/7` and `/orders/7/` then count as
    /// one request, as does a path a proxy rewrote. Two paths of one route under one key are
    /// then one request too: use it only where the key is unique per resource.
    ///
    /// The template is axum's [`MatchedPath`](axum::extract::MatchedPath), set when it
    /// routes. Add the layer with `Router::route_layer` or on a route. `#[idempotent]`
    /// handlers always see it. A layer added with `Router::layer` runs before routing: it
    /// fingerprints the path, and warns once.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn route_template(mut self, on: bool) -> Self {
        self.route_template = on;
        self
    }

    /// Fingerprints these request headers too. Default: none.
    ///
    /// Their values count in order, and an absent header counts as absent. Use it for a
    /// header that selects what the request acts on, such as `X-Account`.
    pub fn headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.headers = names.into_iter().collect();
        self
    }

    /// Fingerprints the query with its parameters sorted. Default: off, the raw query counts.
    ///
    /// `?a=1&b=2` and `?b=2&a=1` are then one request. Parameters are compared as sent, so
    /// `%41` and `A` differ. A repeated parameter counts each time.
    pub fn canonical_query(mut self, on: bool) -> Self {
        self.canonical_query = on;
        self
    }

    /// Whether an option of the widened fingerprint is on. Then it carries [`SPEC_TAG`].
    fn widened(&self) -> bool {
        #[cfg(feature = "json")]
        let json = !self.include.is_empty() || !self.exclude.is_empty();
        #[cfg(not(feature = "json"))]
        let json = false;
        #[cfg(feature = "axum")]
        let template = self.route_template;
        #[cfg(not(feature = "axum"))]
        let template = false;
        json || template || !self.headers.is_empty() || self.canonical_query
    }

    /// The fingerprint of a request with this head and buffered body.
    pub(crate) fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        if let Some(f) = &self.custom {
            return f(parts, body);
        }
        let content_type = content_type(&parts.headers);
        if self.widened() {
            return self.widened_fingerprint(parts, body, content_type);
        }
        let head = Fingerprint::builder()
            .field(parts.method.as_str().as_bytes())
            .field(parts.uri.path().as_bytes())
            .field(parts.uri.query().unwrap_or_default().as_bytes())
            .field(content_type);
        #[cfg(feature = "json")]
        if self.json_by_value && is_json(content_type) {
            return head.json_value(body).finish();
        }
        head.field(body).finish()
    }

    /// SHA-256 over the tag, method, path or template, raw or sorted query, content-type, the
    /// chosen headers, and the body. A JSON body with pointers set is filtered by value. With
    /// `json_by_value` the body counts by value. Else its bytes count.
    fn widened_fingerprint(&self, parts: &Parts, body: &Bytes, content_type: &[u8]) -> Fingerprint {
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
        #[cfg(feature = "json")]
        if is_json(content_type) {
            if !self.include.is_empty() || !self.exclude.is_empty() {
                return fp
                    .json_filtered(body, &self.include, &self.exclude)
                    .finish();
            }
            if self.json_by_value {
                return fp.json_value(body).finish();
            }
        }
        fp.field(body).finish()
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

fn content_type(headers: &http::HeaderMap) -> &[u8] {
    headers
        .get(http::header::CONTENT_TYPE)
        .map_or(&[][..], |v| v.as_bytes())
}

#[cfg(feature = "json")]
fn json_fields<'a>(
    pointers: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<JsonField>, crate::ConfigError> {
    pointers
        .into_iter()
        .map(|p| {
            JsonField::parse(p).map_err(|reason| {
                crate::ConfigError::new(
                    crate::ConfigErrorKind::InvalidName,
                    format!("`{p}` is not a JSON body field for the fingerprint: {reason}"),
                )
            })
        })
        .collect()
}

/// Warns once that a route template was asked for where axum has not matched the route yet.
#[cfg(feature = "axum")]
fn no_template() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "Fingerprinting::route_template is on, but the request has no MatchedPath: the \
             layer runs before axum's routing (added with Router::layer). Add it with \
             Router::route_layer or on the route; the path is fingerprinted meanwhile (logged once)"
        );
    }
}

//! OpenAPI documents that say a route is idempotent, for [utoipa] 5 (feature `utoipa`) and
//! [aide] 0.15 (feature `aide`).
//!
//! [`IdempotencyDoc`] declares on an operation what the layer adds to it:
//!
//! - the key header (`Idempotency-Key`, or the layer's [`header_name`]), required or optional
//!   as the layer's [`require_key`], with the key's length limit;
//! - each problem+json answer the layer can send under its settings, with the codes it sends
//!   under that status: 400 (`idempotency.key_missing`, …), 401 when a principal is
//!   [required](crate::http::PrincipalMode::Required), 409, 413, 422, 429 and 503, with
//!   `Retry-After` where the layer sends it. They come from [`RejectionKind::ALL`], so the
//!   document holds every case the layer answers;
//! - the replay header, `Idempotent-Replayed`, on every answer the operation declares that
//!   the layer records and so replays: 2xx, 3xx but 304, 4xx but 408, 425 and 429 (with
//!   [`mark_first_runs`], on every 2xx to 5xx answer, as first runs carry it too).
//!
//! A route whose method the layer does not act on (GET, HEAD, OPTIONS and TRACE by default,
//! or those outside its [`methods`]) is passed through without a key: nothing is declared on
//! it.
//!
//! A generated client then knows the route takes a key, and that a retry with the same key
//! is safe. Read the settings from the layer that serves the routes, so the document says
//! what the server does:
//!
//! ```
//! use tower_idempotency::IdempotencyLayer;
//! use tower_idempotency::http::openapi::IdempotencyDoc;
//! use utoipa::openapi::HttpMethod;
//! use utoipa::{Modify, OpenApi};
//!
//! /// Creates an order.
//! #[utoipa::path(post, path = "/orders", responses((status = 201, description = "Created")))]
//! async fn create_order() {}
//!
//! #[derive(OpenApi)]
//! #[openapi(paths(create_order))]
//! struct Api;
//!
//! let layer = IdempotencyLayer::default();
//! let mut api = Api::openapi();
//! IdempotencyDoc::of(&layer).route("/orders", HttpMethod::Post).modify(&mut api);
//!
//! let json = api.to_json().unwrap();
//! assert!(json.contains("Idempotency-Key"));
//! assert!(json.contains("idempotency.key_reused"));
//! assert!(json.contains("Idempotent-Replayed"));
//! ```
//!
//! [`IdempotencyDoc::operation`] declares on one [`Operation`] of your own making instead.
//! A response given as a reference (`$ref`) is left as it is: declare the replay header on the
//! referenced response yourself. A layer that renders its rejections
//! [otherwise](crate::IdempotencyLayer::render_rejection) answers the same statuses, but not
//! with these problem documents: declare its answers yourself.
//!
//! # Routes with settings of their own
//!
//! A route served by an [`#[idempotent]`](crate::idempotent) handler, or by a layer of its own,
//! may differ from the shared layer. Give the doc the route's settings, under the names of the
//! attribute's options:
//!
//! ```
//! use tower_idempotency::http::openapi::IdempotencyDoc;
//! use tower_idempotency::{IdempotencyLayer, IdempotentRoutes, MemoryStore};
//! use utoipa::openapi::HttpMethod;
//! use utoipa::{Modify, OpenApi};
//!
//! /// Sends a receipt; `#[idempotent(require_key = false, mark_first_runs)]` on the handler.
//! #[utoipa::path(post, path = "/receipts", responses((status = 202, description = "Queued")))]
//! async fn send_receipt() {}
//!
//! #[derive(OpenApi)]
//! #[openapi(paths(send_receipt))]
//! struct Api;
//!
//! let routes = IdempotentRoutes::new(IdempotencyLayer::new(MemoryStore::new()));
//! let mut api = Api::openapi();
//! IdempotencyDoc::of(routes.layer())
//!     .require_key(false)
//!     .mark_first_runs(true)
//!     .route("/receipts", HttpMethod::Post)
//!     .modify(&mut api);
//!
//! let json = api.to_json().unwrap();
//! assert!(!json.contains("idempotency.key_missing"));
//! ```
//!
//! # aide
//!
//! With feature `aide`, [`IdempotencyDoc::transform`] declares the same on an aide operation,
//! as the transform of an `ApiRouter` route (`post_with(handler, |op| doc.transform(op))`), and
//! [`IdempotencyDoc::aide_operation`] on an [`aide::openapi::Operation`].
//!
//! [`header_name`]: crate::IdempotencyLayer::header_name
//! [`require_key`]: crate::IdempotencyLayer::require_key
//! [`mark_first_runs`]: crate::IdempotencyLayer::mark_first_runs
//! [`methods`]: crate::IdempotencyLayer::methods
//! [`RejectionKind::ALL`]: crate::http::RejectionKind::ALL
//! [`Operation`]: utoipa::openapi::path::Operation

use super::config::{Config, KeySource, PrincipalMode};
#[cfg(feature = "utoipa")]
use super::headers::REPLAYED_HEADER;
use super::layer::IdempotencyLayer;
use super::rejection::RejectionKind;
use http::{HeaderName, Method, StatusCode};
#[cfg(feature = "utoipa")]
use utoipa::openapi::path::{Operation, Parameter, ParameterIn};
#[cfg(feature = "utoipa")]
use utoipa::openapi::{
    Content, Header, HttpMethod, ObjectBuilder, OpenApi, RefOr, Required, Response, Schema, Type,
};

/// The utoipa this module builds with, to match its version.
#[cfg(feature = "utoipa")]
pub use utoipa;

/// The aide this module builds with, to match its version.
#[cfg(feature = "aide")]
pub use aide;

#[cfg(feature = "aide")]
mod aide_doc;

/// The media type of the layer's rejections.
const PROBLEM_JSON: &str = "application/problem+json";

/// What the layer adds to an operation, to declare in an OpenAPI document: the key header, the
/// problem answers and the replay header. See the [module docs](self).
///
/// As a [`utoipa::Modify`] it declares on each operation listed with
/// [`route`](Self::route); an operation the document does not hold is skipped with a warning.
#[derive(Clone)]
pub struct IdempotencyDoc {
    /// `None` when the layer reads the key with a closure: no header to declare.
    header: Option<HeaderName>,
    required: bool,
    max_key_len: usize,
    max_request_body: usize,
    principal_required: bool,
    fail_open: bool,
    marks_first_runs: bool,
    /// The methods the layer acts on, of those a document names.
    acted_on: Vec<Method>,
    #[cfg(feature = "utoipa")]
    routes: Vec<(String, HttpMethod)>,
}

impl std::fmt::Debug for IdempotencyDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("IdempotencyDoc");
        d.field("header", &self.header)
            .field("required", &self.required)
            .field("max_key_len", &self.max_key_len)
            .field("max_request_body", &self.max_request_body)
            .field("principal_required", &self.principal_required)
            .field("fail_open", &self.fail_open)
            .field("marks_first_runs", &self.marks_first_runs)
            .field("acted_on", &self.acted_on);
        #[cfg(feature = "utoipa")]
        d.field(
            "routes",
            &self
                .routes
                .iter()
                .map(|(p, m)| (p, method_name(m)))
                .collect::<Vec<_>>(),
        );
        d.finish()
    }
}

impl Default for IdempotencyDoc {
    /// The declaration of a layer with the defaults.
    fn default() -> Self {
        Self::of_config(&Config::default())
    }
}

/// One problem answer: its status and the cases the layer answers with it.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) kinds: Vec<RejectionKind>,
}

impl Answer {
    /// Whether the layer may send `Retry-After` with it.
    pub(crate) fn retry_after(&self) -> bool {
        self.kinds.iter().any(|k| k.is_retryable())
    }

    pub(crate) fn codes(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kinds.iter().map(|k| k.code())
    }
}

impl IdempotencyDoc {
    /// The declaration of what `layer` does: its key header, whether the key and a principal
    /// are required, the key's and the body's limits, whether it fails open and whether first
    /// runs are marked. For the routes of an [`IdempotentRoutes`](crate::IdempotentRoutes),
    /// pass its [`layer`](crate::IdempotentRoutes::layer).
    #[must_use]
    pub fn of<St>(layer: &IdempotencyLayer<St>) -> Self {
        Self::of_config(&layer.state.config)
    }

    fn of_config(config: &Config) -> Self {
        Self {
            header: match &config.key_source {
                KeySource::Header(name) => Some(name.clone()),
                KeySource::Fn(_) => None,
            },
            required: config.require_key,
            max_key_len: config.max_key_len,
            max_request_body: config.max_request_body,
            principal_required: config.principal_mode == PrincipalMode::Required,
            fail_open: config.fail_open,
            marks_first_runs: config.mark_first_runs,
            acted_on: acted_on(config),
            #[cfg(feature = "utoipa")]
            routes: Vec::new(),
        }
    }

    /// The same declaration for a route whose key is required or not: as the layer's
    /// [`require_key`](crate::IdempotencyLayer::require_key) and the attribute's
    /// `require_key` option.
    ///
    /// ```
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    ///
    /// let optional = IdempotencyDoc::default().require_key(false);
    /// ```
    #[must_use]
    pub fn require_key(mut self, require: bool) -> Self {
        self.required = require;
        self
    }

    /// The same declaration for a route that reads its key from `name`: as the layer's
    /// [`header_name`](crate::IdempotencyLayer::header_name) and the attribute's
    /// `header_name` option.
    ///
    /// ```
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    ///
    /// let doc = IdempotencyDoc::default().header_name(http::HeaderName::from_static("x-request-id"));
    /// ```
    #[must_use]
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.header = Some(name);
        self
    }

    /// The same declaration for a route whose principal is required or optional: as the
    /// layer's [`principal`](crate::IdempotencyLayer::principal) and the attribute's
    /// `principal` option. Only a required one is answered 401 when missing.
    ///
    /// ```
    /// use tower_idempotency::http::PrincipalMode;
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    ///
    /// let doc = IdempotencyDoc::default().principal(PrincipalMode::Optional);
    /// ```
    #[must_use]
    pub fn principal(mut self, mode: PrincipalMode) -> Self {
        self.principal_required = mode == PrincipalMode::Required;
        self
    }

    /// The same declaration for a route with another body limit, said in the 413 answer: as
    /// the layer's [`max_request_body`](crate::IdempotencyLayer::max_request_body) and the
    /// attribute's `max_request_body` option.
    ///
    /// ```
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    ///
    /// let doc = IdempotencyDoc::default().max_request_body(64 * 1024);
    /// ```
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// The same declaration for a route that marks first runs or not: as the layer's
    /// [`mark_first_runs`](crate::IdempotencyLayer::mark_first_runs) and the attribute's
    /// `mark_first_runs` option.
    ///
    /// ```
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    ///
    /// let doc = IdempotencyDoc::default().mark_first_runs(true);
    /// ```
    #[must_use]
    pub fn mark_first_runs(mut self, on: bool) -> Self {
        self.marks_first_runs = on;
        self
    }

    /// Whether the layer can answer a request with `kind` under these settings. A match with
    /// no catch-all: a new case must be placed here.
    fn sends(&self, kind: RejectionKind) -> bool {
        match kind {
            RejectionKind::KeyMissing => self.required,
            RejectionKind::PrincipalMissing => self.principal_required,
            // A failing store still answers 503 when the layer fails open: an outage runs the
            // request without a claim, but another fault, or an outage met while waiting on
            // a run in flight, does not.
            RejectionKind::KeyInvalid
            | RejectionKind::InFlight
            | RejectionKind::KeyReused
            | RejectionKind::BodyTooLarge
            | RejectionKind::BodyUnreadable
            | RejectionKind::Store
            | RejectionKind::ScopeFull
            | RejectionKind::StoreFull
            | RejectionKind::RecordInvalid => true,
        }
    }

    /// Each status the layer can answer a keyed request with, lowest first, and its cases.
    pub(crate) fn answers(&self) -> Vec<Answer> {
        let mut answers: Vec<Answer> = Vec::new();
        for &kind in RejectionKind::ALL {
            if !self.sends(kind) {
                continue;
            }
            match answers.iter_mut().find(|a| a.status == kind.status()) {
                Some(answer) => answer.kinds.push(kind),
                None => answers.push(Answer {
                    status: kind.status(),
                    kinds: vec![kind],
                }),
            }
        }
        answers.sort_by_key(|a| a.status);
        answers
    }

    /// The description of an answer: each case's code and what it means.
    pub(crate) fn answer_description(&self, answer: &Answer) -> String {
        let mut out = String::from("Answered by the idempotency layer:");
        for &kind in &answer.kinds {
            out.push_str(&format!("\n- `{}`: {}", kind.code(), kind.title()));
            match kind {
                RejectionKind::BodyTooLarge => {
                    out.push_str(&format!(" (over {} bytes)", self.max_request_body));
                }
                RejectionKind::Store if self.fail_open => out.push_str(
                    " (a fault other than an outage: with the store unreachable the request \
                     runs without a claim)",
                ),
                _ => {}
            }
            if kind.is_retryable() {
                out.push_str("; retry after `Retry-After`");
            }
            out.push('.');
        }
        out
    }

    pub(crate) fn key_description(&self) -> String {
        format!(
            "The idempotency key: one unique value per logical request, sent again unchanged on \
             each retry of it. A repeat with the same key and request is answered from the \
             record of the first run. 1 to {} characters of visible ASCII, bare or as a quoted \
             string.",
            self.max_key_len
        )
    }

    /// The replay header's values and description.
    pub(crate) fn replayed(&self) -> (&'static [&'static str], &'static str) {
        if self.marks_first_runs {
            (
                &["true", "false"],
                "`true` when the answer is replayed from the record of the first run with this \
                 key; `false` on the first run's own answer.",
            )
        } else {
            (
                &["true"],
                "`true` when the answer is replayed from the record of the first run with this \
                 key; absent on the first run's own answer.",
            )
        }
    }

    /// Whether an answer of `status` (`201`, or a range such as `2XX`) may carry the replay
    /// header: one the layer records (so replays), or with first runs marked, any the handler
    /// answers.
    pub(crate) fn carries_replay_header(&self, status: &str) -> bool {
        let bytes = status.as_bytes();
        let (class, exact) = match bytes {
            [c @ b'1'..=b'5', b'X' | b'x', b'X' | b'x'] => (c - b'0', None),
            [c @ b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => (c - b'0', status.parse::<u16>().ok()),
            _ => return false,
        };
        if self.marks_first_runs {
            return (2..=5).contains(&class);
        }
        match (class, exact) {
            (2, _) => true,
            (3, code) => code != Some(304),
            (4, code) => !matches!(code, Some(408 | 425 | 429)),
            _ => false,
        }
    }
}

#[cfg(feature = "utoipa")]
impl IdempotencyDoc {
    /// Declares the operation of `method` on `path` (as the document writes it, such as
    /// `/orders/{id}`) when used as a [`utoipa::Modify`]. A method the layer does not act on
    /// is skipped: the layer passes its requests through without a key.
    #[must_use]
    pub fn route(mut self, path: impl Into<String>, method: HttpMethod) -> Self {
        self.routes.push((path.into(), method));
        self
    }

    /// Declares on `operation`: the key header as a parameter (replacing one of the same name),
    /// the problem answers (added beside the operation's own content for those statuses), and
    /// the replay header on each answer it declares that the layer replays (see the
    /// [module docs](self)). It does not know the operation's method: use it only on one the
    /// layer acts on.
    ///
    /// ```
    /// use tower_idempotency::http::openapi::IdempotencyDoc;
    /// use utoipa::openapi::path::Operation;
    /// use utoipa::openapi::{Response, Responses};
    ///
    /// let mut op = Operation::new();
    /// op.responses = Responses::new();
    /// op.responses.responses.insert("201".into(), Response::new("Created").into());
    /// IdempotencyDoc::default().operation(&mut op);
    /// assert!(op.responses.responses.contains_key("422"));
    /// ```
    pub fn operation(&self, operation: &mut Operation) {
        if let Some(header) = &self.header {
            let name = display_name(header);
            let parameters = operation.parameters.get_or_insert_with(Vec::new);
            parameters.retain(|p| {
                !(p.parameter_in == ParameterIn::Header && p.name.eq_ignore_ascii_case(&name))
            });
            parameters.push(self.key_parameter(name));
        }
        let replayed = self.replayed_header();
        for (status, response) in &mut operation.responses.responses {
            if self.carries_replay_header(status)
                && let RefOr::T(response) = response
            {
                response
                    .headers
                    .insert(display_name(&REPLAYED_HEADER), replayed.clone());
            }
        }
        for answer in self.answers() {
            let response = operation
                .responses
                .responses
                .entry(answer.status.as_str().to_owned())
                .or_insert_with(|| Response::new(self.answer_description(&answer)).into());
            if let RefOr::T(response) = response {
                response
                    .content
                    .entry(PROBLEM_JSON.to_owned())
                    .or_insert_with(|| Content::new(Some(problem_schema(&answer))));
                if answer.retry_after() {
                    response
                        .headers
                        .entry("Retry-After".to_owned())
                        .or_insert_with(retry_after_header);
                }
            }
        }
    }

    fn key_parameter(&self, name: String) -> Parameter {
        let mut p = Parameter::new(name);
        p.parameter_in = ParameterIn::Header;
        p.required = if self.required {
            Required::True
        } else {
            Required::False
        };
        p.description = Some(self.key_description());
        p.schema = Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(self.max_key_len))
                .into(),
        );
        p
    }

    fn replayed_header(&self) -> Header {
        let (values, description) = self.replayed();
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(values.iter().copied()))
            .build();
        described(Header::new(schema), description)
    }
}

#[cfg(feature = "utoipa")]
impl utoipa::Modify for IdempotencyDoc {
    fn modify(&self, openapi: &mut OpenApi) {
        for (path, method) in &self.routes {
            if !self.acted_on.contains(&http_method(method)) {
                tracing::warn!(path = %path, method = method_name(method), "the layer does not act on this method: its requests pass through without a key; no idempotency declared");
                continue;
            }
            let operation = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| operation_of(item, method));
            match operation {
                Some(op) => self.operation(op),
                None => {
                    tracing::warn!(path = %path, method = method_name(method), "no such operation in the OpenAPI document; its idempotency is not declared");
                }
            }
        }
    }
}

/// The methods of a document that `config` acts on, as its check order's first step.
fn acted_on(config: &Config) -> Vec<Method> {
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
        Method::HEAD,
        Method::PATCH,
        Method::TRACE,
    ]
    .into_iter()
    .filter(|method| config.applies_to(method))
    .collect()
}

#[cfg(feature = "utoipa")]
fn http_method(method: &HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
        HttpMethod::Options => Method::OPTIONS,
        HttpMethod::Head => Method::HEAD,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Trace => Method::TRACE,
    }
}

#[cfg(feature = "utoipa")]
fn operation_of<'a>(
    item: &'a mut utoipa::openapi::PathItem,
    method: &HttpMethod,
) -> Option<&'a mut Operation> {
    match method {
        HttpMethod::Get => item.get.as_mut(),
        HttpMethod::Post => item.post.as_mut(),
        HttpMethod::Put => item.put.as_mut(),
        HttpMethod::Delete => item.delete.as_mut(),
        HttpMethod::Options => item.options.as_mut(),
        HttpMethod::Head => item.head.as_mut(),
        HttpMethod::Patch => item.patch.as_mut(),
        HttpMethod::Trace => item.trace.as_mut(),
    }
}

/// An RFC 9457 problem document with the crate's `code` field, limited to the answer's codes.
#[cfg(feature = "utoipa")]
fn problem_schema(answer: &Answer) -> Schema {
    let text = || ObjectBuilder::new().schema_type(Type::String);
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("type", text().description(Some("A URI naming the case.")))
        .property("title", text())
        .property("status", ObjectBuilder::new().schema_type(Type::Integer))
        .property("detail", text())
        .property(
            "code",
            text()
                .enum_values(Some(answer.codes()))
                .description(Some("The stable machine code of the case.")),
        )
        .required("status")
        .required("code")
        .into()
}

#[cfg(feature = "utoipa")]
fn retry_after_header() -> Header {
    described(
        Header::new(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .build(),
        ),
        "Seconds to wait before retrying the same request.",
    )
}

#[cfg(feature = "utoipa")]
fn described(mut header: Header, description: &str) -> Header {
    header.description = Some(description.to_owned());
    header
}

#[cfg(feature = "utoipa")]
fn method_name(method: &HttpMethod) -> &'static str {
    match method {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Delete => "DELETE",
        HttpMethod::Options => "OPTIONS",
        HttpMethod::Head => "HEAD",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Trace => "TRACE",
    }
}

/// `idempotency-key` → `Idempotency-Key`: as the drafts and most documents write headers.
fn display_name(name: &HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

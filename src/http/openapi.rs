//! OpenAPI documents that say a route is idempotent, for [utoipa] 5. Feature `utoipa`.
//!
//! [`IdempotencyDoc`] declares on an operation what the layer adds to it:
//!
//! - the key header (`Idempotency-Key`, or the layer's [`header_name`]), required or optional
//!   as the layer's [`require_key`], with the key's length limit;
//! - the problem+json answers 400, 409 (with `Retry-After`) and 422, each with the codes the
//!   layer sends under that status (`idempotency.key_missing`, …);
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
//! referenced response yourself.
//!
//! [`header_name`]: crate::IdempotencyLayer::header_name
//! [`require_key`]: crate::IdempotencyLayer::require_key
//! [`mark_first_runs`]: crate::IdempotencyLayer::mark_first_runs
//! [`methods`]: crate::IdempotencyLayer::methods

use super::config::{Config, KeySource};
use super::headers::{KEY_HEADER, REPLAYED_HEADER};
use super::layer::IdempotencyLayer;
use super::rejection::RejectionKind;
use crate::engine::key::DEFAULT_MAX_KEY_LEN;
use http::{HeaderName, Method};
use utoipa::openapi::path::{Operation, Parameter, ParameterIn};
use utoipa::openapi::{
    Content, Header, HttpMethod, ObjectBuilder, OpenApi, RefOr, Required, Response, Schema, Type,
};

/// The utoipa this module builds with, to match its version.
pub use utoipa;

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
    marks_first_runs: bool,
    /// The methods the layer acts on, of those a document names.
    acted_on: Vec<HttpMethod>,
    routes: Vec<(String, HttpMethod)>,
}

impl std::fmt::Debug for IdempotencyDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyDoc")
            .field("header", &self.header)
            .field("required", &self.required)
            .field("max_key_len", &self.max_key_len)
            .field("marks_first_runs", &self.marks_first_runs)
            .field(
                "acted_on",
                &self.acted_on.iter().map(method_name).collect::<Vec<_>>(),
            )
            .field(
                "routes",
                &self
                    .routes
                    .iter()
                    .map(|(p, m)| (p, method_name(m)))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Default for IdempotencyDoc {
    /// The declaration of a layer with the defaults.
    fn default() -> Self {
        Self {
            header: Some(KEY_HEADER),
            required: true,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            marks_first_runs: false,
            acted_on: acted_on(&Config::default()),
            routes: Vec::new(),
        }
    }
}

impl IdempotencyDoc {
    /// The declaration of what `layer` does: its key header, whether the key is required, the
    /// key's length limit, and whether first runs are marked.
    #[must_use]
    pub fn of<St>(layer: &IdempotencyLayer<St>) -> Self {
        let config = &layer.state.config;
        Self {
            header: match &config.key_source {
                KeySource::Header(name) => Some(name.clone()),
                KeySource::Fn(_) => None,
            },
            required: config.require_key,
            max_key_len: config.max_key_len,
            marks_first_runs: config.mark_first_runs,
            acted_on: acted_on(config),
            routes: Vec::new(),
        }
    }

    /// Declares the operation of `method` on `path` (as the document writes it, such as
    /// `/orders/{id}`) when used as a [`utoipa::Modify`]. A method the layer does not act on
    /// is skipped: the layer passes its requests through without a key.
    #[must_use]
    pub fn route(mut self, path: impl Into<String>, method: HttpMethod) -> Self {
        self.routes.push((path.into(), method));
        self
    }

    /// Declares on `operation`: the key header as a parameter (replacing one of the same name),
    /// the 400, 409 and 422 problem answers (added beside the operation's own content for
    /// those statuses), and the replay header on each answer it declares that the layer
    /// replays (see the [module docs](self)). It does not know the operation's method: use it
    /// only on one the layer acts on.
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
        for (status, description, kinds) in self.rejections() {
            let response = operation
                .responses
                .responses
                .entry(status.to_owned())
                .or_insert_with(|| Response::new(description).into());
            if let RefOr::T(response) = response {
                response
                    .content
                    .entry(PROBLEM_JSON.to_owned())
                    .or_insert_with(|| Content::new(Some(problem_schema(&kinds))));
                if status == "409" {
                    response
                        .headers
                        .entry("Retry-After".to_owned())
                        .or_insert_with(retry_after_header);
                }
            }
        }
    }

    /// Whether an answer of `status` (`201`, or a range such as `2XX`) may carry the replay
    /// header: one the layer records (so replays), or with first runs marked, any the handler
    /// answers.
    fn carries_replay_header(&self, status: &str) -> bool {
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

    fn key_parameter(&self, name: String) -> Parameter {
        let mut p = Parameter::new(name);
        p.parameter_in = ParameterIn::Header;
        p.required = if self.required {
            Required::True
        } else {
            Required::False
        };
        p.description = Some(format!(
            "The idempotency key: one unique value per logical request, sent again unchanged on \
             each retry of it. A repeat with the same key and request is answered from the \
             record of the first run. 1 to {} characters of visible ASCII, bare or as a quoted \
             string.",
            self.max_key_len
        ));
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
        let (values, description): (&[&str], _) = if self.marks_first_runs {
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
        };
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(values.iter().copied()))
            .build();
        described(Header::new(schema), description)
    }

    /// Each status the layer answers a keyed request with, and the codes under it.
    fn rejections(&self) -> [(&'static str, &'static str, Vec<RejectionKind>); 3] {
        let mut bad = Vec::with_capacity(3);
        if self.required {
            bad.push(RejectionKind::KeyMissing);
        }
        bad.extend([RejectionKind::KeyInvalid, RejectionKind::BodyUnreadable]);
        [
            (
                "400",
                "The idempotency key is missing or not valid, or the body could not be read.",
                bad,
            ),
            (
                "409",
                "A request with this key is still running: retry after `Retry-After`.",
                vec![RejectionKind::InFlight],
            ),
            (
                "422",
                "This key was already used for a different request.",
                vec![RejectionKind::KeyReused],
            ),
        ]
    }
}

impl utoipa::Modify for IdempotencyDoc {
    fn modify(&self, openapi: &mut OpenApi) {
        for (path, method) in &self.routes {
            if !self.acted_on.contains(method) {
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
fn acted_on(config: &Config) -> Vec<HttpMethod> {
    [
        (HttpMethod::Get, Method::GET),
        (HttpMethod::Post, Method::POST),
        (HttpMethod::Put, Method::PUT),
        (HttpMethod::Delete, Method::DELETE),
        (HttpMethod::Options, Method::OPTIONS),
        (HttpMethod::Head, Method::HEAD),
        (HttpMethod::Patch, Method::PATCH),
        (HttpMethod::Trace, Method::TRACE),
    ]
    .into_iter()
    .filter(|(_, method)| config.applies_to(method))
    .map(|(doc, _)| doc)
    .collect()
}

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

/// An RFC 9457 problem document with the crate's `code` field, limited to `kinds`' codes.
fn problem_schema(kinds: &[RejectionKind]) -> Schema {
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
                .enum_values(Some(kinds.iter().map(|k| k.code())))
                .description(Some("The stable machine code of the case.")),
        )
        .required("status")
        .required("code")
        .into()
}

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

fn described(mut header: Header, description: &str) -> Header {
    header.description = Some(description.to_owned());
    header
}

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

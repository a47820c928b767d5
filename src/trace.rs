//! The spans every door opens, at the engine's span level: one per request, named
//! `idempotency`, and one per store operation under it, named `idempotency.store`. Their names
//! and fields are documented in the crate docs under `# Tracing`. Change both together.
//!
//! Never put a key, principal or signature in a field: a key is named by its store key's short
//! hash, as the log lines name it.

use tracing::{Level, Span};

/// A span at a level chosen at run time. `tracing` fixes a span's level where it is written,
/// so each level is written once.
macro_rules! span_at {
    ($level:expr, $name:literal, $($fields:tt)*) => {
        match $level {
            ::tracing::Level::ERROR => ::tracing::error_span!($name, $($fields)*),
            ::tracing::Level::WARN => ::tracing::warn_span!($name, $($fields)*),
            ::tracing::Level::INFO => ::tracing::info_span!($name, $($fields)*),
            ::tracing::Level::DEBUG => ::tracing::debug_span!($name, $($fields)*),
            _ => ::tracing::trace_span!($name, $($fields)*),
        }
    };
}

/// A door's span over one request. `outcome`, `result` and `key` are recorded as they are
/// known; the HTTP door adds the OpenTelemetry HTTP fields with [`http_span`].
pub(crate) fn door_span(level: Level, door: &'static str) -> Span {
    span_at!(
        level,
        "idempotency",
        door,
        outcome = tracing::field::Empty,
        result = tracing::field::Empty,
        key = tracing::field::Empty,
    )
}

/// The HTTP and gRPC door's span: the door's fields, and OpenTelemetry's HTTP server fields.
pub(crate) fn http_span(level: Level, door: &'static str, grpc: bool, method: &str) -> Span {
    span_at!(
        level,
        "idempotency",
        door,
        grpc,
        outcome = tracing::field::Empty,
        result = tracing::field::Empty,
        key = tracing::field::Empty,
        http.request.method = method,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    )
}

/// The webhook door's span over a delivery, named `webhook`: it names the sender, and holds
/// the span of the HTTP door that claims the delivery's key.
#[cfg(feature = "webhook")]
pub(crate) fn webhook_span(level: Level, sender: &str) -> Span {
    span_at!(level, "webhook", sender)
}

/// A store operation's span, a child of the current span. Its fields follow OpenTelemetry's
/// database client conventions: `db.system.name`, `db.operation.name`, and `error.type` when
/// it fails, with the store error's kind.
pub(crate) fn store_span(level: Level, store: &'static str, op: &'static str) -> Span {
    span_at!(
        level,
        "idempotency.store",
        otel.kind = "client",
        db.system.name = db_system(store),
        db.operation.name = op,
        idempotency.op = op,
        "error.type" = tracing::field::Empty,
    )
}

/// OpenTelemetry's name for a store's database where it has one; the store's own name else.
fn db_system(store: &'static str) -> &'static str {
    match store {
        "postgres" => "postgresql",
        other => other,
    }
}

/// Names `value` in `field` of the current span, only when that span is a door's own: a
/// request refused or passed on before its claim runs in the caller's span, whose fields,
/// even of the same name, are the application's.
pub(crate) fn record_on_door(field: &'static str, value: &'static str) {
    let span = Span::current();
    if span
        .metadata()
        .is_some_and(|m| m.name() == "idempotency" && m.target() == module_path!())
    {
        span.record(field, value);
    }
}

/// Names the key on a door's span as the log lines name it: its store key's short hash.
pub(crate) fn record_key(span: &Span, key: &crate::store::StoreKey) {
    span.record("key", tracing::field::debug(key));
}

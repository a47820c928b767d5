//! The `#[idempotent]` attribute for axum handlers.
//!
//! Use it through `tower-idempotency` with its `macros` feature (`tower_idempotency::idempotent`):
//! the generated code refers to that crate's hidden support module.

mod expand;
mod options;

use proc_macro::TokenStream;

/// Makes one axum handler idempotent where it is written: a repeat of a request under the same
/// `Idempotency-Key` is answered from the record of the first run instead of running the
/// handler again.
///
/// The handler keeps its name and is routed like any handler (`post(create_payment)`). It runs
/// **the same machinery as [`IdempotencyLayer`]**: the same check order, classification of the
/// handler's response and replay, with the options given in the attribute merged over a shared
/// configuration.
///
/// # The shared configuration: an [`IdempotentRoutes`] request extension
///
/// The store, the principal source, the namespace and the limits come from an
/// [`IdempotentRoutes`] that the router puts into every request's extensions, built from an
/// `IdempotencyLayer` once:
///
/// ```text
/// .layer(Extension(IdempotentRoutes::new(IdempotencyLayer::new(store).namespace("payments"))))
/// ```
///
/// An extension (rather than router state read with `FromRef`) works with any state type and
/// needs no impl. A request that reaches an attributed handler without one is answered `500`
/// with a problem+json body whose detail says "no IdempotentRoutes in the request extensions:
/// add `.layer(Extension(IdempotentRoutes::new(...)))` to the router", and an error is logged;
/// it never panics.
///
/// # What it expands to
///
/// `async fn name(args…) -> Ret { body }` becomes a handler with the same name, visibility,
/// attributes and doc comments that takes the router state (`State<S>`, only when there is
/// one) and the whole `Request`, and returns a `Response`. Its body:
///
/// 1. holds the original function, unchanged, as an inner `async fn`, and a closure that runs
///    its extractors as axum does (every argument but the last from the request parts, the
///    last from the whole request; the first rejection is the answer);
/// 2. holds the attribute's options in a `static`, checked and converted at compile time
///    (durations become milliseconds);
/// 3. reads the [`IdempotentRoutes`] from the request extensions and merges the options over
///    it: a clone with overrides, made once per configuration and route and then cached in the
///    configuration;
/// 4. asks that merged layer what it will do with the request (steps 1–5 of its check order
///    and the declared body length). When it will claim the key, the body is buffered (up to
///    `max_request_body`) and **the extractors run first**, on the buffered request with the
///    key it will be claimed under already in its extensions (so `IdempotencyKey` and
///    `DerivedKey` work). A rejection (malformed JSON → 400, no `content-type` → 415, a
///    `Json<T>` that does not deserialize → 422, …) is answered as axum answers it, without a
///    store call: a request that fails validation leaves its key free, and the corrected
///    request can be sent with the same key;
/// 5. sends the request (the same buffered bytes) once through the merged layer's
///    [`Idempotency`] service (`IdempotencyLayer::layer`) around the inner function called with
///    those arguments: fingerprint, claim, run, classify, record or replay. A request the layer
///    will not claim (a safe method, no key, a key or principal rejection, a request an outer
///    layer claimed) goes through the layer first and is extracted after it, as for any
///    handler.
///
/// So steps 1–9 of the layer's check order, the recording rules and the replay are exactly the
/// layer's; there is no second implementation. The one difference from a layer around a
/// router is the one the reference asks for: the idempotency step runs after validation.
///
/// Under a router that also has an `IdempotencyLayer` over the same store and namespace, the
/// handler passes through the requests that layer already claimed (the layer's settings and
/// record apply, and a warning is logged once): use one or the other on a route. A rejection
/// of the handler's own layer is never recorded by an outer one.
///
/// `S` is the `T` of the handler's own `State<T>` argument; a handler without one gets `()`
/// (its extractors must then work with any state, as the built-in ones do). `state = Type`
/// overrides it: use it when the handler extracts a `FromRef` sub-state but another extractor
/// needs the whole router state, or when it extracts several `State` types.
///
/// # Options
///
/// All are optional. An option not given keeps the shared configuration's setting. The
/// defaults below are those of `IdempotencyLayer` and its engine. `lease`, `retention` and
/// `max_record_body` override the shared engine's settings for this route.
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | `require_key` / `require_key = false` | `true` | refuse a request without a key (400), or pass it through to the handler |
/// | `header_name = "x-key"` | `Idempotency-Key` | the header the key is read from |
/// | `lease = "30s"` | 60 s | how long a claim holds the key; renewed while the handler runs |
/// | `wait_in_flight = "5s"` | 0 (409 at once) | how long a repeat waits for the first run to finish and replays it, before 409 |
/// | `retention = "1h"` | 24 h | how long a completed record is kept |
/// | `response_mode = "full"` or `"status_and_headers"` | `"full"` | `"status_and_headers"` keeps status and allowed headers only (no body at rest; a replay has an empty body) |
/// | `namespace = "payments"` | the shared namespace | the namespace this route's keys live in, replacing the shared one |
/// | `max_record_body = 65536` | 1 MiB | a larger response is recorded as status and headers only |
/// | `max_request_body = 65536` | 1 MiB | a larger request body is refused with 413 |
/// | `principal = "required"` or `"optional"` | `"required"` | 401 without a `Principal`, or all anonymous callers share one scope (pair with `response_mode = "status_and_headers"`) |
/// | `mark_first_runs` / `mark_first_runs = false` | `false` | the handler's answer to a first run carries `Idempotent-Replayed: false` |
/// | `state = Type` | the handler's `State<T>`, else `()` | the router state the handler runs with |
///
/// Durations are string literals: a whole number and a unit, `ms`, `s`, `m`, `h` or `d`
/// (`"1500ms"`, `"30s"`, `"10m"`, `"24h"`, also `"1h30m"`). Byte limits are integer literals.
///
/// As with the layer, only non-safe methods are acted on: on a `get(…)` route the handler
/// just runs.
///
/// # Errors at compile time
///
/// An unknown or repeated option, a malformed duration, header name, response or principal
/// mode, and use on something that is not a handler (a plain `fn`, a method taking `self`, a
/// generic function) are compile errors pointing at the offending tokens. An argument that is
/// not an extractor is reported at its type ("Function argument is not a valid axum
/// extractor"), a return type that is not `IntoResponse` at the return type.
///
/// An associated function (no `self`) works, but its body cannot name `Self`: it becomes an
/// inner function, which does not see the enclosing `impl`.
///
/// # Example
///
// Compiled by the main crate's tests (`tests/macros/ui.rs`), not as a doctest here: a doctest
// would need the main crate, and this crate is published before it.
#[cfg_attr(not(doctest), doc = concat!("```\n", include_str!("doc_example.rs"), "```"))]
///
/// [`IdempotencyLayer`]: https://docs.rs/tower-idempotency/latest/tower_idempotency/http/struct.IdempotencyLayer.html
/// [`IdempotentRoutes`]: https://docs.rs/tower-idempotency/latest/tower_idempotency/http/route/struct.IdempotentRoutes.html
/// [`Idempotency`]: https://docs.rs/tower-idempotency/latest/tower_idempotency/http/struct.Idempotency.html
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let options = match syn::parse::<options::Options>(attr) {
        Ok(o) => o,
        Err(e) => return with_item(e, item),
    };
    let function = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(f) => f,
        Err(e) => return with_item(e, item),
    };
    match expand::expand(options, function) {
        Ok(tokens) => tokens.into(),
        Err(e) => with_item(e, item),
    }
}

/// The error, followed by the item unchanged, so its uses do not add errors of their own.
fn with_item(error: syn::Error, item: TokenStream) -> TokenStream {
    let mut out: TokenStream = error.into_compile_error().into();
    out.extend(item);
    out
}

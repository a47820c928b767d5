//! Feature `utoipa`: a document derived with utoipa's `OpenApi`, with the routes' idempotency
//! declared from their layers, and checked against what the layer answers.
#![cfg(feature = "utoipa")]
#![allow(clippy::unwrap_used)]

use crate::support::http::{RequestExt, SpyStore, eventually, send, server_with};
use serde_json::Value;
use std::time::Duration;
use tower_idempotency::http::openapi::IdempotencyDoc;
use tower_idempotency::http::{PrincipalMode, RejectionKind};
use tower_idempotency::{IdempotencyLayer, MemoryStore};
use utoipa::openapi::HttpMethod;
use utoipa::{Modify, OpenApi};

/// Does the work.
#[utoipa::path(post, path = "/work", responses((status = 201, description = "Done")))]
#[allow(dead_code)]
async fn work() {}

/// Does the work when a key is sent.
#[utoipa::path(
    post,
    path = "/maybe",
    responses((status = 200, description = "Done"), (status = 400, description = "Bad input"))
)]
#[allow(dead_code)]
async fn maybe() {}

/// Reads the work.
#[utoipa::path(get, path = "/work", responses((status = 200, description = "The work")))]
#[allow(dead_code)]
async fn read_work() {}

/// Does the work, answering a redirect or a client error of its own.
#[utoipa::path(
    put,
    path = "/work",
    responses(
        (status = 200, description = "Done"),
        (status = 303, description = "Done before, see there"),
        (status = 404, description = "No such work"),
        (status = 500, description = "Failed")
    )
)]
#[allow(dead_code)]
async fn put_work() {}

#[derive(OpenApi)]
#[openapi(paths(work, maybe))]
struct Api;

#[derive(OpenApi)]
#[openapi(paths(read_work, put_work))]
struct MoreApi;

fn document(required: &IdempotencyLayer, optional: &IdempotencyLayer) -> Value {
    let mut api = Api::openapi();
    IdempotencyDoc::of(required)
        .route("/work", HttpMethod::Post)
        .modify(&mut api);
    IdempotencyDoc::of(optional)
        .route("/maybe", HttpMethod::Post)
        // Not in the document: skipped.
        .route("/absent", HttpMethod::Post)
        .modify(&mut api);
    serde_json::from_str(&api.to_json().unwrap()).unwrap()
}

fn codes(op: &Value, status: &str) -> Vec<String> {
    op["responses"][status]["content"]["application/problem+json"]["schema"]["properties"]
        ["code"]["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("codes of {status}: {op}"))
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

fn parameter<'a>(op: &'a Value, name: &str) -> &'a Value {
    op["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no parameter {name}: {op}"))
}

#[test]
fn a_generated_document_declares_the_key_header_the_problem_answers_and_the_replay_header() {
    let required = IdempotencyLayer::default();
    let optional = IdempotencyLayer::default()
        .require_key(false)
        .header_name(http::HeaderName::from_static("x-request-key"))
        .mark_first_runs(true);
    let doc = document(&required, &optional);

    let work = &doc["paths"]["/work"]["post"];
    let key = parameter(work, "Idempotency-Key");
    assert_eq!(key["in"], "header");
    assert_eq!(key["required"], true);
    assert_eq!(key["schema"]["maxLength"], 255);
    assert_eq!(
        codes(work, "400"),
        [
            "idempotency.key_missing",
            "idempotency.key_invalid",
            "idempotency.body_unreadable"
        ]
    );
    assert_eq!(codes(work, "409"), ["idempotency.in_flight"]);
    assert!(work["responses"]["409"]["headers"]["Retry-After"].is_object());
    assert_eq!(codes(work, "422"), ["idempotency.key_reused"]);
    let replayed = &work["responses"]["201"]["headers"]["Idempotent-Replayed"];
    assert_eq!(replayed["schema"]["enum"], serde_json::json!(["true"]));

    let maybe = &doc["paths"]["/maybe"]["post"];
    assert_eq!(parameter(maybe, "X-Request-Key")["required"], false);
    assert_eq!(
        codes(maybe, "400"),
        ["idempotency.key_invalid", "idempotency.body_unreadable"],
        "no key_missing where the key is optional"
    );
    assert_eq!(
        maybe["responses"]["400"]["description"], "Bad input",
        "the operation's own answer is kept, the problem added beside it"
    );
    assert_eq!(
        maybe["responses"]["200"]["headers"]["Idempotent-Replayed"]["schema"]["enum"],
        serde_json::json!(["true", "false"]),
        "first runs are marked on this route"
    );
    assert!(doc["paths"].get("/absent").is_none());
}

/// Every code the layer answers a keyed request with is in the document, under its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_codes_are_what_the_layer_answers() {
    let layer = IdempotencyLayer::default();
    let doc = document(&layer, &IdempotencyLayer::default());
    let work = &doc["paths"]["/work"]["post"];
    let (server, runs) = server_with(layer).await;
    let documented = |a: &crate::support::http::Answer| {
        let status = a.status.as_u16().to_string();
        let code = a.code().unwrap_or_else(|| panic!("{}", a.describe()));
        assert!(
            codes(work, &status).contains(&code),
            "{code} under {status} is documented"
        );
    };

    documented(&send(server.post("/work", "{}").principal("alice")).await);
    documented(
        &send(
            server
                .post("/work", "{}")
                .principal("alice")
                .header("idempotency-key", "a b"),
        )
        .await,
    );
    let first = tokio::spawn(send(
        server
            .post("/work", "{}")
            .principal("alice")
            .key("k")
            .delay_ms(5_000),
    ));
    assert!(eventually(Duration::from_secs(10), || runs.executions() == 1).await);
    documented(&send(server.post("/work", "{}").principal("alice").key("k")).await);
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(
        first.header("idempotent-replayed").is_none(),
        "documented as absent on first runs"
    );
    documented(
        &send(
            server
                .post("/work", "{\"x\":1}")
                .principal("alice")
                .key("k"),
        )
        .await,
    );
    let replay = send(server.post("/work", "{}").principal("alice").key("k")).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
}

/// A method the layer does not act on (GET, by default) passes through without a key: the
/// document declares no key header and no problem answers on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_the_layer_passes_through_is_declared_without_a_key() {
    let layer = IdempotencyLayer::default();
    let mut api = MoreApi::openapi();
    IdempotencyDoc::of(&layer)
        .route("/work", HttpMethod::Get)
        .route("/work", HttpMethod::Put)
        .modify(&mut api);
    let doc: Value = serde_json::from_str(&api.to_json().unwrap()).unwrap();

    let (server, _runs) = server_with(layer).await;
    let read = send(
        server
            .request(reqwest::Method::GET, "/work")
            .principal("alice"),
    )
    .await;
    assert!(
        read.status.is_success() && read.code().is_none(),
        "the handler answered, no key asked: {}",
        read.describe()
    );

    let get = &doc["paths"]["/work"]["get"];
    let declared_key = get["parameters"]
        .as_array()
        .is_some_and(|ps| ps.iter().any(|p| p["name"] == "Idempotency-Key"));
    assert!(!declared_key, "no key declared on GET: {get}");
    assert!(get["responses"].get("400").is_none(), "{get}");
    assert_eq!(
        parameter(&doc["paths"]["/work"]["put"], "Idempotency-Key")["required"],
        true,
        "PUT is acted on"
    );
}

/// A recorded redirect or client error is replayed with `Idempotent-Replayed` as a 2xx is:
/// the document declares the header on every answer the layer records and replays, and not
/// on one it never records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_header_is_declared_on_every_answer_the_layer_replays() {
    let layer = IdempotencyLayer::default();
    let mut api = MoreApi::openapi();
    IdempotencyDoc::of(&layer)
        .route("/work", HttpMethod::Put)
        .modify(&mut api);
    let doc: Value = serde_json::from_str(&api.to_json().unwrap()).unwrap();
    let put = &doc["paths"]["/work"]["put"];

    let (server, _runs) = server_with(layer).await;
    for (status, key) in [(303, "k-303"), (404, "k-404")] {
        let request = || {
            server
                .request(reqwest::Method::PUT, "/work")
                .principal("alice")
                .key(key)
                .respond(status)
        };
        let first = send(request()).await;
        assert_eq!(first.status, status, "{}", first.describe());
        let again = send(request()).await;
        assert_eq!(again.status, status, "{}", again.describe());
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert!(
            put["responses"][status.to_string()]["headers"]["Idempotent-Replayed"].is_object(),
            "the replay header on {status}: {put}"
        );
    }
    assert!(
        put["responses"]["500"]["headers"]
            .get("Idempotent-Replayed")
            .is_none(),
        "a 5xx is never recorded, so never replayed: {put}"
    );
}

/// The document of `doc` on the POST `/work` operation, as JSON.
fn declared(doc: IdempotencyDoc) -> Value {
    let mut api = Api::openapi();
    doc.route("/work", HttpMethod::Post).modify(&mut api);
    let json: Value = serde_json::from_str(&api.to_json().unwrap()).unwrap();
    json["paths"]["/work"]["post"].clone()
}

/// Every case the layer answers by itself is in the document of a layer with the defaults, its
/// code under its status: a new case is declared without touching the document's code.
#[test]
fn every_case_the_layer_answers_is_declared_under_its_status() {
    let work = declared(IdempotencyDoc::of(&IdempotencyLayer::default()));
    for &kind in RejectionKind::ALL {
        let status = kind.status().as_str().to_owned();
        assert!(
            codes(&work, &status).contains(&kind.code().to_owned()),
            "{kind} under {status}: {work}"
        );
        if kind.is_retryable() {
            assert!(
                work["responses"][&status]["headers"]["Retry-After"].is_object(),
                "{kind}: Retry-After on {status}"
            );
        }
    }
    let statuses: Vec<&String> = work["responses"].as_object().unwrap().keys().collect();
    assert_eq!(
        statuses,
        ["201", "400", "401", "409", "413", "422", "429", "503"],
        "the handler's answer and the layer's, no other"
    );
}

/// A case the layer cannot send under its settings is not declared: no `key_missing` where the
/// key is optional, no 401 where the principal is.
#[test]
fn a_case_the_settings_rule_out_is_not_declared() {
    let layer = IdempotencyLayer::default()
        .require_key(false)
        .principal(PrincipalMode::Optional);
    let work = declared(IdempotencyDoc::of(&layer));
    assert!(work["responses"].get("401").is_none(), "{work}");
    assert!(
        !codes(&work, "400").contains(&"idempotency.key_missing".to_owned()),
        "{work}"
    );

    let open = declared(IdempotencyDoc::of(
        &IdempotencyLayer::default().fail_open(true),
    ));
    assert!(
        codes(&open, "503").contains(&"idempotency.store_failed".to_owned()),
        "a fault other than an outage is still answered 503 when failing open"
    );
    let said = open["responses"]["503"]["description"].as_str().unwrap();
    assert!(said.contains("without a claim"), "{said}");
}

/// A route's own settings, given to the doc, declare what a layer with those settings
/// declares: the attribute's options and the layer's setters mean the same.
#[test]
fn a_route_of_its_own_is_declared_as_a_layer_with_its_settings() {
    let shared = IdempotencyLayer::default();
    let header = http::HeaderName::from_static("x-request-key");
    let routed = IdempotencyDoc::of(&shared)
        .require_key(false)
        .header_name(header.clone())
        .principal(PrincipalMode::Optional)
        .max_request_body(64)
        .mark_first_runs(true);
    let layer = IdempotencyLayer::default()
        .require_key(false)
        .header_name(header)
        .principal(PrincipalMode::Optional)
        .max_request_body(64)
        .mark_first_runs(true);
    let work = declared(routed);
    assert_eq!(work, declared(IdempotencyDoc::of(&layer)));
    assert_ne!(
        work,
        declared(IdempotencyDoc::of(&shared)),
        "the route's settings changed the document"
    );
    assert_eq!(parameter(&work, "X-Request-Key")["required"], false);
    let said = work["responses"]["413"]["description"].as_str().unwrap();
    assert!(said.contains("over 64 bytes"), "{said}");
}

/// What the layer answers a request without a principal, with a body over its limit, with its
/// caller's scope full and with its store failing is declared under the status it came with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_statuses_are_those_the_layer_answers() {
    let memory = MemoryStore::builder()
        .max_pending_per_scope(1)
        .build()
        .unwrap();
    let store = SpyStore::over(memory);
    let layer = IdempotencyLayer::new(store.clone()).max_request_body(64);
    let work = declared(IdempotencyDoc::of(&layer));
    let (server, runs) = server_with(layer).await;
    let documented = |a: &crate::support::http::Answer, expected: RejectionKind| {
        assert_eq!(
            a.code(),
            Some(expected.code().to_owned()),
            "{}",
            a.describe()
        );
        let status = a.status.as_u16().to_string();
        assert!(
            codes(&work, &status).contains(&expected.code().to_owned()),
            "{expected} under {status} is documented: {work}"
        );
    };

    documented(
        &send(server.post("/work", "{}").key("no-principal")).await,
        RejectionKind::PrincipalMissing,
    );
    documented(
        &send(
            server
                .post("/work", &"x".repeat(100))
                .principal("alice")
                .key("large"),
        )
        .await,
        RejectionKind::BodyTooLarge,
    );
    let first = tokio::spawn(send(
        server
            .post("/work", "{}")
            .principal("alice")
            .key("held")
            .delay_ms(5_000),
    ));
    assert!(eventually(Duration::from_secs(10), || runs.executions() == 1).await);
    documented(
        &send(server.post("/work", "{}").principal("alice").key("other")).await,
        RejectionKind::ScopeFull,
    );
    assert_eq!(first.await.unwrap().status, 201);
    store.fail_claims(true);
    documented(
        &send(server.post("/work", "{}").principal("bob").key("down")).await,
        RejectionKind::Store,
    );
}

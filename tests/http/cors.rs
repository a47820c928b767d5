//! A browser's view: the replay header on first runs when asked, and a router wrapped in
//! tower-http's `CorsLayer` as the README shows it, read from another origin.

use crate::support::http::{RequestExt, TestServer, Work, send, server_with};
use http::{Method, header};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::http::{KEY_HEADER, REPLAYED_HEADER};

const BODY: &str = r#"{"item":"book"}"#;
const ORIGIN: &str = "https://shop.example";

/// With the defaults a first run carries no replay header; marked, it carries `false`, the
/// replay `true`, and a rejection neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_first_runs_puts_false_on_first_runs_and_nothing_on_rejections() {
    let (plain, _) = server_with(IdempotencyLayer::default()).await;
    let first = send(plain.post("/work", BODY).principal("alice").key("k-1")).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(first.header("idempotent-replayed"), None, "off by default");

    let (marked, work) = server_with(IdempotencyLayer::default().mark_first_runs(true)).await;
    let first = send(marked.post("/work", BODY).principal("alice").key("k-1")).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(first.header("idempotent-replayed"), Some("false"));
    let again = send(marked.post("/work", BODY).principal("alice").key("k-1")).await;
    assert_eq!(
        again.header_all("idempotent-replayed"),
        ["true"],
        "one line"
    );
    assert_eq!(
        again.json(),
        first.json(),
        "the record holds no mark of its own"
    );

    // A failed first run is still a first run; the rejection after another body is neither.
    let failed = send(
        marked
            .post("/work", BODY)
            .principal("alice")
            .key("k-2")
            .respond(503),
    )
    .await;
    assert_eq!(failed.status, 503, "{}", failed.describe());
    assert_eq!(failed.header("idempotent-replayed"), Some("false"));
    let reused = send(marked.post("/work", "{}").principal("alice").key("k-1")).await;
    reused.assert_problem(422, "idempotency.key_reused");
    assert_eq!(reused.header("idempotent-replayed"), None);
    assert_eq!(work.executions(), 2);
}

/// The README's CORS layer: a preflight from another origin is allowed the key header, and
/// every answer exposes the replay header to the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cors_wrapped_router_exposes_the_replay_header() {
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::list([ORIGIN.parse().unwrap()]))
        .allow_methods([Method::POST])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, KEY_HEADER])
        .expose_headers([REPLAYED_HEADER, header::LOCATION, header::RETRY_AFTER]);
    let work = Work::new();
    let app = work
        .app(IdempotencyLayer::default().mark_first_runs(true))
        .layer(cors);
    let server = TestServer::start(app).await;

    let preflight = send(
        server
            .request(Method::OPTIONS, "/work")
            .header("origin", ORIGIN)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type,idempotency-key",
            ),
    )
    .await;
    assert!(preflight.status.is_success(), "{}", preflight.describe());
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some(ORIGIN)
    );
    let allowed = preflight
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(allowed.contains("idempotency-key"), "{allowed:?}");
    assert_eq!(work.executions(), 0, "a preflight runs nothing");

    for replayed in ["false", "true"] {
        let a = send(
            server
                .post("/work", BODY)
                .principal("alice")
                .key("k-cors")
                .header("origin", ORIGIN),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.describe());
        assert_eq!(a.header("idempotent-replayed"), Some(replayed));
        assert_eq!(a.header("access-control-allow-origin"), Some(ORIGIN));
        let exposed = a
            .header("access-control-expose-headers")
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            exposed.contains("idempotent-replayed"),
            "the page can read the replay header: {exposed:?}"
        );
    }
    assert_eq!(work.executions(), 1);
}

use axum::Router;
use axum::extract::{Extension, Query};
use axum::http::HeaderMap;
use axum::routing::post;
use std::collections::HashMap;
use tower_idempotency::{idempotent, IdempotencyLayer, IdempotentRoutes};

#[derive(Clone)]
struct App;

/// No `State` argument: the handler fits a router of any state.
#[idempotent(namespace = "search")]
async fn search(
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: String,
) -> String {
    format!("{} {} {body}", headers.len(), q.len())
}

fn main() {
    let stateless: Router = Router::new().route("/search", post(search));
    let with_state: Router<App> = Router::new().route("/search-with-state", post(search));
    let _app: Router = stateless
        .merge(with_state.with_state(App))
        .layer(Extension(IdempotentRoutes::new(IdempotencyLayer::default())));
}

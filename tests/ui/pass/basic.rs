use axum::Router;
use axum::extract::Extension;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use tower_idempotency::{idempotent, IdempotencyLayer, IdempotentRoutes};

/// Doc comments and attributes stay on the handler.
#[idempotent]
#[allow(clippy::unused_async)]
pub(crate) async fn create_order() -> &'static str {
    "created"
}

#[idempotent]
async fn no_return_type() {}

#[idempotent]
async fn opaque() -> impl IntoResponse {
    (StatusCode::CREATED, "created")
}

struct Api;

impl Api {
    /// An associated function (no `self`) works too.
    #[idempotent]
    async fn create() -> StatusCode {
        StatusCode::ACCEPTED
    }
}

fn main() {
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .route("/nothing", post(no_return_type))
        .route("/opaque", post(opaque))
        .route("/api", post(Api::create))
        .layer(Extension(IdempotentRoutes::new(IdempotencyLayer::default())));
}

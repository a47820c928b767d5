use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use tower_idempotency::{idempotent, IdempotencyLayer, IdempotentRoutes, MemoryStore};

#[derive(Clone)]
struct App;

#[derive(Deserialize)]
struct NewPayment {
    amount: u64,
}

/// Charges once per key.
#[idempotent(require_key, lease = "30s", retention = "1h", response_mode = "status_and_headers")]
async fn create_payment(State(_app): State<App>, Json(p): Json<NewPayment>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("charged {}", p.amount))
}

fn main() {
    let shared = IdempotencyLayer::new(MemoryStore::new()).namespace("payments");
    let _app: Router = Router::new()
        .route("/payments", post(create_payment))
        .layer(Extension(IdempotentRoutes::new(shared)))
        .with_state(App);
}

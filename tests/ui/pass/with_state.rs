use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use tower_idempotency::{idempotent, IdempotencyKey, IdempotencyLayer, IdempotentRoutes};

#[derive(Clone)]
struct App {
    name: String,
}

#[derive(Deserialize)]
struct NewPayment {
    amount: u64,
}

#[idempotent(require_key, lease = "30s", retention = "1h", response_mode = "status_and_headers")]
async fn create_payment(
    State(app): State<App>,
    Path(account): Path<String>,
    key: IdempotencyKey,
    Json(payment): Json<NewPayment>,
) -> (StatusCode, String) {
    let _ = key;
    (
        StatusCode::CREATED,
        format!("{} charged {account} {}", app.name, payment.amount),
    )
}

/// `axum::extract::State` spelled out, and the state bound by name.
#[idempotent]
async fn by_path(app: axum::extract::State<App>) -> String {
    app.name.clone()
}

fn main() {
    let _app: Router = Router::new()
        .route("/accounts/{account}/payments", post(create_payment))
        .route("/by-path", post(by_path))
        .layer(Extension(IdempotentRoutes::new(IdempotencyLayer::default())))
        .with_state(App {
            name: "shop".to_owned(),
        });
}

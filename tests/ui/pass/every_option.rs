use axum::Router;
use axum::extract::{Extension, FromRef, State};
use axum::routing::put;
use tower_idempotency::{idempotent, IdempotencyLayer, IdempotentRoutes, MemoryStore};

#[derive(Clone)]
struct App {
    db: Db,
}

#[derive(Clone)]
struct Db;

impl FromRef<App> for Db {
    fn from_ref(app: &App) -> Self {
        app.db.clone()
    }
}

/// Takes a `FromRef` sub-state; runs with the whole `App` state (`state = App`).
#[idempotent(
    require_key = false,
    header_name = "X-Request-Key",
    lease = "1500ms",
    retention = "1h30m",
    response_mode = "full",
    namespace = "orders",
    max_record_body = 65_536,
    max_request_body = 1024,
    principal = "optional",
    state = App,
)]
async fn update_order(State(_db): State<Db>, body: String) -> String {
    body
}

#[idempotent(
    require_key = true,
    principal = "required",
    response_mode = "status_and_headers",
    lease = "2d",
    retention = "10m"
)]
async fn replace_order() {}

fn main() {
    let config = IdempotentRoutes::new(IdempotencyLayer::new(MemoryStore::new()));
    let _app: Router = Router::new()
        .route("/orders/1", put(update_order))
        .route("/orders/2", put(replace_order))
        .layer(Extension(config))
        .with_state(App { db: Db });
}

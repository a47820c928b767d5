use axum::extract::State;
use tower_idempotency::idempotent;

#[derive(Clone)]
struct Db;
#[derive(Clone)]
struct Mailer;

#[idempotent]
async fn create(State(_db): State<Db>, State(_mail): State<Mailer>) {}

fn main() {}

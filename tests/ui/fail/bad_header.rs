use tower_idempotency::idempotent;

#[idempotent(header = "idempotency key")]
async fn create() {}

fn main() {}

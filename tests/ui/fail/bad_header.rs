use tower_idempotency::idempotent;

#[idempotent(header_name = "idempotency key")]
async fn create() {}

fn main() {}

use tower_idempotency::idempotent;

#[idempotent(required, retries = 3)]
async fn create() {}

fn main() {}

use tower_idempotency::idempotent;

#[idempotent(require_key, retries = 3)]
async fn create() {}

fn main() {}

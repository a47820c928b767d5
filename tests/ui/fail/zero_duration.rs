use tower_idempotency::idempotent;

#[idempotent(ttl = "0s")]
async fn create() {}

fn main() {}

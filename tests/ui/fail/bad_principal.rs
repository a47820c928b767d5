use tower_idempotency::idempotent;

#[idempotent(principal = "anonymous")]
async fn create() {}

fn main() {}

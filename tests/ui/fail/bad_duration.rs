use tower_idempotency::idempotent;

#[idempotent(lease = "30 seconds")]
async fn create() {}

fn main() {}

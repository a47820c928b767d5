use tower_idempotency::idempotent;

#[idempotent(retention = "0s")]
async fn create() {}

fn main() {}

use tower_idempotency::idempotent;

#[idempotent(retention = "1h", lease = "30s", retention = "2h")]
async fn create() {}

fn main() {}

use tower_idempotency::idempotent;

#[idempotent(ttl = "1h", lease = "30s", ttl = "2h")]
async fn create() {}

fn main() {}

use tower_idempotency::idempotent;

#[idempotent(response = "body")]
async fn create() {}

fn main() {}

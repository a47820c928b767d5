use tower_idempotency::idempotent;

#[idempotent(response_mode = "body")]
async fn create() {}

fn main() {}

use tower_idempotency::idempotent;

struct NotAnExtractor;

#[idempotent]
async fn create(_x: NotAnExtractor) {}

fn main() {}

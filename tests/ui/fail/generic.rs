use tower_idempotency::idempotent;

#[idempotent]
async fn create<T: Default>() -> &'static str {
    "created"
}

fn main() {}

use tower_idempotency::idempotent;

#[idempotent]
fn create() -> &'static str {
    "created"
}

fn main() {}

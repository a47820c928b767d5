use tower_idempotency::idempotent;

struct Api;

impl Api {
    #[idempotent]
    async fn create(&self) -> &'static str {
        "created"
    }
}

fn main() {}

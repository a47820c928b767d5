//! A redelivery after a restart, over Redis: a new engine and server over the same Redis
//! answer it from the record the first process wrote.
#![cfg(feature = "redis")]

use crate::app::{Handler, deliver, router};
use crate::sign;
use crate::support::http::TestServer;
use crate::support::redis_server::RedisServer;
use std::sync::Arc;
use tower_idempotency::RedisStore;
use tower_idempotency::engine::Engine;

#[tokio::test]
async fn a_redelivery_after_a_restart_over_redis_is_replayed() {
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let prefix = format!("webhook-restart-{}", std::process::id());
    let deliveries = [
        sign::stripe("evt_restart"),
        sign::github("delivery-restart"),
        sign::standard("msg_restart"),
    ];

    let first = Handler::new();
    let store = RedisStore::connect(&redis.url(), &prefix)
        .await
        .expect("Redis");
    let server = TestServer::start(router(Engine::new(store), Arc::clone(&first))).await;
    let mut answers = Vec::new();
    for delivery in &deliveries {
        let answer = deliver(&server, delivery).await;
        assert_eq!((answer.status, answer.replayed), (200, false), "{answer:?}");
        answers.push(answer);
    }
    server.stop().await;

    // The process restarted: a new connection, engine, server and handler.
    let second = Handler::new();
    let store = RedisStore::connect(&redis.url(), &prefix)
        .await
        .expect("Redis");
    let server = TestServer::start(router(Engine::new(store), Arc::clone(&second))).await;
    for (delivery, first_answer) in deliveries.iter().zip(&answers) {
        let again = deliver(&server, delivery).await;
        assert_eq!(again.status, 200, "{again:?}");
        assert!(again.replayed, "{again:?}");
        assert_eq!(again.body, first_answer.body, "the first process's answer");
    }
    assert_eq!(first.total(), 3, "each event ran once");
    assert_eq!(second.total(), 0, "nothing ran again after the restart");
}

//! Send once: a job that runs twice sends its email once.
//!
//! ```text
//! cargo run --example outbound_mail --features lettre
//! ```
//!
//! Runs with no mail server: lettre's stub transport stands in for SMTP and keeps what it was
//! given. The job sends an invoice (with an attachment) under the key `invoice:2024-017`; it
//! runs twice, as a job queue may run it, and the second run is answered with the receipt of
//! the first. Then a loop over several invoices with a repeat among them, and the same key
//! on another message.
//!
//! To send for real, swap the stub for an SMTP transport. The re-exported lettre has SMTP but
//! no TLS, so `AsyncSmtpTransport::relay` is not in it. Depend on lettre yourself with a TLS
//! feature, `lettre = { version = "0.11", features = ["tokio1-rustls-tls"] }`. Cargo builds
//! one lettre with the features of both, and the mailer takes its transport:
//!
//! ```text
//! let smtp = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::relay("smtp.example.com")?
//!     .credentials(lettre::transport::smtp::authentication::Credentials::new(user, password))
//!     .build();
//! let mailer = LettreSendOnce::new(engine, smtp);
//! ```

use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency::engine::Engine;
use tower_idempotency::outbound::Delivery;
use tower_idempotency::outbound::lettre::LettreSendOnce;
use tower_idempotency::outbound::lettre::lettre::message::header::{
    ContentType, HeaderName, HeaderValue,
};
use tower_idempotency::outbound::lettre::lettre::message::{Attachment, MultiPart, SinglePart};
use tower_idempotency::outbound::lettre::lettre::transport::stub::AsyncStubTransport;
use tower_idempotency::outbound::lettre::lettre::{AsyncTransport, Message};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The job's email, built anew on each run: its `Date` and MIME boundary differ. lettre adds
/// no `Message-ID` (only `message_id(None)` does, a random one per build).
fn invoice(key: &str, to: &str, amount: &str) -> Result<Message, Error> {
    let pdf = format!("%PDF-1.7 invoice for {amount}").into_bytes();
    Ok(Message::builder()
        .from("billing@shop.example".parse()?)
        .to(to.parse()?)
        .subject(format!("Your invoice: {amount}"))
        .raw_header(HeaderValue::new(
            HeaderName::new_from_ascii_str("Idempotency-Key"),
            key.to_owned(),
        ))
        .multipart(
            MultiPart::mixed()
                .singlepart(SinglePart::plain(format!("Amount due: {amount}.")))
                .singlepart(
                    Attachment::new("invoice.pdf".to_owned())
                        .body(pdf, ContentType::parse("application/pdf")?),
                ),
        )?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let stub = AsyncStubTransport::new_ok();
    let engine = Engine::builder(MemoryStore::new())
        .retention(Duration::from_secs(7 * 24 * 3600)) // receipts answer repeats for a week
        .build();
    let mailer = LettreSendOnce::new(engine, stub.clone()).hold(Duration::from_secs(15 * 60)); // an unknown delivery holds its key 15 minutes

    for run in 1..=2 {
        let delivery = mailer
            .send(invoice("invoice:2024-017", "ada@example.com", "€42.00")?)
            .await?;
        let what = match delivery {
            Delivery::Recorded(()) => "sent",
            Delivery::Replayed(()) => "already sent: answered from its receipt",
            Delivery::InFlight => "another send of it is running, or may have gone: not sent again",
            Delivery::Held(_) => "this send may have gone: its key is held",
            _ => "not sent",
        };
        println!("job run {run}: invoice:2024-017 {what}");
    }

    // Many messages: one send each, each under its own key.
    let invoices = [
        ("invoice:2024-018", "bob@example.com", "€7.50"),
        ("invoice:2024-017", "ada@example.com", "€42.00"), // sent before
        ("invoice:2024-018", "bob@example.com", "€7.50"),  // repeated here
    ];
    for (i, (key, to, amount)) in invoices.into_iter().enumerate() {
        let answer = mailer.send(invoice(key, to, amount)?).await?;
        println!(
            "invoice {i}: {}",
            if answer.is_sent() {
                "sent"
            } else {
                "answered from its receipt"
            }
        );
    }

    let reused = mailer
        .send(invoice("invoice:2024-017", "ada@example.com", "€99.00")?)
        .await;
    if let Err(e) = reused {
        println!("another invoice under invoice:2024-017: {e}");
    }

    let sent = stub.messages().await.len();
    println!("the transport was handed {sent} messages");
    assert_eq!(sent, 2, "invoice 017 once, invoice 018 once");
    Ok(())
}

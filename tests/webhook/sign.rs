//! Requests signed the way each sender signs them.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) const STRIPE_SECRET: &str = "whsec_test_stripe_endpoint";
pub(crate) const GITHUB_SECRET: &str = "It's a Secret to Everybody";
pub(crate) const SHOPIFY_SECRET: &str = "shpss_test_secret";
/// Standard Webhooks' published test secret: `whsec_` and base64.
pub(crate) const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn mac(secret: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Seconds since the epoch, now.
pub(crate) fn now() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs();
    i64::try_from(secs).expect("seconds fit")
}

/// One delivery: the path, the headers, the body.
#[derive(Clone, Debug)]
pub(crate) struct Delivery {
    pub(crate) path: &'static str,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: String,
}

/// `Stripe-Signature: t=<t>,v1=<hex of HMAC("{t}.{body}")>` under the `whsec_` string.
pub(crate) fn stripe_at(secret: &str, t: i64, body: &str) -> Delivery {
    let sig = hex(&mac(
        secret.as_bytes(),
        &[t.to_string().as_bytes(), b".", body.as_bytes()],
    ));
    Delivery {
        path: "/webhooks/stripe",
        headers: vec![("stripe-signature", format!("t={t},v1={sig}"))],
        body: body.to_owned(),
    }
}

/// A Stripe event `id`, signed now.
pub(crate) fn stripe(id: &str) -> Delivery {
    stripe_at(STRIPE_SECRET, now(), &stripe_body(id))
}

pub(crate) fn stripe_body(id: &str) -> String {
    format!(r#"{{"id":"{id}","object":"event","type":"invoice.paid"}}"#)
}

/// `X-Hub-Signature-256: sha256=<hex of HMAC(body)>`, the delivery id in `X-GitHub-Delivery`.
pub(crate) fn github_with(secret: &str, delivery: &str, body: &str) -> Delivery {
    let sig = hex(&mac(secret.as_bytes(), &[body.as_bytes()]));
    Delivery {
        path: "/webhooks/github",
        headers: vec![
            ("x-hub-signature-256", format!("sha256={sig}")),
            ("x-github-delivery", delivery.to_owned()),
            ("x-github-event", "push".to_owned()),
        ],
        body: body.to_owned(),
    }
}

pub(crate) fn github(delivery: &str) -> Delivery {
    github_with(GITHUB_SECRET, delivery, r#"{"ref":"refs/heads/main"}"#)
}

/// `X-Shopify-Hmac-Sha256: <base64 of HMAC(body)>`, the event id in `X-Shopify-Event-Id`.
pub(crate) fn shopify_with(secret: &str, event: &str) -> Delivery {
    let body = r#"{"id":820982911946154508,"total_price":"10.00"}"#;
    let sig = b64(&mac(secret.as_bytes(), &[body.as_bytes()]));
    Delivery {
        path: "/webhooks/shopify",
        headers: vec![
            ("x-shopify-hmac-sha256", sig),
            ("x-shopify-event-id", event.to_owned()),
            ("x-shopify-topic", "orders/create".to_owned()),
        ],
        body: body.to_owned(),
    }
}

pub(crate) fn shopify(event: &str) -> Delivery {
    shopify_with(SHOPIFY_SECRET, event)
}

/// `webhook-signature: v1,<base64 of HMAC("{id}.{t}.{body}")>` under the decoded secret.
pub(crate) fn standard_at(secret: &str, id: &str, t: i64, body: &str) -> Delivery {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("a base64 secret");
    let sig = b64(&mac(
        &key,
        &[
            id.as_bytes(),
            b".",
            t.to_string().as_bytes(),
            b".",
            body.as_bytes(),
        ],
    ));
    Delivery {
        path: "/webhooks/standard",
        headers: vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", t.to_string()),
            ("webhook-signature", format!("v1,{sig}")),
        ],
        body: body.to_owned(),
    }
}

pub(crate) fn standard(id: &str) -> Delivery {
    standard_at(STANDARD_SECRET, id, now(), r#"{"type":"user.created"}"#)
}

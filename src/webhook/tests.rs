//! The senders against published vectors, forged, stale and malformed deliveries.

use super::*;
use crate::ConfigErrorKind;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use proptest::prelude::*;
use sha2::Sha256;
use std::time::UNIX_EPOCH;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn request(headers: &[(&str, &[u8])]) -> Parts {
    let mut b = http::Request::post("/webhooks");
    for (name, value) in headers {
        b = b.header(
            *name,
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    b.body(()).expect("a request").into_parts().0
}

fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn hex(bytes: &[u8]) -> String {
    crate::hex::encode(bytes)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn kind<T: fmt::Debug>(r: Result<T, WebhookError>) -> WebhookErrorKind {
    r.expect_err("refused").kind()
}

use std::fmt;

// ---- Standard Webhooks --------------------------------------------------------------------

const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_TS: u64 = 1_614_265_330;
const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn sw_request(id: &str, ts: &str, sig: &str) -> Parts {
    request(&[
        ("webhook-id", id.as_bytes()),
        ("webhook-timestamp", ts.as_bytes()),
        ("webhook-signature", sig.as_bytes()),
    ])
}

fn sw_sign(secret: &str, id: &str, ts: u64, body: &[u8]) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("base64");
    let ts = ts.to_string();
    format!(
        "v1,{}",
        b64(&mac(
            &key,
            &[id.as_bytes(), b".", ts.as_bytes(), b".", body]
        ))
    )
}

#[test]
fn standard_webhooks_verifies_the_published_vectors() {
    // The specification's libraries carry these two.
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let parts = sw_request(SW_ID, &SW_TS.to_string(), SW_SIG);
    assert_eq!(
        sender.verify(&parts, SW_BODY, at(SW_TS)).unwrap().as_str(),
        SW_ID
    );
    let sender = StandardWebhooks::new("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
    let parts = sw_request(
        "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
        "1649367553",
        "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
    );
    let body = br#"{"email":"test@example.com","username":"test_user"}"#;
    assert_eq!(
        sender
            .verify(&parts, body, at(1_649_367_553))
            .unwrap()
            .as_str(),
        "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"
    );
    // The secret without its prefix is the same secret.
    let bare = StandardWebhooks::new("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    let parts = sw_request(SW_ID, &SW_TS.to_string(), SW_SIG);
    assert!(bare.verify(&parts, SW_BODY, at(SW_TS)).is_ok());
}

#[test]
fn standard_webhooks_reads_svix_names_as_one_set() {
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let ts = SW_TS.to_string();
    let svix = request(&[
        ("svix-id", SW_ID.as_bytes()),
        ("svix-timestamp", ts.as_bytes()),
        ("svix-signature", SW_SIG.as_bytes()),
    ]);
    assert_eq!(
        sender.verify(&svix, SW_BODY, at(SW_TS)).unwrap().as_str(),
        SW_ID
    );
    // Never a mix: Svix's signature reads Svix's id.
    let mixed = request(&[
        ("webhook-id", SW_ID.as_bytes()),
        ("webhook-timestamp", ts.as_bytes()),
        ("svix-signature", SW_SIG.as_bytes()),
    ]);
    assert_eq!(
        kind(sender.verify(&mixed, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignedIdMissing
    );
    // Both sets: the specification's is read.
    let mut both = sw_request(SW_ID, &ts, SW_SIG);
    both.headers
        .insert("svix-signature", "v1,AAAA".parse().unwrap());
    assert!(sender.verify(&both, SW_BODY, at(SW_TS)).is_ok());
}

#[test]
fn standard_webhooks_refuses_forged_and_altered_deliveries() {
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let ts = SW_TS.to_string();
    // The library tests' forged signature: one character off.
    let forged = sw_request(
        SW_ID,
        &ts,
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=",
    );
    assert_eq!(
        kind(sender.verify(&forged, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
    // The genuine signature over another body, id or timestamp.
    let parts = sw_request(SW_ID, &ts, SW_SIG);
    assert_eq!(
        kind(sender.verify(&parts, br#"{"test": 2432232315}"#, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
    let other_id = sw_request("msg_other", &ts, SW_SIG);
    assert_eq!(
        kind(sender.verify(&other_id, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
    let other_ts = sw_request(SW_ID, &(SW_TS + 1).to_string(), SW_SIG);
    assert_eq!(
        kind(sender.verify(&other_ts, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
    // The timestamp as sent is signed: a leading zero is another message.
    let zero = sw_request(SW_ID, &format!("0{ts}"), SW_SIG);
    assert_eq!(
        kind(sender.verify(&zero, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
    // A wrong secret.
    let wrong = StandardWebhooks::new("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
    assert_eq!(
        kind(wrong.verify(&parts, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
}

#[test]
fn standard_webhooks_accepts_any_secret_of_a_rotation_and_any_signature_of_the_header() {
    let new = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    let sender = StandardWebhooks::new(new)
        .unwrap()
        .secret(SW_SECRET)
        .unwrap();
    // Signed under the second secret only.
    let parts = sw_request(SW_ID, &SW_TS.to_string(), SW_SIG);
    assert!(sender.verify(&parts, SW_BODY, at(SW_TS)).is_ok());
    // Several entries: a forged one, another version, then the genuine one.
    let header = format!(
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA= v1a,AAAA {}",
        sw_sign(new, SW_ID, SW_TS, SW_BODY)
    );
    let parts = sw_request(SW_ID, &SW_TS.to_string(), &header);
    assert!(sender.verify(&parts, SW_BODY, at(SW_TS)).is_ok());
    // A sender with only the old secret refuses the new one's signature.
    let old_only = StandardWebhooks::new(SW_SECRET).unwrap();
    let parts = sw_request(
        SW_ID,
        &SW_TS.to_string(),
        &sw_sign(new, SW_ID, SW_TS, SW_BODY),
    );
    assert_eq!(
        kind(old_only.verify(&parts, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
}

#[test]
fn standard_webhooks_holds_its_tolerance_to_the_second_both_ways() {
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let parts = sw_request(SW_ID, &SW_TS.to_string(), SW_SIG);
    for now in [SW_TS - 300, SW_TS, SW_TS + 300] {
        assert!(sender.verify(&parts, SW_BODY, at(now)).is_ok(), "at {now}");
    }
    for now in [SW_TS - 301, SW_TS + 301, 0, u64::MAX / 4] {
        assert_eq!(
            kind(sender.verify(&parts, SW_BODY, at(now))),
            WebhookErrorKind::TimestampOutsideTolerance,
            "at {now}"
        );
    }
    // A forged stale delivery is a mismatch: the tolerance is judged after the signature.
    let forged = sw_request(SW_ID, "1", SW_SIG);
    assert_eq!(
        kind(sender.verify(&forged, SW_BODY, at(SW_TS))),
        WebhookErrorKind::SignatureMismatch
    );
    // A setting widens it.
    let wide = sender.tolerance(Duration::from_secs(3600));
    assert!(wide.verify(&parts, SW_BODY, at(SW_TS + 3600)).is_ok());
    assert!(wide.verify(&parts, SW_BODY, at(SW_TS + 3601)).is_err());
}

#[test]
fn standard_webhooks_refuses_missing_and_malformed_headers() {
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let ts = SW_TS.to_string();
    let now = at(SW_TS);
    let check = |headers: &[(&str, &[u8])], expected| {
        assert_eq!(
            kind(sender.verify(&request(headers), SW_BODY, now)),
            expected,
            "{headers:?}"
        );
    };
    use WebhookErrorKind::*;
    check(
        &[
            ("webhook-id", SW_ID.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
        ],
        SignatureMissing,
    );
    check(
        &[
            ("webhook-timestamp", ts.as_bytes()),
            ("webhook-signature", SW_SIG.as_bytes()),
        ],
        SignedIdMissing,
    );
    check(
        &[
            ("webhook-id", SW_ID.as_bytes()),
            ("webhook-signature", SW_SIG.as_bytes()),
        ],
        TimestampMissing,
    );
    for bad_ts in [
        &b"hello"[..],
        b"",
        b"-1614265330",
        b"+1614265330",
        b"1e9",
        b"99999999999999999999",
    ] {
        check(
            &[
                ("webhook-id", SW_ID.as_bytes()),
                ("webhook-timestamp", bad_ts),
                ("webhook-signature", SW_SIG.as_bytes()),
            ],
            TimestampMalformed,
        );
    }
    let overlong = "v1,".to_string() + &"A".repeat(10_000);
    let many = vec![SW_SIG; 17].join(" ");
    for bad_sig in [
        &b"v1,"[..],
        b"",
        b"garbage",
        b"v1,not base64!",
        b"v1,g0hM9SsE",
        b"\xff\xfe",
        overlong.as_bytes(),
        many.as_bytes(),
    ] {
        check(
            &[
                ("webhook-id", SW_ID.as_bytes()),
                ("webhook-timestamp", ts.as_bytes()),
                ("webhook-signature", bad_sig),
            ],
            SignatureMalformed,
        );
    }
    // Only entries of other versions: no signature of this scheme.
    check(
        &[
            ("webhook-id", SW_ID.as_bytes()),
            ("webhook-timestamp", ts.as_bytes()),
            ("webhook-signature", b"v1a,AAAA v2,BBBB"),
        ],
        SignatureMissing,
    );
    // Sixteen signatures are read.
    let sixteen = vec![SW_SIG; 16].join(" ");
    assert!(
        sender
            .verify(&sw_request(SW_ID, &ts, &sixteen), SW_BODY, now)
            .is_ok()
    );
    // A header twice.
    let mut parts = sw_request(SW_ID, &ts, SW_SIG);
    parts
        .headers
        .append("webhook-id", "msg_other".parse().unwrap());
    assert_eq!(kind(sender.verify(&parts, SW_BODY, now)), SignedIdMalformed);
    let mut parts = sw_request(SW_ID, &ts, SW_SIG);
    parts
        .headers
        .append("webhook-signature", SW_SIG.parse().unwrap());
    assert_eq!(
        kind(sender.verify(&parts, SW_BODY, now)),
        SignatureMalformed
    );
}

#[test]
fn standard_webhooks_refuses_a_signed_id_that_is_not_a_key() {
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let secret_id = "a".repeat(256);
    let sig = sw_sign(SW_SECRET, &secret_id, SW_TS, SW_BODY);
    let err = sender
        .verify(
            &sw_request(&secret_id, &SW_TS.to_string(), &sig),
            SW_BODY,
            at(SW_TS),
        )
        .unwrap_err();
    assert_eq!(err.kind(), WebhookErrorKind::KeyInvalid);
    assert_eq!(err.code(), "idempotency.key_invalid");
    assert!(std::error::Error::source(&err).is_some(), "the key's error");
}

#[test]
fn standard_webhooks_signs_bytes_not_text() {
    // A body that is not UTF-8 is signed and verified like any other.
    let sender = StandardWebhooks::new(SW_SECRET).unwrap();
    let body = b"\xff\x00\xfe";
    let sig = sw_sign(SW_SECRET, SW_ID, SW_TS, body);
    let parts = sw_request(SW_ID, &SW_TS.to_string(), &sig);
    assert!(sender.verify(&parts, body, at(SW_TS)).is_ok());
}

#[test]
fn secrets_that_cannot_verify_are_refused_when_built() {
    for s in ["", "whsec_", "whsec_not base64!"] {
        assert_eq!(
            StandardWebhooks::new(s).unwrap_err().kind(),
            ConfigErrorKind::SecretInvalid,
            "{s:?}"
        );
    }
    assert_eq!(
        Stripe::new("").unwrap_err().kind(),
        ConfigErrorKind::SecretInvalid
    );
    assert_eq!(
        GitHub::new("").unwrap_err().kind(),
        ConfigErrorKind::SecretInvalid
    );
    assert_eq!(
        Shopify::new(b"").unwrap_err().kind(),
        ConfigErrorKind::SecretInvalid
    );
    assert!(GitHub::new("s").unwrap().secret("").is_err());
    // A secret never reaches a log.
    let debug = format!("{:?}", Stripe::new("whsec_abc").unwrap());
    assert!(!debug.contains("abc"), "{debug}");
}

// ---- Stripe -------------------------------------------------------------------------------

const STRIPE_SECRET: &str = "whsec_test_secret";
const STRIPE_TS: u64 = 1_700_000_000;
const STRIPE_BODY: &[u8] = br#"{"id":"evt_1","object":"event","data":{"object":{"id":"pi_1"}}}"#;

fn stripe_sig(secret: &str, ts: u64, body: &[u8]) -> String {
    let ts = ts.to_string();
    hex(&mac(secret.as_bytes(), &[ts.as_bytes(), b".", body]))
}

fn stripe_request(header: &str) -> Parts {
    request(&[("stripe-signature", header.as_bytes())])
}

#[test]
fn stripe_verifies_a_signature_made_elsewhere() {
    // Computed with Python's `hmac`, as Stripe's documentation describes the scheme.
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    let parts = stripe_request(
        "t=1700000000,v1=0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd",
    );
    let body = br#"{"id":"evt_1","object":"event"}"#;
    assert_eq!(
        stripe.verify(&parts, body, at(STRIPE_TS)).unwrap().as_str(),
        "evt_1"
    );
}

#[test]
fn stripe_keys_by_the_top_level_id_and_accepts_any_v1() {
    let stripe = Stripe::new("whsec_new")
        .unwrap()
        .secret(STRIPE_SECRET)
        .unwrap();
    // Stripe's form while a secret rolls: one v1 per secret, a v0 of test mode.
    let header = format!(
        "t={STRIPE_TS},v1={},v1={},v0={}",
        "0".repeat(64),
        stripe_sig(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY),
        "f".repeat(64),
    );
    let key = stripe
        .verify(&stripe_request(&header), STRIPE_BODY, at(STRIPE_TS))
        .unwrap();
    assert_eq!(key.as_str(), "evt_1", "the event's id, not the object's");
    // Uppercase hex is the same signature.
    let upper = format!(
        "t={STRIPE_TS},v1={}",
        stripe_sig(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY).to_uppercase()
    );
    assert!(
        stripe
            .verify(&stripe_request(&upper), STRIPE_BODY, at(STRIPE_TS))
            .is_ok()
    );
}

#[test]
fn stripe_refuses_forged_and_wrong_secret_signatures() {
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    let genuine = stripe_sig(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY);
    let mut forged = genuine.clone().into_bytes();
    forged[63] = if forged[63] == b'0' { b'1' } else { b'0' };
    let forged = String::from_utf8(forged).unwrap();
    for header in [
        format!("t={STRIPE_TS},v1={forged}"),
        format!("t={},v1={genuine}", STRIPE_TS + 1),
        format!(
            "t={STRIPE_TS},v1={}",
            stripe_sig("whsec_other", STRIPE_TS, STRIPE_BODY)
        ),
        // The v0 scheme is not taken, however it matches.
        format!("t={STRIPE_TS},v1={forged},v0={genuine}"),
    ] {
        assert_eq!(
            kind(stripe.verify(&stripe_request(&header), STRIPE_BODY, at(STRIPE_TS))),
            WebhookErrorKind::SignatureMismatch,
            "{header}"
        );
    }
    // Decoding the secret is not Stripe's way: the string is the key.
    let header = format!("t={STRIPE_TS},v1={genuine}");
    assert!(
        stripe
            .verify(
                &stripe_request(&header),
                br#"{"id":"evt_2"}"#,
                at(STRIPE_TS)
            )
            .is_err()
    );
}

/// Stripe's own libraries bound only a signature's age: a timestamp ahead of the receiver's
/// clock (a clock running behind Stripe's) verifies, however far ahead.
#[test]
fn stripe_holds_its_tolerance_in_the_past_to_the_second_and_takes_a_timestamp_ahead() {
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    let header = format!(
        "t={STRIPE_TS},v1={}",
        stripe_sig(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY)
    );
    let parts = stripe_request(&header);
    // `now` before the signed time: the timestamp is ahead, by a second, 301 s, a day.
    for now in [
        STRIPE_TS + 300,
        STRIPE_TS,
        STRIPE_TS - 1,
        STRIPE_TS - 301,
        STRIPE_TS - 86_400,
    ] {
        assert!(
            stripe.verify(&parts, STRIPE_BODY, at(now)).is_ok(),
            "at {now}"
        );
    }
    assert_eq!(
        kind(stripe.verify(&parts, STRIPE_BODY, at(STRIPE_TS + 301))),
        WebhookErrorKind::TimestampOutsideTolerance,
        "301 s old"
    );
    // A narrower tolerance holds in the past the same way, and still takes a timestamp ahead.
    let narrow = Stripe::new(STRIPE_SECRET)
        .unwrap()
        .tolerance(Duration::from_secs(10));
    assert!(
        narrow
            .verify(&parts, STRIPE_BODY, at(STRIPE_TS + 10))
            .is_ok()
    );
    assert!(
        narrow
            .verify(&parts, STRIPE_BODY, at(STRIPE_TS - 3600))
            .is_ok()
    );
    assert_eq!(
        kind(narrow.verify(&parts, STRIPE_BODY, at(STRIPE_TS + 11))),
        WebhookErrorKind::TimestampOutsideTolerance
    );
    // A clock before the epoch, as a broken clock may say, is behind: the timestamp is ahead.
    let before = UNIX_EPOCH - Duration::from_secs(10);
    assert!(stripe.verify(&parts, STRIPE_BODY, before).is_ok());
}

#[test]
fn stripe_refuses_malformed_headers() {
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    let sig = stripe_sig(STRIPE_SECRET, STRIPE_TS, STRIPE_BODY);
    use WebhookErrorKind::*;
    let cases: Vec<(Vec<u8>, WebhookErrorKind)> = vec![
        (b"".to_vec(), SignatureMalformed),
        (b"garbage".to_vec(), SignatureMalformed),
        (
            format!("t={STRIPE_TS},v1{sig}").into_bytes(),
            SignatureMalformed,
        ),
        (format!("t={STRIPE_TS}").into_bytes(), SignatureMissing),
        (
            format!("t={STRIPE_TS},v0={sig}").into_bytes(),
            SignatureMissing,
        ),
        (format!("v1={sig}").into_bytes(), TimestampMissing),
        (format!("t=abc,v1={sig}").into_bytes(), TimestampMalformed),
        (format!("t=,v1={sig}").into_bytes(), TimestampMalformed),
        (
            format!("t={STRIPE_TS},t={STRIPE_TS},v1={sig}").into_bytes(),
            SignatureMalformed,
        ),
        (
            format!("t={STRIPE_TS},v1=xyz").into_bytes(),
            SignatureMalformed,
        ),
        (
            format!("t={STRIPE_TS},v1={sig}00").into_bytes(),
            SignatureMalformed,
        ),
        (
            format!("t={STRIPE_TS},{}", vec![format!("v1={sig}"); 17].join(",")).into_bytes(),
            SignatureMalformed,
        ),
        (
            format!("t={STRIPE_TS},v1={}", "a".repeat(100_000)).into_bytes(),
            SignatureMalformed,
        ),
        (b"t=1700000000,v1=\xff\xff".to_vec(), SignatureMalformed),
    ];
    for (header, expected) in cases {
        let parts = request(&[("stripe-signature", &header)]);
        assert_eq!(
            kind(stripe.verify(&parts, STRIPE_BODY, at(STRIPE_TS))),
            expected,
            "{}",
            String::from_utf8_lossy(&header)
        );
    }
    assert_eq!(
        kind(stripe.verify(&request(&[]), STRIPE_BODY, at(STRIPE_TS))),
        SignatureMissing
    );
}

#[test]
fn stripe_refuses_a_body_without_an_event_id() {
    let stripe = Stripe::new(STRIPE_SECRET).unwrap();
    use WebhookErrorKind::*;
    let cases: &[(&[u8], WebhookErrorKind)] = &[
        (b"not json", BodyNotJson),
        (b"", BodyNotJson),
        (br#"{"id":"evt_1""#, BodyNotJson),
        (br#"{"id":"evt_1"} trailing"#, BodyNotJson),
        (
            br#"{"object":"event","data":{"id":"evt_nested"}}"#,
            KeyMissing,
        ),
        (br#"["evt_1"]"#, KeyMissing),
        (br#""evt_1""#, KeyMissing),
        (b"null", KeyMissing),
        (br#"{"id":17}"#, KeyInvalid),
        (br#"{"id":null}"#, KeyInvalid),
        (br#"{"id":""}"#, KeyInvalid),
        (br#"{"id":"evt_1","id":"evt_2"}"#, KeyInvalid),
    ];
    for (body, expected) in cases {
        let header = format!(
            "t={STRIPE_TS},v1={}",
            stripe_sig(STRIPE_SECRET, STRIPE_TS, body)
        );
        let err = stripe
            .verify(&stripe_request(&header), body, at(STRIPE_TS))
            .unwrap_err();
        assert_eq!(err.kind(), *expected, "{}", String::from_utf8_lossy(body));
        if *expected == BodyNotJson {
            assert!(
                std::error::Error::source(&err).is_some(),
                "the parser's error"
            );
        }
    }
    // An escaped name is the same name.
    let body = br#"{"i\u0064":"evt_9"}"#;
    let header = format!(
        "t={STRIPE_TS},v1={}",
        stripe_sig(STRIPE_SECRET, STRIPE_TS, body)
    );
    assert_eq!(
        stripe
            .verify(&stripe_request(&header), body, at(STRIPE_TS))
            .unwrap()
            .as_str(),
        "evt_9"
    );
}

// ---- GitHub -------------------------------------------------------------------------------

const GH_SECRET: &str = "It's a Secret to Everybody";
const GH_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
const GH_BODY: &[u8] = b"Hello, World!";
const GH_DELIVERY: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";

fn gh_request(sig: &[u8], delivery: Option<&[u8]>) -> Parts {
    let mut headers = vec![("x-hub-signature-256", sig)];
    headers.extend(delivery.map(|d| ("x-github-delivery", d)));
    request(&headers)
}

#[test]
fn github_verifies_its_published_vector_at_any_time() {
    let github = GitHub::new(GH_SECRET).unwrap();
    let parts = gh_request(GH_SIG.as_bytes(), Some(GH_DELIVERY.as_bytes()));
    // No timestamp is signed: any "now" verifies.
    for now in [at(0), at(SW_TS), at(u64::MAX / 4)] {
        assert_eq!(
            github.verify(&parts, GH_BODY, now).unwrap().as_str(),
            GH_DELIVERY
        );
    }
    // One payload under two delivery ids is two deliveries.
    let other = gh_request(GH_SIG.as_bytes(), Some(b"second-delivery"));
    assert_eq!(
        github.verify(&other, GH_BODY, at(0)).unwrap().as_str(),
        "second-delivery"
    );
}

#[test]
fn github_refuses_forged_wrong_secret_and_malformed_signatures() {
    let github = GitHub::new(GH_SECRET).unwrap();
    let d = Some(GH_DELIVERY.as_bytes());
    use WebhookErrorKind::*;
    let wrong = format!("sha256={}", hex(&mac(b"another secret", &[GH_BODY])));
    let forged = GH_SIG.replace("17", "18");
    let overlong = format!("sha256={}", "a".repeat(100_000));
    let cases: &[(&[u8], WebhookErrorKind)] = &[
        (wrong.as_bytes(), SignatureMismatch),
        (forged.as_bytes(), SignatureMismatch),
        (b"", SignatureMalformed),
        (b"garbage", SignatureMalformed),
        (
            b"sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            SignatureMalformed,
        ),
        (
            b"sha256757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            SignatureMalformed,
        ),
        (b"sha256=", SignatureMalformed),
        (
            b"sha256=zz7107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            SignatureMalformed,
        ),
        (b"sha256=\xff", SignatureMalformed),
        (overlong.as_bytes(), SignatureMalformed),
    ];
    for (sig, expected) in cases {
        assert_eq!(
            kind(github.verify(&gh_request(sig, d), GH_BODY, at(0))),
            *expected,
            "{}",
            String::from_utf8_lossy(sig)
        );
    }
    assert_eq!(
        kind(github.verify(
            &request(&[("x-github-delivery", GH_DELIVERY.as_bytes())]),
            GH_BODY,
            at(0)
        )),
        SignatureMissing
    );
}

#[test]
fn github_rotation_and_a_missing_delivery_id() {
    let github = GitHub::new("the new secret")
        .unwrap()
        .secret(GH_SECRET)
        .unwrap();
    let parts = gh_request(GH_SIG.as_bytes(), Some(GH_DELIVERY.as_bytes()));
    assert!(github.verify(&parts, GH_BODY, at(0)).is_ok());
    // Verified, but no key: refused, never keyed by something else.
    let parts = gh_request(GH_SIG.as_bytes(), None);
    assert_eq!(
        kind(github.verify(&parts, GH_BODY, at(0))),
        WebhookErrorKind::KeyMissing
    );
    let parts = gh_request(GH_SIG.as_bytes(), Some(b""));
    assert_eq!(
        kind(github.verify(&parts, GH_BODY, at(0))),
        WebhookErrorKind::KeyInvalid
    );
    // A forged request without an id is refused for its signature first.
    let parts = gh_request(b"sha256=00", None);
    assert_eq!(
        kind(github.verify(&parts, GH_BODY, at(0))),
        WebhookErrorKind::SignatureMalformed
    );
}

// ---- Shopify ------------------------------------------------------------------------------

const SHOP_SECRET: &str = "hush";
const SHOP_BODY: &[u8] = br#"{"id":820982911946154508}"#;
// Computed with Python's `hmac` and `base64`.
const SHOP_SIG: &str = "qBvrsZF7RfB1iS6BX6IHqJTp5L911P7intnPeTPsH0I=";
const SHOP_EVENT: &str = "98880550-7158-44d4-b7cd-2c97c8a091b5";

#[test]
fn shopify_verifies_and_keys_by_the_event_id_else_the_webhook_id() {
    let shopify = Shopify::new(SHOP_SECRET).unwrap();
    let both = request(&[
        ("x-shopify-hmac-sha256", SHOP_SIG.as_bytes()),
        ("x-shopify-event-id", SHOP_EVENT.as_bytes()),
        (
            "x-shopify-webhook-id",
            b"b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        ),
    ]);
    assert_eq!(
        shopify.verify(&both, SHOP_BODY, at(0)).unwrap().as_str(),
        SHOP_EVENT
    );
    let webhook_only = request(&[
        ("x-shopify-hmac-sha256", SHOP_SIG.as_bytes()),
        (
            "x-shopify-webhook-id",
            b"b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        ),
    ]);
    assert_eq!(
        shopify
            .verify(&webhook_only, SHOP_BODY, at(0))
            .unwrap()
            .as_str(),
        "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    );
    let neither = request(&[("x-shopify-hmac-sha256", SHOP_SIG.as_bytes())]);
    assert_eq!(
        kind(shopify.verify(&neither, SHOP_BODY, at(0))),
        WebhookErrorKind::KeyMissing
    );
    // An event id that is not a key is refused, not passed over for the webhook id.
    let bad = request(&[
        ("x-shopify-hmac-sha256", SHOP_SIG.as_bytes()),
        ("x-shopify-event-id", b""),
        ("x-shopify-webhook-id", b"b54557e4"),
    ]);
    assert_eq!(
        kind(shopify.verify(&bad, SHOP_BODY, at(0))),
        WebhookErrorKind::KeyInvalid
    );
}

#[test]
fn shopify_refuses_forged_wrong_secret_and_malformed_signatures() {
    let shopify = Shopify::new(SHOP_SECRET).unwrap().secret("next").unwrap();
    use WebhookErrorKind::*;
    let wrong = b64(&mac(b"other", &[SHOP_BODY]));
    let rotated = b64(&mac(b"next", &[SHOP_BODY]));
    let unpadded = SHOP_SIG.trim_end_matches('=');
    let overlong = "A".repeat(100_000);
    let cases: &[(&[u8], Option<WebhookErrorKind>)] = &[
        (rotated.as_bytes(), None),
        (unpadded.as_bytes(), None),
        (wrong.as_bytes(), Some(SignatureMismatch)),
        (
            b"rBvrsZF7RfB1iS6BX6IHqJTp5L911P7intnPeTPsH0I=",
            Some(SignatureMismatch),
        ),
        // Bits past the 32 bytes set: not a signature's encoding.
        (
            b"qBvrsZF7RfB1iS6BX6IHqJTp5L911P7intnPeTPsH0J=",
            Some(SignatureMalformed),
        ),
        (b"", Some(SignatureMalformed)),
        (b"garbage!", Some(SignatureMalformed)),
        (
            b"sha256=qBvrsZF7RfB1iS6BX6IHqJTp5L911P7intnPeTPsH0I=",
            Some(SignatureMalformed),
        ),
        (b"\xff\xfe", Some(SignatureMalformed)),
        (overlong.as_bytes(), Some(SignatureMalformed)),
    ];
    for (sig, expected) in cases {
        let parts = request(&[
            ("x-shopify-hmac-sha256", sig),
            ("x-shopify-event-id", SHOP_EVENT.as_bytes()),
        ]);
        let got = shopify
            .verify(&parts, SHOP_BODY, at(0))
            .err()
            .map(|e| e.kind());
        assert_eq!(got, *expected, "{}", String::from_utf8_lossy(sig));
    }
}

// ---- all senders --------------------------------------------------------------------------

#[test]
fn each_sender_states_its_retry_horizon() {
    const DAY: u64 = 24 * 60 * 60;
    let stripe = Stripe::new("s").unwrap();
    let shopify = Shopify::new("s").unwrap();
    let github = GitHub::new("s").unwrap();
    let standard = StandardWebhooks::new(SW_SECRET).unwrap();
    assert_eq!(stripe.retention(), Duration::from_secs(3 * DAY));
    assert_eq!(shopify.retention(), Duration::from_secs(2 * DAY));
    assert_eq!(github.retention(), Duration::from_secs(3 * DAY));
    // Past Svix's schedule: its waits after each failed attempt add up to 27 h 35 min 5 s,
    // and each of its eight attempts may take 15 s.
    let svix = Duration::from_secs(5 + 5 * 60 + 30 * 60 + (2 + 5 + 10 + 10) * 3600 + 8 * 15);
    assert!(standard.retention() >= 2 * svix);
    assert_eq!(standard.retention(), Duration::from_secs(3 * DAY));
}

#[test]
fn a_sender_behind_a_pointer_is_the_sender() {
    fn horizon(sender: impl Sender) -> Duration {
        sender.retention()
    }
    let shopify = Shopify::new(SHOP_SECRET).unwrap();
    let two_days = Duration::from_secs(48 * 60 * 60);
    assert_eq!(horizon(std::sync::Arc::new(shopify.clone())), two_days);
    let boxed: Box<dyn Sender> = Box::new(shopify);
    assert_eq!(horizon(boxed), two_days);
    let github: std::sync::Arc<dyn Sender> = std::sync::Arc::new(GitHub::new(GH_SECRET).unwrap());
    let parts = gh_request(GH_SIG.as_bytes(), Some(GH_DELIVERY.as_bytes()));
    assert_eq!(
        Sender::verify(&github, &parts, GH_BODY, at(0))
            .unwrap()
            .as_str(),
        GH_DELIVERY
    );
}

#[test]
fn error_kinds_have_distinct_codes() {
    use WebhookErrorKind::*;
    let kinds = [
        SignatureMissing,
        SignatureMalformed,
        SignatureMismatch,
        TimestampMissing,
        TimestampMalformed,
        TimestampOutsideTolerance,
        SignedIdMissing,
        SignedIdMalformed,
        KeyMissing,
        KeyInvalid,
        BodyNotJson,
    ];
    let codes: std::collections::HashSet<_> = kinds.iter().map(|k| k.code()).collect();
    assert_eq!(codes.len(), kinds.len());
    for code in codes {
        let name = code
            .strip_prefix("idempotency.")
            .expect("the crate's prefix");
        assert!(
            name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{code}"
        );
    }
}

fn senders() -> Vec<Box<dyn Sender>> {
    vec![
        Box::new(StandardWebhooks::new(SW_SECRET).unwrap()),
        Box::new(Stripe::new(STRIPE_SECRET).unwrap()),
        Box::new(GitHub::new(GH_SECRET).unwrap()),
        Box::new(Shopify::new(SHOP_SECRET).unwrap()),
    ]
}

const NAMES: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "stripe-signature",
    "x-hub-signature-256",
    "x-github-delivery",
    "x-shopify-hmac-sha256",
    "x-shopify-event-id",
    "x-shopify-webhook-id",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random header values (any bytes a header may hold, some shaped like the senders'
    /// headers) and bodies: every sender answers, none verifies, none panics.
    #[test]
    fn no_input_panics_or_verifies(
        values in prop::collection::vec(
            (0..NAMES.len(), prop_oneof![
                prop::collection::vec(any::<u8>(), 0..80),
                "t=[0-9]{0,20},v1=[0-9a-fA-F]{0,70}(,v1=[0-9a-f]{64})?".prop_map(String::into_bytes),
                "(v1,[A-Za-z0-9+/=]{0,50} ?){0,3}".prop_map(String::into_bytes),
                "sha256=[0-9a-f]{0,66}".prop_map(String::into_bytes),
                "[0-9]{0,25}".prop_map(String::into_bytes),
            ]),
            0..8,
        ),
        body in prop::collection::vec(any::<u8>(), 0..200),
        now in any::<u64>(),
    ) {
        let mut parts = request(&[]);
        for (name, value) in &values {
            if let Ok(v) = http::HeaderValue::from_bytes(value) {
                parts.headers.append(NAMES[*name], v);
            }
        }
        let now = UNIX_EPOCH.checked_add(Duration::from_secs(now)).unwrap_or(UNIX_EPOCH);
        for sender in senders() {
            let result = sender.verify(&parts, &body, now);
            prop_assert!(result.is_err());
            let err = result.unwrap_err();
            prop_assert!(!err.to_string().is_empty());
        }
    }
}

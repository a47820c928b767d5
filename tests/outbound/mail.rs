//! lettre's SMTP transport through `LettreSendOnce`, against a real SMTP server
//! (`python3-aiosmtpd`, started per test on a free loopback port); expanded per store in
//! `main.rs`.

use crate::support::http::SpyStore;
use crate::support::ports::Refusing;
use crate::support::proxy::Proxy;
use crate::support::smtp_server::{self, SmtpServer};
use std::time::Duration;
use tower_idempotency::Store;
use tower_idempotency::outbound::lettre::lettre::message::header::{HeaderName, HeaderValue};
use tower_idempotency::outbound::lettre::lettre::transport::smtp::AsyncSmtpTransport;
use tower_idempotency::outbound::lettre::lettre::{AsyncTransport, Message, Tokio1Executor};
use tower_idempotency::outbound::lettre::{LettreSendOnce, MailErrorKind};
use tower_idempotency::outbound::{Delivery, OutboundErrorKind, Unknown};

type Smtp = AsyncSmtpTransport<Tokio1Executor>;

fn smtp(port: u16) -> Smtp {
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(port)
        .timeout(Some(Duration::from_secs(5)))
        .build()
}

/// The door's bound on a send: seconds wide, so that a whole SMTP exchange with the Python
/// server ends inside it on a loaded machine, and only a stalled server meets it.
const SEND_TIMEOUT: Duration = Duration::from_secs(3);

fn mailer<S: Store>(store: SpyStore<S>, port: u16) -> LettreSendOnce<Smtp, SpyStore<S>> {
    LettreSendOnce::new(store, smtp(port)).timeout(SEND_TIMEOUT)
}

/// The welcome email of a job, with its key in the `Idempotency-Key` header.
fn welcome(key: &str, subject: &str) -> Message {
    Message::builder()
        .from("shop@example.com".parse().unwrap())
        .to("ada@example.com".parse().unwrap())
        .subject(subject)
        .raw_header(HeaderValue::new(
            HeaderName::new_from_ascii_str("Idempotency-Key"),
            key.to_owned(),
        ))
        .body(String::from("Welcome aboard."))
        .unwrap()
}

pub(crate) async fn a_job_that_runs_twice_delivers_one_message<S: Store>(store: SpyStore<S>) {
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let mailer = mailer(store, server.port());
    // The job runs twice: each run builds its message anew (its own Date and Message-ID).
    let first = mailer
        .send(welcome("welcome:ada", "Welcome"))
        .await
        .unwrap();
    let again = mailer
        .send(welcome("welcome:ada", "Welcome"))
        .await
        .unwrap();
    let Delivery::Recorded(reply) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(u16::from(reply.code()), 250);
    let Delivery::Replayed(replayed) = &again else {
        panic!("{again:?}")
    };
    assert_eq!(
        replayed, reply,
        "the repeat is answered with the first reply"
    );
    assert_eq!(
        server.messages(),
        vec!["Welcome"],
        "the server received one message"
    );
}

pub(crate) async fn a_server_that_stalls_after_data_is_unknown_and_the_retry_does_not_send<
    S: Store,
>(
    store: SpyStore<S>,
) {
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let mailer = mailer(store, server.port());
    server.stall(true);
    let first = mailer.send(welcome("k", "Receipt")).await.unwrap();
    assert!(
        matches!(
            &first,
            Delivery::Held(Unknown::Error(e)) if e.kind() == MailErrorKind::Timeout
        ),
        "{first:?}"
    );
    assert_eq!(
        server.messages(),
        vec!["Receipt"],
        "the server had taken the message"
    );
    server.stall(false);
    let retry = mailer.send(welcome("k", "Receipt")).await.unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");
    assert_eq!(server.messages().len(), 1, "the retry did not send again");
}

pub(crate) async fn a_refused_connection_is_released_and_the_retry_sends<S: Store>(
    store: SpyStore<S>,
) {
    if !smtp_server::available() {
        return;
    }
    // A port held without listening: connections are refused, and no other test takes it
    // before the server answers on it (through a proxy: the server binds a port of its own).
    let port = Refusing::new();
    let mailer = mailer(store.clone(), port.port());
    let err = mailer.send(welcome("k", "Hello")).await.unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::Work, "{err:?}");
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(
        err.get_ref().map(|e| e.kind()),
        Some(MailErrorKind::Work),
        "{err:?}"
    );
    assert_eq!(store.releases(), 1);
    let server = SmtpServer::start();
    let _proxy = Proxy::on(port.listen(), server.port());
    let retry = mailer.send(welcome("k", "Hello")).await.unwrap();
    assert!(retry.is_sent(), "{retry:?}");
    assert_eq!(server.messages(), vec!["Hello"]);
}

pub(crate) async fn a_transient_reply_releases_the_key_and_a_permanent_one_is_final<S: Store>(
    store: SpyStore<S>,
) {
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let mailer = mailer(store, server.port());
    server.reply(Some("451 4.3.0 try again later"));
    let err = mailer.send(welcome("a", "A")).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(err.kind(), OutboundErrorKind::Work);

    server.reply(Some("554 5.7.1 rejected"));
    let err = mailer.send(welcome("b", "B")).await.unwrap_err();
    assert!(!err.is_retryable(), "a 5xx reply is final: {err:?}");

    server.reply(None);
    assert!(
        mailer.send(welcome("a", "A")).await.unwrap().is_sent(),
        "a was released"
    );
    assert!(
        mailer.send(welcome("b", "B")).await.unwrap().is_sent(),
        "b was released"
    );
    assert_eq!(server.messages(), vec!["A", "B"]);
}

pub(crate) async fn a_key_from_the_caller_or_the_message_id<S: Store>(store: SpyStore<S>) {
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let by_caller = mailer(store.clone(), server.port());
    let plain = || {
        Message::builder()
            .from("shop@example.com".parse().unwrap())
            .to("ada@example.com".parse().unwrap())
            .subject("Invoice")
            .body(String::from("Attached."))
            .unwrap()
    };
    assert!(
        by_caller
            .send_with_key("invoice-7", plain())
            .await
            .unwrap()
            .is_sent()
    );
    let again = by_caller.send_with_key("invoice-7", plain()).await.unwrap();
    assert!(matches!(again, Delivery::Replayed(_)), "{again:?}");

    let by_id = LettreSendOnce::new(store, smtp(server.port())).key_from_message_id();
    let with_id = || {
        Message::builder()
            .message_id(Some("<reminder-7@shop.example>".to_owned()))
            .from("shop@example.com".parse().unwrap())
            .to("ada@example.com".parse().unwrap())
            .subject("Reminder")
            .body(String::from("Due tomorrow."))
            .unwrap()
    };
    assert!(by_id.send(with_id()).await.unwrap().is_sent());
    assert!(matches!(
        by_id.send(with_id()).await.unwrap(),
        Delivery::Replayed(_)
    ));
    assert_eq!(server.messages(), vec!["Invoice", "Reminder"]);
}

pub(crate) async fn another_message_under_the_key_is_key_reused_and_a_failed_claim_sends_nothing<
    S: Store,
>(
    store: SpyStore<S>,
) {
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let mailer = mailer(store.clone(), server.port());
    assert!(
        mailer
            .send(welcome("k", "Welcome"))
            .await
            .unwrap()
            .is_sent()
    );
    let err = mailer.send(welcome("k", "Welcome back")).await.unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::KeyReused, "{err:?}");

    store.fail_claims(true);
    let err = mailer.send(welcome("other", "Hello")).await.unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::Store, "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(server.messages(), vec!["Welcome"]);
}

pub(crate) async fn key_from_message_id_refuses_a_message_without_one<S: Store>(
    store: SpyStore<S>,
) {
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let by_id = LettreSendOnce::new(store.clone(), smtp(server.port())).key_from_message_id();
    // lettre's builder adds no Message-ID.
    let plain = || {
        Message::builder()
            .from("shop@example.com".parse().unwrap())
            .to("ada@example.com".parse().unwrap())
            .subject("Reminder")
            .body(String::from("Due tomorrow."))
            .unwrap()
    };
    for _ in 0..2 {
        let err = by_id.send(plain()).await.unwrap_err();
        assert_eq!(err.kind(), OutboundErrorKind::KeyMissing, "{err:?}");
    }
    assert!(server.messages().is_empty(), "not sent unguarded");
    assert_eq!(store.claims(), 0);

    let unguarded = LettreSendOnce::new(store, smtp(server.port()))
        .key_from_message_id()
        .require_key(false);
    let sent = unguarded.send(plain()).await.unwrap();
    assert!(matches!(sent, Delivery::Untracked(_)), "{sent:?}");
    assert_eq!(server.messages(), vec!["Reminder"]);
}

pub(crate) async fn one_job_key_for_a_mail_and_a_charge_is_two_keys<S: Store>(store: SpyStore<S>) {
    use crate::http_calls::{Behave, Stub, charge, send};
    use tower_idempotency::outbound::http::HttpSendOnceLayer;
    if !smtp_server::available() {
        return;
    }
    let server = SmtpServer::start();
    let stub = Stub::start(Behave::Answer(201)).await;
    // One store, one job key, two adapters with their default settings.
    let mailer = LettreSendOnce::new(store.clone(), smtp(server.port()));
    let payments = HttpSendOnceLayer::new(store);
    let mail = mailer.send(welcome("job-7", "Welcome")).await.unwrap();
    assert!(matches!(mail, Delivery::Recorded(_)), "{mail:?}");
    let charged = send(&payments, charge(&stub.url(), Some("job-7"), "{}"))
        .await
        .expect("the mail's key is not the charge's");
    assert!(matches!(charged, Delivery::Recorded(_)), "{charged:?}");
    assert_eq!((server.messages().len(), stub.received()), (1, 1));
}

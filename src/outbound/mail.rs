//! Send-once email over lettre (feature `lettre`): a job that runs twice delivers one message.
//!
//! [`SendOnceTransport`] wraps any lettre [`AsyncTransport`] (SMTP, the stub, your own) and is
//! one itself: a message whose key already went is answered with the receipt of its first
//! send and not handed to the transport again.
//!
//! ```
//! use lettre::{AsyncTransport, Message};
//! use lettre::transport::stub::AsyncStubTransport;
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::outbound::Delivery;
//! use tower_idempotency::outbound::mail::SendOnceTransport;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let stub = AsyncStubTransport::new_ok();
//! let mailer = SendOnceTransport::builder(stub.clone(), Engine::new(MemoryStore::new())).build();
//! let welcome = || {
//!     Message::builder()
//!         .from("shop@example.com".parse().unwrap())
//!         .to("ada@example.com".parse().unwrap())
//!         .subject("Welcome")
//!         .raw_header(lettre::message::header::HeaderValue::new(
//!             lettre::message::header::HeaderName::new_from_ascii_str("Idempotency-Key"),
//!             "welcome:ada".to_owned(),
//!         ))
//!         .body(String::from("Welcome aboard."))
//!         .unwrap()
//! };
//! assert!(matches!(mailer.send(welcome()).await, Ok(Delivery::Sent(()))));
//! assert!(matches!(mailer.send(welcome()).await, Ok(Delivery::Replayed(()))));
//! assert_eq!(stub.messages().await.len(), 1, "the job ran twice, one message went");
//! # }
//! ```
//!
//! # The key
//!
//! By default the message's `Idempotency-Key` header ([`key_header`] names another); with
//! [`key_from_message_id`], its `Message-ID`; or given by the caller with
//! [`SendOnceTransport::send_with_key`]. A message without a key is sent as it is and
//! answered [`Delivery::SentWithoutKey`] ([`require_key`] refuses it instead).
//!
//! lettre's message builder adds no `Message-ID` (only `message_id(None)` does, a random one
//! per build, which de-duplicates nothing): set a stable one, such as
//! `<welcome-42@shop.example>`. With [`key_from_message_id`] a message without one is refused
//! ([`OutboundError::KeyMissing`]), not sent unguarded.
//!
//! The adapter's keys have their own namespace ([`DEFAULT_NAMESPACE`]), apart from the HTTP
//! adapter's: one job key used for a mail and for a charge is two keys.
//!
//! **The fingerprint** covers the envelope (sender and every recipient, `Bcc` included), every
//! header but `Date`, `Message-ID` and the key header, each MIME part's headers (a multipart's
//! random boundary left out) and body, and for an attachment (`Content-Disposition:
//! attachment`) its headers only: its name and type, not its bytes. A schedule or any other
//! header of yours counts as a header.
//!
//! # What the transport's answers mean
//!
//! | answer | verdict | key |
//! | --- | --- | --- |
//! | `Ok` (for SMTP, the 250 reply to the end of the data) | sent: the reply is the receipt | completed |
//! | SMTP 4xx reply to any command, the end of the data included ([`Error::is_transient`]) | failed, retryable | released |
//! | SMTP 5xx reply ([`Error::is_permanent`]) | failed | released |
//! | the connection could not be made (lettre's connection kind: refused, DNS, no address, TLS setup) | failed, retryable | released |
//! | the transport was shut down ([`Error::is_transport_shutdown`]) | failed, retryable | released |
//! | the send took longer than [`timeout`] (default 60 s): a server that took the data and stalls before its reply | unknown | held |
//! | lettre's timeout, a network error (an unreachable host included), a reply that does not parse ([`Error::is_response`]), a client error ([`Error::is_client`]) | unknown | held |
//!
//! lettre's errors do not say which command failed, so a network error is unknown wherever it
//! happened: the key is held for the [hold time](SendOnceTransportBuilder::hold) (default ten
//! minutes), not released. An SMTP server replies to the end of the data only once it has
//! taken the message; a timeout waiting for that reply is the classic "it may have gone".
//! lettre 0.11 has no predicate for its connection kind (made only while connecting, before
//! any command): the adapter reads the kind's name from the error's `Debug`. Should a later
//! lettre print it otherwise, a failed connection is read as unknown: its key is held, and
//! nothing is ever sent twice.
//!
//! lettre's async SMTP transport bounds only its connect with its own timeout, so the wrapper
//! bounds each whole send with [`timeout`].
//!
//! [`key_header`]: SendOnceTransportBuilder::key_header
//! [`key_from_message_id`]: SendOnceTransportBuilder::key_from_message_id
//! [`timeout`]: SendOnceTransportBuilder::timeout
//! [`require_key`]: SendOnceTransportBuilder::require_key
//! [`Error::is_transient`]: lettre::transport::smtp::Error::is_transient
//! [`Error::is_permanent`]: lettre::transport::smtp::Error::is_permanent
//! [`Error::is_transport_shutdown`]: lettre::transport::smtp::Error::is_transport_shutdown
//! [`Error::is_response`]: lettre::transport::smtp::Error::is_response
//! [`Error::is_client`]: lettre::transport::smtp::Error::is_client

use super::BatchResults;
use super::classify::{Classify, Verdict};
use super::delivery::{Delivery, OutboundError};
use super::identify::{Identify, Identity};
use super::receipt::{Receipt, ReceiptError};
use super::service::{BoxFuture, SendOnce, SendOnceLayer};
use crate::engine::{Engine, Fingerprint, FingerprintBuilder, KeyError, Scope};
use crate::engine::key::IdempotencyKey;
use crate::store::Store;
use bytes::Bytes;
use lettre::address::Envelope;
use lettre::{AsyncTransport, Message};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The default namespace of the mail adapter's keys (the HTTP adapter and the generic door
/// have their own).
pub const DEFAULT_NAMESPACE: &str = "outbound/mail";

/// The default bound of one send (the `timeout` lettre's SMTP transport uses for commands).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// An outgoing email as the door sees it: its envelope, its formatted bytes and the key the
/// caller gave, if any.
#[derive(Clone, Debug)]
pub struct Mail {
    envelope: Envelope,
    raw: Vec<u8>,
    key: Option<String>,
}

impl Mail {
    /// A message, formatted as lettre sends it.
    #[must_use]
    pub fn new(message: &Message) -> Self {
        Self {
            envelope: message.envelope().clone(),
            raw: message.formatted(),
            key: None,
        }
    }

    /// Formatted bytes and their envelope (what `AsyncTransport::send_raw` takes).
    #[must_use]
    pub fn raw(envelope: Envelope, raw: Vec<u8>) -> Self {
        Self {
            envelope,
            raw,
            key: None,
        }
    }

    /// The same mail under a key given by the caller (it wins over the message's headers).
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// Why a send failed: the transport's error, or the send ran past the timeout.
#[derive(Debug)]
#[non_exhaustive]
pub enum MailError<E> {
    /// The transport's error.
    Transport(E),
    /// The send took longer than the timeout (its delivery is unknown).
    Timeout(Duration),
}

impl<E: fmt::Display> fmt::Display for MailError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport(e) => write!(f, "the mail transport failed: {e}"),
            Self::Timeout(d) => write!(f, "the send took longer than {d:?}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for MailError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Transport(e) => Some(e),
            Self::Timeout(_) => None,
        }
    }
}

/// What a transport's error says about the message. Implemented for lettre's SMTP and stub
/// errors; implement it for the error of a transport of your own.
pub trait TransportVerdict {
    /// Failed (nothing went) or unknown (it may have gone).
    fn verdict(&self) -> Verdict;
}

impl TransportVerdict for lettre::transport::smtp::Error {
    fn verdict(&self) -> Verdict {
        // A negative reply (to any command, the end of the data included) took nothing.
        if self.is_permanent() {
            Verdict::Failed { retryable: false }
        } else if self.is_transient() || self.is_transport_shutdown() {
            Verdict::Failed { retryable: true }
        } else if self.is_response() || self.is_client() || self.is_timeout() {
            Verdict::Unknown
        } else if is_connection_kind(self) {
            Verdict::Failed { retryable: true }
        } else {
            Verdict::Unknown
        }
    }
}

/// lettre's connection kind (made only while connecting or setting up TLS, before any
/// command): lettre 0.11 has no predicate for it, so its name is read from the derived
/// `Debug` of the kind. Anything else reads as not a connection error: the safe side.
fn is_connection_kind(e: &lettre::transport::smtp::Error) -> bool {
    const KIND: &str = "lettre::transport::smtp::Error { kind: Connection";
    format!("{e:?}")
        .strip_prefix(KIND)
        .is_some_and(|rest| rest.starts_with([',', ' ']))
}

impl TransportVerdict for lettre::transport::stub::Error {
    fn verdict(&self) -> Verdict {
        Verdict::Failed { retryable: false }
    }
}

/// The classifier of the mail adapter: `Ok` is sent, a timeout unknown, a transport's error
/// as its [`TransportVerdict`] says (the table in the [module docs](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct MailClassifier;

impl<R, E: TransportVerdict> Classify<R, MailError<E>> for MailClassifier {
    fn classify(&self, result: Result<&R, &MailError<E>>) -> Verdict {
        match result {
            Ok(_) => Verdict::Sent,
            Err(MailError::Timeout(_)) => Verdict::Unknown,
            Err(MailError::Transport(e)) => e.verdict(),
        }
    }
}

/// Where the key of a message is read.
#[derive(Clone, Debug)]
enum KeyFrom {
    Header(String),
    MessageId,
}

/// Reads a mail's key and fingerprint (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct MailIdentify {
    from: KeyFrom,
}

impl Default for MailIdentify {
    fn default() -> Self {
        Self {
            from: KeyFrom::Header("idempotency-key".to_owned()),
        }
    }
}

impl Identify<Mail> for MailIdentify {
    fn identify(&self, mail: &Mail) -> Result<Option<Identity>, KeyError> {
        let (head, _) = split_head(&mail.raw);
        let headers = parse_headers(head);
        let key_header = match &self.from {
            KeyFrom::Header(name) => name.as_str(),
            KeyFrom::MessageId => "message-id",
        };
        let key = match &mail.key {
            Some(k) => k.clone(),
            None => match headers.iter().find(|(n, _)| n == key_header) {
                Some((_, v)) => v.clone(),
                None => return Ok(None),
            },
        };
        let key = IdempotencyKey::new(&key)?;
        let mut fp = Fingerprint::builder().field(b"envelope").field(
            mail.envelope
                .from()
                .map_or("", AsRef::<str>::as_ref)
                .as_bytes(),
        );
        for to in mail.envelope.to() {
            fp = fp.field(AsRef::<str>::as_ref(to).as_bytes());
        }
        let fp = fingerprint_part(fp, &mail.raw, Some(key_header), 0);
        Ok(Some(Identity::new(key, fp.finish())))
    }
}

/// Nested multiparts deeper than this are fingerprinted as bytes.
const MAX_DEPTH: usize = 16;

/// Folds a MIME entity (the message, or one of its parts) into the fingerprint.
fn fingerprint_part(
    mut fp: FingerprintBuilder,
    entity: &[u8],
    top_key_header: Option<&str>,
    depth: usize,
) -> FingerprintBuilder {
    let (head, body) = split_head(entity);
    let headers = parse_headers(head);
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let content_type = value("content-type").unwrap_or("text/plain");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let boundary = essence
        .starts_with("multipart/")
        .then(|| param(content_type, "boundary"))
        .flatten();
    for (name, v) in &headers {
        let skip =
            top_key_header.is_some_and(|k| name == "date" || name == "message-id" || name == k);
        if skip {
            continue;
        }
        fp = fp.field(name.as_bytes());
        // A multipart's boundary is random per build: its type alone tells it.
        fp = if name == "content-type" && boundary.is_some() {
            fp.field(essence.as_bytes())
        } else {
            fp.field(v.as_bytes())
        };
    }
    let attachment = value("content-disposition").is_some_and(|d| {
        d.trim_start()
            .to_ascii_lowercase()
            .starts_with("attachment")
    });
    match boundary {
        Some(b) if depth < MAX_DEPTH => {
            for part in mime_parts(body, b.as_bytes()) {
                fp = fingerprint_part(fp.field(b"part"), part, None, depth + 1);
            }
            fp
        }
        _ if attachment => fp.field(b"attachment"),
        _ => fp.field(b"body").field(body),
    }
}

/// The head and body of an entity, split at the first empty line.
fn split_head(entity: &[u8]) -> (&[u8], &[u8]) {
    if let Some(i) = entity.windows(4).position(|w| w == b"\r\n\r\n") {
        (&entity[..i], &entity[i + 4..])
    } else if let Some(i) = entity.windows(2).position(|w| w == b"\n\n") {
        (&entity[..i], &entity[i + 2..])
    } else {
        (entity, &[])
    }
}

/// Header fields with lowercase names and unfolded, trimmed values, in order.
fn parse_headers(head: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(head);
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = out.last_mut() {
                v.push(' ');
                v.push_str(line.trim());
            }
        } else if let Some((n, v)) = line.split_once(':') {
            out.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    out
}

/// A parameter of a header value (`boundary="abc"` → `abc`).
fn param(value: &str, name: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|p| {
        let (n, v) = p.split_once('=')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The parts of a multipart body: between `--boundary` lines, up to `--boundary--`.
fn mime_parts<'a>(body: &'a [u8], boundary: &[u8]) -> Vec<&'a [u8]> {
    let mut delimiter = b"--".to_vec();
    delimiter.extend_from_slice(boundary);
    let mut starts = Vec::new();
    let mut i = 0;
    while let Some(at) = find(&body[i..], &delimiter) {
        let pos = i + at;
        let at_line_start = pos == 0 || body[pos - 1] == b'\n';
        i = pos + delimiter.len();
        if at_line_start {
            starts.push(pos);
        }
    }
    let mut parts = Vec::new();
    for w in starts.windows(2) {
        let (from, to) = (w[0] + delimiter.len(), w[1]);
        if body[from..].starts_with(b"--") {
            break;
        }
        let mut part = &body[from..to];
        part = part
            .strip_prefix(b"\r\n")
            .or_else(|| part.strip_prefix(b"\n"))
            .unwrap_or(part);
        part = part
            .strip_suffix(b"\r\n")
            .or_else(|| part.strip_suffix(b"\n"))
            .unwrap_or(part);
        parts.push(part);
    }
    parts
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An SMTP reply as a receipt: kept as its wire text (`250-…\r\n250 …\r\n`).
impl Receipt for lettre::transport::smtp::response::Response {
    fn to_bytes(&self) -> Result<Bytes, ReceiptError> {
        let code = self.code().to_string();
        let lines: Vec<&str> = self.message().collect();
        let mut out = String::new();
        if lines.is_empty() {
            out.push_str(&code);
            out.push_str(" \r\n");
        }
        for (i, line) in lines.iter().enumerate() {
            let sep = if i + 1 == lines.len() { ' ' } else { '-' };
            out.push_str(&format!("{code}{sep}{line}\r\n"));
        }
        Ok(Bytes::from(out))
    }

    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError> {
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| ReceiptError::with_source("an SMTP reply that is not UTF-8", e))?;
        Self::from_str(text).map_err(|e| ReceiptError::with_source("not an SMTP reply", e))
    }
}

/// A lettre transport as a tower service of [`Mail`], each send bounded by a timeout.
pub struct TransportService<T> {
    transport: Arc<T>,
    timeout: Option<Duration>,
}

impl<T> Clone for TransportService<T> {
    fn clone(&self) -> Self {
        Self {
            transport: Arc::clone(&self.transport),
            timeout: self.timeout,
        }
    }
}

impl<T> fmt::Debug for TransportService<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportService")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<T> Service<Mail> for TransportService<T>
where
    T: AsyncTransport + Send + Sync + 'static,
    T::Ok: Send,
    T::Error: Send,
{
    type Response = T::Ok;
    type Error = MailError<T::Error>;
    type Future = BoxFuture<Result<T::Ok, MailError<T::Error>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mail: Mail) -> Self::Future {
        let (transport, timeout) = (Arc::clone(&self.transport), self.timeout);
        Box::pin(async move {
            let send = transport.send_raw(&mail.envelope, &mail.raw);
            match timeout {
                Some(t) => match tokio::time::timeout(t, send).await {
                    Ok(res) => res.map_err(MailError::Transport),
                    Err(_) => Err(MailError::Timeout(t)),
                },
                None => send.await.map_err(MailError::Transport),
            }
        })
    }
}

/// The send-once door over a lettre transport; itself an [`AsyncTransport`] whose `Ok` is the
/// [`Delivery`] and whose `Error` is the [`OutboundError`]. Made by
/// [`SendOnceTransport::builder`].
pub struct SendOnceTransport<T, St, C = MailClassifier> {
    door: SendOnce<TransportService<T>, St, MailIdentify, C>,
}

impl<T, St, C: Clone> Clone for SendOnceTransport<T, St, C> {
    fn clone(&self) -> Self {
        Self {
            door: self.door.clone(),
        }
    }
}

impl<T, St, C> fmt::Debug for SendOnceTransport<T, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendOnceTransport")
            .field("door", &self.door)
            .finish()
    }
}

/// The answer of a [`SendOnceTransport`] send.
pub type MailDelivery<T> =
    Delivery<<T as AsyncTransport>::Ok, MailError<<T as AsyncTransport>::Error>>;
/// The error of a [`SendOnceTransport`] send.
pub type MailSendError<T> = OutboundError<MailError<<T as AsyncTransport>::Error>>;

impl<T, St: Store> SendOnceTransport<T, St> {
    /// A builder over `transport`, with keys claimed through `engine`.
    pub fn builder(transport: T, engine: Engine<St>) -> SendOnceTransportBuilder<T, St> {
        SendOnceTransportBuilder {
            transport,
            layer: SendOnceLayer::new(engine, ())
                .classify(MailClassifier)
                .namespace(DEFAULT_NAMESPACE),
            identify: MailIdentify::default(),
            timeout: Some(DEFAULT_SEND_TIMEOUT),
            require_key: None,
        }
    }
}

impl<T, St, C> SendOnceTransport<T, St, C>
where
    T: AsyncTransport + Send + Sync + 'static,
    T::Ok: Receipt + Send + 'static,
    T::Error: Send + 'static,
    St: Store,
    C: Classify<T::Ok, MailError<T::Error>> + Clone + Send + Sync + 'static,
{
    /// Sends `message` under `key` (given by the caller; the message's headers are not read
    /// for a key).
    ///
    /// # Errors
    /// See [`OutboundError`].
    pub async fn send_with_key(
        &self,
        key: &str,
        message: Message,
    ) -> Result<MailDelivery<T>, MailSendError<T>> {
        self.send_mail(Mail::new(&message).with_key(key)).await
    }

    /// Sends a [`Mail`].
    ///
    /// # Errors
    /// See [`OutboundError`].
    pub async fn send_mail(&self, mail: Mail) -> Result<MailDelivery<T>, MailSendError<T>> {
        let mut door = self.door.clone();
        std::future::poll_fn(|cx| door.poll_ready(cx)).await?;
        door.call(mail).await
    }

    /// Sends many messages: each key claimed first, the fresh ones sent one after another,
    /// repeats (in this batch too) answered in place (see [`SendOnce::send_each`]).
    pub async fn send_many(&self, mails: Vec<Mail>) -> BatchResults<T::Ok, MailError<T::Error>> {
        self.door.clone().send_each(mails).await
    }

    /// The wrapped transport.
    pub fn transport(&self) -> &T {
        &self.door.get_ref().transport
    }
}

#[async_trait::async_trait]
impl<T, St, C> AsyncTransport for SendOnceTransport<T, St, C>
where
    T: AsyncTransport + Send + Sync + 'static,
    T::Ok: Receipt + Send + 'static,
    T::Error: Send + 'static,
    St: Store,
    C: Classify<T::Ok, MailError<T::Error>> + Clone + Send + Sync + 'static,
{
    type Ok = MailDelivery<T>;
    type Error = MailSendError<T>;

    async fn send(&self, message: Message) -> Result<Self::Ok, Self::Error> {
        self.send_mail(Mail::new(&message)).await
    }

    async fn send_raw(&self, envelope: &Envelope, email: &[u8]) -> Result<Self::Ok, Self::Error> {
        self.send_mail(Mail::raw(envelope.clone(), email.to_vec()))
            .await
    }

    async fn shutdown(&self) {
        self.door.get_ref().transport.shutdown().await;
    }
}

/// Builds a [`SendOnceTransport`]; made by [`SendOnceTransport::builder`].
#[must_use]
pub struct SendOnceTransportBuilder<T, St, C = MailClassifier> {
    transport: T,
    layer: SendOnceLayer<St, (), C>,
    identify: MailIdentify,
    timeout: Option<Duration>,
    require_key: Option<bool>,
}

impl<T, St, C> fmt::Debug for SendOnceTransportBuilder<T, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendOnceTransportBuilder")
            .field("layer", &self.layer)
            .field("identify", &self.identify)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<T, St: Store, C> SendOnceTransportBuilder<T, St, C> {
    /// Reads the key from this header instead of `Idempotency-Key`.
    pub fn key_header(mut self, name: &str) -> Self {
        self.identify.from = KeyFrom::Header(name.to_ascii_lowercase());
        self
    }

    /// Reads the key from the `Message-ID` header. lettre adds none: set a stable one
    /// (`MessageBuilder::message_id(Some(..))`). A message without one is refused with
    /// [`OutboundError::KeyMissing`] unless [`require_key(false)`](Self::require_key).
    pub fn key_from_message_id(mut self) -> Self {
        self.identify.from = KeyFrom::MessageId;
        self
    }

    /// Bounds each send (default 60 s); a send past it is an unknown delivery. `None`: no
    /// bound but the transport's own.
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// See [`SendOnceLayer::namespace`] (default [`DEFAULT_NAMESPACE`]).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.layer = self.layer.namespace(namespace);
        self
    }

    /// See [`SendOnceLayer::scope`].
    pub fn scope(mut self, scope: Scope) -> Self {
        self.layer = self.layer.scope(scope);
        self
    }

    /// See [`SendOnceLayer::hold`] (default ten minutes).
    pub fn hold(mut self, hold: Duration) -> Self {
        self.layer = self.layer.hold(hold);
        self
    }

    /// See [`SendOnceLayer::wait_in_flight`].
    pub fn wait_in_flight(mut self, bound: Duration) -> Self {
        self.layer = self.layer.wait_in_flight(bound);
        self
    }

    /// Refuses a message without a key ([`OutboundError::KeyMissing`], nothing sent) or sends
    /// it as it is ([`Delivery::SentWithoutKey`]). Default: refused when the key is the
    /// `Message-ID` ([`key_from_message_id`](Self::key_from_message_id)), sent otherwise.
    pub fn require_key(mut self, on: bool) -> Self {
        self.require_key = Some(on);
        self
    }

    /// Decides sent / failed / unknown with `classify` instead of [`MailClassifier`].
    pub fn classify<C2>(self, classify: C2) -> SendOnceTransportBuilder<T, St, C2> {
        SendOnceTransportBuilder {
            transport: self.transport,
            layer: self.layer.classify(classify),
            identify: self.identify,
            timeout: self.timeout,
            require_key: self.require_key,
        }
    }

    /// The transport.
    pub fn build(self) -> SendOnceTransport<T, St, C>
    where
        C: Clone,
    {
        let require = self
            .require_key
            .unwrap_or(matches!(self.identify.from, KeyFrom::MessageId));
        let layer = self.layer.require_key(require).identify(self.identify);
        SendOnceTransport {
            door: layer.layer(TransportService {
                transport: Arc::new(self.transport),
                timeout: self.timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(subject: &str, attachment: &[u8]) -> Mail {
        use lettre::message::{Attachment, MultiPart, SinglePart, header::ContentType};
        let message = Message::builder()
            .from(
                "shop@example.com"
                    .parse()
                    .unwrap_or_else(|_| unreachable!()),
            )
            .to("ada@example.com".parse().unwrap_or_else(|_| unreachable!()))
            .subject(subject)
            .multipart(
                MultiPart::mixed()
                    .singlepart(SinglePart::plain(String::from("Your invoice.")))
                    .singlepart(Attachment::new(String::from("invoice.pdf")).body(
                        attachment.to_vec(),
                        ContentType::parse("application/pdf").unwrap_or(ContentType::TEXT_PLAIN),
                    )),
            )
            .unwrap_or_else(|_| unreachable!());
        Mail::new(&message).with_key("invoice-1")
    }

    fn fp(m: &Mail) -> Fingerprint {
        *MailIdentify::default()
            .identify(m)
            .ok()
            .flatten()
            .map(|i| i.fingerprint().to_owned())
            .as_ref()
            .unwrap_or(&Fingerprint::from_bytes([0; 32]))
    }

    #[test]
    fn two_builds_of_one_message_have_one_fingerprint() {
        // Each build has its own Date, Message-ID and MIME boundary.
        assert_eq!(
            fp(&mail("Invoice", b"%PDF-1")),
            fp(&mail("Invoice", b"%PDF-1"))
        );
    }

    #[test]
    fn attachment_bytes_do_not_count_but_the_subject_does() {
        assert_eq!(
            fp(&mail("Invoice", b"%PDF-1")),
            fp(&mail("Invoice", b"%PDF-2 other bytes"))
        );
        assert_ne!(
            fp(&mail("Invoice", b"%PDF-1")),
            fp(&mail("Invoice!", b"%PDF-1"))
        );
    }

    #[test]
    fn an_smtp_reply_round_trips_as_a_receipt() {
        use lettre::transport::smtp::response::Response;
        let reply = Response::from_str("250-queued as 1A2B\r\n250 OK\r\n")
            .unwrap_or_else(|_| unreachable!());
        let back = Response::from_bytes(reply.to_bytes().unwrap_or_default())
            .unwrap_or_else(|_| unreachable!());
        assert_eq!(back, reply);
    }
}

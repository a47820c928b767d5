//! A scripted provider: each message says what the provider does with it, and the provider
//! counts what reached it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;
use tower::Service;
use tower_idempotency::Store;
use tower_idempotency::engine::{Classify, Engine, Verdict};
use tower_idempotency::outbound::{DefaultClassifier, Identity, NotSent, SendOnce, SendOnceLayer};
use tower_layer::Layer;

/// What the provider does with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    /// Takes it, answers a receipt.
    Take,
    /// The client's connect stage fails ([`NotSent`]): nothing reaches the provider.
    Refuse,
    /// Takes it, then the established connection reports `EHOSTUNREACH` (as Linux does
    /// after an ICMP "host unreachable" while the answer was awaited).
    Unreachable,
    /// Takes it, then the connection resets before the answer.
    Reset,
    /// Answers that it takes nothing (a definite rejection).
    Reject,
    /// Takes it and never answers (until `Provider::open`).
    Stall,
}

/// An outgoing message: its key, its content (the fingerprint) and the provider's script
/// (not part of the fingerprint: a retry meets other network conditions).
#[derive(Clone, Debug)]
pub(crate) struct Msg {
    pub(crate) key: Option<String>,
    pub(crate) body: String,
    pub(crate) act: Act,
}

impl Msg {
    pub(crate) fn new(key: &str, body: &str, act: Act) -> Self {
        Self {
            key: Some(key.to_owned()),
            body: body.to_owned(),
            act,
        }
    }
}

pub(crate) fn identify(m: &Msg) -> Result<Option<Identity>, tower_idempotency::engine::KeyError> {
    m.key
        .as_deref()
        .map(|k| Identity::of(k, [m.body.as_bytes()]))
        .transpose()
}

/// The default classifier, plus "rejected: …" receipts read as a definite rejection.
pub(crate) fn classify(res: &Result<String, io::Error>) -> Verdict {
    match res {
        Ok(r) if r.starts_with("rejected") => Verdict::Fail,
        other => DefaultClassifier.classify(other),
    }
}

type IdentifyFn = fn(&Msg) -> Result<Option<Identity>, tower_idempotency::engine::KeyError>;
type ClassifyFn = fn(&Result<String, io::Error>) -> Verdict;
pub(crate) type Door<St> = SendOnce<Provider, St, IdentifyFn, ClassifyFn>;

#[derive(Clone, Default)]
pub(crate) struct Provider {
    received: Arc<AtomicUsize>,
    gate: Arc<Notify>,
}

impl Provider {
    /// Messages that reached the provider.
    pub(crate) fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
    /// Lets a stalled send answer.
    pub(crate) fn open(&self) {
        self.gate.notify_waiters();
    }

    fn handle(&self, m: Msg) -> impl Future<Output = Result<String, io::Error>> + Send + 'static {
        let (received, gate) = (Arc::clone(&self.received), Arc::clone(&self.gate));
        async move {
            if m.act == Act::Refuse {
                let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
                return Err(io::Error::other(NotSent::new(refused)));
            }
            if m.act == Act::Reject {
                return Ok(format!("rejected: {}", m.body));
            }
            let n = received.fetch_add(1, Ordering::SeqCst) + 1;
            match m.act {
                Act::Reset => Err(io::Error::from(io::ErrorKind::ConnectionReset)),
                Act::Unreachable => Err(io::Error::from(io::ErrorKind::HostUnreachable)),
                Act::Stall => {
                    gate.notified().await;
                    Ok(format!("receipt {n}: {}", m.body))
                }
                _ => Ok(format!("receipt {n}: {}", m.body)),
            }
        }
    }
}

impl Service<Msg> for Provider {
    type Response = String;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<String, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, m: Msg) -> Self::Future {
        Box::pin(self.handle(m))
    }
}

/// The door over `store` with this lease and, when given, hold time.
pub(crate) fn door<St: Store>(
    store: St,
    lease: Duration,
    hold: Option<Duration>,
) -> (Door<St>, Provider) {
    door_with(
        Engine::builder(store).lease(lease).build(),
        |layer| match hold {
            Some(h) => layer.hold(h),
            None => layer,
        },
    )
}

/// The generic door's layer over the rig's identify and classify.
pub(crate) type RigLayer<St> = SendOnceLayer<St, IdentifyFn, ClassifyFn>;

/// The door over `engine`, its layer set up by `settings`.
pub(crate) fn door_with<St: Store>(
    engine: Engine<St>,
    settings: impl FnOnce(RigLayer<St>) -> RigLayer<St>,
) -> (Door<St>, Provider) {
    let layer = SendOnceLayer::new(engine, identify as IdentifyFn).classify(classify as ClassifyFn);
    let provider = Provider::default();
    (settings(layer).layer(provider.clone()), provider)
}

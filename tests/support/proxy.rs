//! A small TCP proxy for fault tests: `127.0.0.1:<free port>` ↔ a target port (Redis, or an
//! HTTP server), with faults switched at run time.
//!
//! | fault | what the client sees |
//! | --- | --- |
//! | [`Proxy::set_latency`] | every chunk, both ways, is held for the delay before it is forwarded |
//! | [`Proxy::black_hole`] | connections (old and new) stay open but nothing is forwarded; bytes wait in the socket buffers, as in a network partition that TCP has not yet given up on |
//! | [`Proxy::drop_all`] | every open connection is closed at once; bytes held by a black hole are lost with it |
//! | [`Proxy::freeze_existing`] | the connections open now go silent for good but stay open (a half-open TCP connection: the peer or a middlebox lost its state and no reset arrives); new connections work |
//! | [`Proxy::restore`] | no latency, no black hole: held bytes flow again (a healed partition) |
//! | [`Proxy::cut_responses`] | the next `n` answers are lost: a connection is closed (or reset) when the first byte from the target arrives, so the request was served but its answer never reaches the client |
//! | [`Proxy::hold_responses`] | the next `n` answers are held for a delay before their first byte is forwarded (a slow network after the work was done) |
//!
//! Nothing is ever dropped from the middle of a stream: a fault either delays bytes or closes
//! the whole connection, as real networks do under TCP.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy's current fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mode {
    /// Held per chunk before it is forwarded.
    pub(crate) latency: Duration,
    /// Nothing is forwarded while set.
    pub(crate) black_hole: bool,
}

impl Mode {
    const NORMAL: Self = Self {
        latency: Duration::ZERO,
        black_hole: false,
    };
}

/// How [`Proxy::cut_responses`] ends a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// An orderly close (FIN): the client sees the connection end before the answer.
    Close,
    /// A reset (RST, `SO_LINGER` 0): the client sees `ECONNRESET`.
    Reset,
}

/// What happens to the next answers from the target ([`Proxy::cut_responses`],
/// [`Proxy::hold_responses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerFault {
    Cut(Cut),
    Hold(Duration),
}

/// The answers still to be cut or held, and how.
#[derive(Debug)]
struct AnswerFaults {
    remaining: AtomicUsize,
    fault: std::sync::Mutex<AnswerFault>,
}

impl AnswerFaults {
    fn new() -> Self {
        Self {
            remaining: AtomicUsize::new(0),
            fault: std::sync::Mutex::new(AnswerFault::Cut(Cut::Close)),
        }
    }

    fn set(&self, n: usize, fault: AnswerFault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
        self.remaining.store(n, Ordering::SeqCst);
    }

    /// Takes one fault if any is left.
    fn take(&self) -> Option<AnswerFault> {
        self.remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| *self.fault.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A running proxy; stops (closing every connection) when dropped.
#[derive(Debug)]
pub(crate) struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped by `drop_all`; a connection closes when it sees a newer generation.
    generation: watch::Sender<u64>,
    /// Bumped by `freeze_existing`; a connection of an older epoch forwards nothing again.
    epoch: Arc<AtomicU64>,
    accepted: Arc<AtomicUsize>,
    forwarded: Arc<AtomicU64>,
    cuts: Arc<AnswerFaults>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `127.0.0.1:target`.
    pub(crate) async fn start(target: u16) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the proxy");
        Self::on(listener, target)
    }

    /// Starts a proxy accepting on `listener` in front of `127.0.0.1:target`.
    pub(crate) fn on(listener: TcpListener, target: u16) -> Self {
        let addr = listener.local_addr().expect("proxy address");
        let (mode, _) = watch::channel(Mode::NORMAL);
        let (generation, _) = watch::channel(0u64);
        let epoch = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let forwarded = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(AnswerFaults::new());
        let task = tokio::spawn(accept_loop(
            listener,
            SocketAddr::from((Ipv4Addr::LOCALHOST, target)),
            mode.clone(),
            generation.clone(),
            Arc::clone(&epoch),
            (Arc::clone(&accepted), Arc::clone(&forwarded)),
            Arc::clone(&cuts),
        ));
        Self {
            addr,
            mode,
            generation,
            epoch,
            accepted,
            forwarded,
            cuts,
            task,
        }
    }

    /// The proxy's port.
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Holds every chunk for `latency` before forwarding it (both directions).
    pub(crate) fn set_latency(&self, latency: Duration) {
        self.mode.send_modify(|m| m.latency = latency);
    }

    /// Forwards nothing until [`restore`](Self::restore); connections stay open and new ones
    /// are accepted.
    pub(crate) fn black_hole(&self) {
        self.mode.send_modify(|m| m.black_hole = true);
    }

    /// Closes every open connection (bytes held by a black hole are lost). New connections are
    /// accepted under the current mode.
    pub(crate) fn drop_all(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// The connections open now forward nothing ever again but stay open, as a half-open TCP
    /// connection does; connections made afterwards work normally.
    pub(crate) fn freeze_existing(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// The next `n` answers from the target are lost: the connection that carries one is
    /// closed (or reset) when its first byte arrives, before anything reaches the client. The
    /// target has served the request by then (an HTTP server answers after its handler ran).
    pub(crate) fn cut_responses(&self, n: usize, how: Cut) {
        self.cuts.set(n, AnswerFault::Cut(how));
    }

    /// The next `n` answers from the target are held for `delay` before their first byte is
    /// forwarded (the target has served the request; a client that gives up meanwhile closes
    /// the connection and the answer is lost).
    pub(crate) fn hold_responses(&self, n: usize, delay: Duration) {
        self.cuts.set(n, AnswerFault::Hold(delay));
    }

    /// Answers still to be cut or held.
    pub(crate) fn cuts_left(&self) -> usize {
        self.cuts.remaining.load(Ordering::SeqCst)
    }

    /// No latency, no black hole.
    pub(crate) fn restore(&self) {
        self.mode.send_replace(Mode::NORMAL);
    }

    /// Connections accepted so far.
    pub(crate) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far (both directions).
    pub(crate) fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.drop_all();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Sender<Mode>,
    generation: watch::Sender<u64>,
    epoch: Arc<AtomicU64>,
    (accepted, forwarded): (Arc<AtomicUsize>, Arc<AtomicU64>),
    cuts: Arc<AnswerFaults>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let mode = mode.subscribe();
        let generation = generation.subscribe();
        let forwarded = Arc::clone(&forwarded);
        let epoch = Arc::clone(&epoch);
        let cuts = Arc::clone(&cuts);
        tokio::spawn(async move {
            let born = *generation.borrow();
            let era = (Arc::clone(&epoch), epoch.load(Ordering::SeqCst));
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let up = pump(
                cr,
                sw,
                mode.clone(),
                (generation.clone(), born),
                era.clone(),
                Arc::clone(&forwarded),
                None,
            );
            let down = pump(
                sr,
                cw,
                mode,
                (generation.clone(), born),
                era,
                forwarded,
                Some(cuts),
            );
            let mut gen_rx = generation;
            let dropped = async move {
                let _ = gen_rx.wait_for(|g| *g != born).await;
            };
            // The first to finish closes both halves (the others are dropped with it).
            tokio::select! {
                () = up => {}
                () = down => {}
                () = dropped => {}
            }
        });
    }
}

/// Copies one direction chunk by chunk, honouring the mode before each chunk is forwarded.
/// Stops without writing once the connection was dropped (`drop_all`), so bytes a black hole
/// held are lost with it even when the hole is restored right after. `cuts` (the direction
/// towards the client) ends the connection instead of forwarding while cuts are left.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    (generation, born): (watch::Receiver<u64>, u64),
    (epoch, era): (Arc<AtomicU64>, u64),
    forwarded: Arc<AtomicU64>,
    cuts: Option<Arc<AnswerFaults>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // A black hole does not even read: bytes wait in the kernel's buffers.
        if mode.wait_for(|m| !m.black_hole).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let latency = mode.borrow().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        // A black hole that started while this chunk was read holds it too.
        if mode.wait_for(|m| !m.black_hole).await.is_err() || *generation.borrow() != born {
            return;
        }
        // Frozen: silent for good, but the socket stays open.
        if epoch.load(Ordering::SeqCst) != era {
            std::future::pending::<()>().await;
        }
        match cuts.as_ref().and_then(|c| c.take()) {
            Some(AnswerFault::Cut(how)) => {
                if how == Cut::Reset {
                    let _ = to.as_ref().set_zero_linger();
                }
                return;
            }
            Some(AnswerFault::Hold(delay)) => tokio::time::sleep(delay).await,
            None => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        forwarded.fetch_add(n as u64, Ordering::Relaxed);
    }
}

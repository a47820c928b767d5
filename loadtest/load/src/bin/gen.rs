//! The load benchmark's generator: hyper 1 client, HTTP/1.1 keep-alive, a fixed number of
//! connections, each a task on ONE current-thread runtime (pin the process to a core with
//! `taskset`). Closed loop: each connection sends its next request when the previous answer
//! has been read completely.
//!
//! ```text
//! load-gen --addr 127.0.0.1:PORT --workload fresh|replay [--connections 64] [--warmup 2]
//!          [--duration 10] [--body 1024] [--login] [--requests N] [--no-spin] [--key-prefix f]
//! ```
//!
//! - `fresh`: every request carries a new unique `Idempotency-Key`, `<prefix>-<connection>-<n>`
//!   (`--key-prefix`, default `f`: a second run against the same server sends other keys).
//! - `replay`: connection `i` sends key `r-i` once before the clock starts (so 64 keys are
//!   stored), then repeats it: every measured request is a replay.
//! - `--login`: each connection first `POST /login`s and sends the session cookie on every
//!   request (axum-idempotent caches only for requests that carry a session).
//!
//! The generator busy-polls (a task that keeps yielding) so its core never sleeps; `--no-spin`
//! lets it sleep in epoll when it has nothing to do.
//!
//! Every request carries `x-client: c<i>` (the caller's scope), `content-type:
//! application/json` and the same ~1 KiB JSON order. Prints one JSON object on stdout:
//! requests/s, p50/p90/p99/max in µs (HDR histogram of the measured window), statuses, replays,
//! the total requests sent (all phases), and requests completed per second of the window.

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tower_idempotency_load::order_body;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

struct Conn {
    id: usize,
    sender: SendRequest<Full<Bytes>>,
    client: HeaderValue,
    cookie: Option<HeaderValue>,
}

#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    set_cookie: Option<HeaderValue>,
}

impl Conn {
    async fn connect(addr: &str, id: usize) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Self {
            id,
            sender,
            client: HeaderValue::from_str(&format!("c{id}")).expect("header"),
            cookie: None,
        }
    }

    async fn send(
        &mut self,
        path: &str,
        key: Option<HeaderValue>,
        body: Bytes,
    ) -> Result<Answer, String> {
        let mut req = Request::post(path)
            .header(http::header::HOST, "127.0.0.1")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("x-client", self.client.clone())
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        if let Some(k) = key {
            req.headers_mut().insert("idempotency-key", k);
        }
        if let Some(c) = &self.cookie {
            req.headers_mut().insert(http::header::COOKIE, c.clone());
        }
        let call = async {
            self.sender.ready().await.map_err(|e| e.to_string())?;
            let res = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| e.to_string())?;
            let status = res.status().as_u16();
            let h = res.headers();
            let replayed = ["idempotent-replayed", "idempotency-replayed"]
                .iter()
                .any(|n| h.get(*n).is_some_and(|v| v == "true"));
            let set_cookie = h.get(http::header::SET_COOKIE).cloned();
            res.into_body().collect().await.map_err(|e| e.to_string())?;
            Ok(Answer {
                status,
                replayed,
                set_cookie,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| format!("connection {}: request timed out", self.id))?
    }
}

struct Outcome {
    hist: Histogram<u64>,
    per_second: Vec<u64>,
    statuses: BTreeMap<u16, u64>,
    replayed: u64,
    sent: u64,
    errors: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = arg(&args, "--addr").expect("--addr HOST:PORT");
    let workload = arg(&args, "--workload").unwrap_or_else(|| "fresh".into());
    assert!(
        workload == "fresh" || workload == "replay",
        "--workload fresh|replay"
    );
    let connections: usize = arg(&args, "--connections").map_or(64, |v| v.parse().expect("number"));
    let warmup =
        Duration::from_secs_f64(arg(&args, "--warmup").map_or(2.0, |v| v.parse().expect("secs")));
    let duration = Duration::from_secs_f64(
        arg(&args, "--duration").map_or(10.0, |v| v.parse().expect("secs")),
    );
    let size: usize = arg(&args, "--body").map_or(1024, |v| v.parse().expect("bytes"));
    let login = args.iter().any(|a| a == "--login");
    let spin = !args.iter().any(|a| a == "--no-spin");
    let key_prefix = arg(&args, "--key-prefix").unwrap_or_else(|| "f".into());
    // A fixed count instead of a duration (for profiling under callgrind): each connection
    // sends its share, then stops; nothing is discarded as warm-up.
    let fixed: Option<u64> = arg(&args, "--requests").map(|v| v.parse().expect("number"));
    let (warmup, duration) = if fixed.is_some() {
        (Duration::ZERO, Duration::from_secs(3600))
    } else {
        (warmup, duration)
    };
    let replay = workload == "replay";

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async move {
        let body = order_body(size);
        let mut conns = Vec::with_capacity(connections);
        for i in 0..connections {
            conns.push(Conn::connect(&addr, i).await);
        }
        let mut setup_sent = 0u64;
        if login {
            for c in &mut conns {
                let a = c.send("/login", None, Bytes::new()).await.expect("login");
                let cookie = a.set_cookie.expect("a session cookie from /login");
                let pair = cookie
                    .to_str()
                    .expect("cookie")
                    .split(';')
                    .next()
                    .expect("pair")
                    .to_owned();
                c.cookie = Some(HeaderValue::from_str(&pair).expect("cookie"));
            }
        }
        if replay {
            for c in &mut conns {
                let key = HeaderValue::from_str(&format!("r-{}", c.id)).expect("key");
                let a = c
                    .send("/orders", Some(key), body.clone())
                    .await
                    .expect("pre-warm");
                setup_sent += 1;
                assert_eq!(a.status, 201, "pre-warm answered {a:?}");
            }
        }
        let start = Instant::now();
        let measure_from = start + warmup;
        let end = measure_from + duration;
        let seconds = duration.as_secs_f64().ceil() as usize;
        if spin {
            // Keep the generator's core busy: a runnable task makes the runtime poll epoll with
            // a zero timeout instead of sleeping in it, so the server's kernel never pays for
            // waking an idle core (an inter-processor interrupt, costly in a VM) with each
            // response. Without it a slower server leaves the generator idle more often and
            // pays more per response, which exaggerates its gap to the bare row.
            tokio::spawn(async move {
                while Instant::now() < end {
                    tokio::task::yield_now().await;
                }
            });
        }
        let mut tasks = Vec::new();
        for mut c in conns {
            let body = body.clone();
            let key_prefix = key_prefix.clone();
            tasks.push(tokio::spawn(async move {
                let mut o = Outcome {
                    hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
                    per_second: vec![0; seconds.max(1)],
                    statuses: BTreeMap::new(),
                    replayed: 0,
                    sent: 0,
                    errors: 0,
                };
                let replay_key = HeaderValue::from_str(&format!("r-{}", c.id)).expect("key");
                let mut n = 0u64;
                let share = fixed.map(|f| f.div_ceil(connections as u64));
                loop {
                    let t0 = Instant::now();
                    if t0 >= end || share.is_some_and(|m| o.sent >= m) {
                        break;
                    }
                    let key = if replay {
                        replay_key.clone()
                    } else {
                        n += 1;
                        HeaderValue::from_maybe_shared(Bytes::from(format!(
                            "{key_prefix}-{}-{n}",
                            c.id
                        )))
                        .expect("key")
                    };
                    o.sent += 1;
                    match c.send("/orders", Some(key), body.clone()).await {
                        Ok(a) => {
                            let t1 = Instant::now();
                            if t0 >= measure_from && t1 <= end {
                                let us = (t1 - t0).as_micros() as u64;
                                o.hist.record(us.max(1)).expect("record");
                                *o.statuses.entry(a.status).or_default() += 1;
                                o.replayed += u64::from(a.replayed);
                                let s = ((t1 - measure_from).as_secs_f64() as usize)
                                    .min(o.per_second.len() - 1);
                                o.per_second[s] += 1;
                            }
                        }
                        Err(e) => {
                            eprintln!("load-gen: {e}");
                            o.errors += 1;
                            break;
                        }
                    }
                }
                o
            }));
        }
        let mut total = Outcome {
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
            per_second: vec![0; seconds.max(1)],
            statuses: BTreeMap::new(),
            replayed: 0,
            sent: setup_sent,
            errors: 0,
        };
        for t in tasks {
            let o = t.await.expect("task");
            total.hist.add(&o.hist).expect("merge");
            for (a, b) in total.per_second.iter_mut().zip(&o.per_second) {
                *a += b;
            }
            for (s, n) in o.statuses {
                *total.statuses.entry(s).or_default() += n;
            }
            total.replayed += o.replayed;
            total.sent += o.sent;
            total.errors += o.errors;
        }
        total
    });
    let measured = out.hist.len();
    let secs = duration.as_secs_f64();
    let json = serde_json::json!({
        "workload": workload,
        "connections": connections,
        "warmup_s": warmup.as_secs_f64(),
        "duration_s": secs,
        "body_bytes": size,
        "requests": measured,
        "rps": measured as f64 / secs,
        "p50_us": out.hist.value_at_quantile(0.50),
        "p90_us": out.hist.value_at_quantile(0.90),
        "p99_us": out.hist.value_at_quantile(0.99),
        "max_us": out.hist.max(),
        "statuses": out.statuses.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        "replayed": out.replayed,
        "sent_total": out.sent, // POST /orders only (pre-warm, warm-up, measured); logins not counted
        "errors": out.errors,
        "per_second": out.per_second,
    });
    println!("{json}");
}

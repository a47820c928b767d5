//! The quickstart example's contract (issue 2: "its behaviour is a contract"), tested against
//! the built example binary run as a child process on a free port.
//!
//! The binary is `<target>/<profile>/examples/quickstart`, found next to this test binary
//! (`<target>/<profile>/deps/…`). `cargo test` builds examples before it runs tests; when only
//! this test target was built (`cargo test --test e2e quickstart::`), the binary is built once
//! with `cargo build --example quickstart` into the same target directory.

use crate::support;

#[allow(dead_code, unreachable_pub)]
use reqwest::Method;
use serde_json::json;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use support::http::{Answer, bounded, client, send};

const BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// `<target>/<profile>` of this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

/// The quickstart binary, built if it is not there yet (once per test process).
fn quickstart_binary() -> &'static Path {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BINARY.get_or_init(locate_or_build) {
        Ok(path) => path,
        Err(e) => panic!("the quickstart example is not available: {e}"),
    }
}

fn locate_or_build() -> Result<PathBuf, String> {
    let profile = profile_dir();
    let binary = profile
        .join("examples")
        .join(format!("quickstart{}", std::env::consts::EXE_SUFFIX));
    if binary.is_file() {
        return Ok(binary);
    }
    let target = profile
        .parent()
        .ok_or_else(|| format!("no target directory above {}", profile.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        "tower-idempotency-quickstart",
        "--example",
        "quickstart",
    ])
    .env("CARGO_TARGET_DIR", target)
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .stdin(Stdio::null());
    if profile.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    eprintln!(
        "building the quickstart example into {} (it was not built yet)",
        target.display()
    );
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run `cargo build --example quickstart`: {e}"))?;
    let deadline = Instant::now() + BUILD_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                return Err(format!(
                    "`cargo build --example quickstart` failed: {status}"
                ));
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`cargo build --example quickstart` took over {BUILD_TIMEOUT:?}"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("waiting for cargo: {e}")),
        }
    }
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!("cargo built, but {} is missing", binary.display()))
    }
}

/// A running quickstart; killed (and reaped) on drop.
struct Quickstart {
    child: Child,
    base: String,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Quickstart {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Quickstart {
    /// Starts the example on a free port and waits (bounded) until it accepts connections.
    async fn start() -> Self {
        let binary = quickstart_binary();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut child = Command::new(binary)
            .env("PORT", port.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // Drain both pipes so the child never blocks on a full pipe.
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&stdout);
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().expect("stdout lines").push(line);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let text = Arc::clone(&stderr);
        let mut err = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                text.lock()
                    .expect("stderr text")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut qs = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            stdout,
            stderr,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = qs.child.try_wait().expect("child status") {
                panic!(
                    "the quickstart exited early ({status}); stderr: {}",
                    qs.stderr.lock().expect("stderr").as_str()
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the quickstart did not accept connections within {START_TIMEOUT:?}; stderr: {}",
                qs.stderr.lock().expect("stderr").as_str()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        qs
    }

    fn order(
        &self,
        principal: &str,
        key: &str,
        body: &serde_json::Value,
    ) -> reqwest::RequestBuilder {
        client()
            .post(format!("{}/orders", self.base))
            .header("authorization", format!("Bearer {principal}"))
            .header("idempotency-key", key)
            .json(body)
    }

    async fn executions(&self) -> u64 {
        let a = send(client().get(format!("{}/stats", self.base))).await;
        assert_eq!(a.status, 200, "{}", a.describe());
        a.json()["executions"]
            .as_u64()
            .unwrap_or_else(|| panic!("`executions` in {}", a.describe()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_replays_a_repeated_order_without_running_it_again() {
    let qs = Quickstart::start().await;
    let body = json!({ "item": "book" });
    let first = send(qs.order("alice", "order-1", &body)).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(!first.is_replay());
    let id = first.json()["id"].as_str().expect("an order id").to_owned();
    assert_eq!(first.json()["item"], "book");
    assert_eq!(first.json()["execution"], 1);
    assert_eq!(
        first.header("location"),
        Some(format!("/orders/{id}").as_str())
    );
    assert!(
        first.header("set-cookie").is_some(),
        "the first answer sets a cookie"
    );
    assert!(first.header("x-request-id").is_some());

    let second = send(qs.order("alice", "order-1", &body)).await;
    assert_eq!(second.status, 201, "{}", second.describe());
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.header("location"), first.header("location"));
    assert_eq!(second.body, first.body, "the same order");
    assert!(
        second.header("set-cookie").is_none(),
        "no Set-Cookie on a replay"
    );
    assert!(
        second.header("x-request-id").is_none(),
        "no X-Request-Id on a replay"
    );
    assert_eq!(qs.executions().await, 1, "one execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_releases_a_failed_order_so_the_retry_runs_again() {
    let qs = Quickstart::start().await;
    let body = json!({ "item": "book", "fail": 503 });
    let first = send(qs.order("alice", "order-f", &body)).await;
    let retry = send(qs.order("alice", "order-f", &body)).await;
    for (n, a) in [(1, &first), (2, &retry)] {
        assert_eq!(a.status, 503, "{}", a.describe());
        assert!(!a.is_replay(), "a 503 is never replayed");
        assert_eq!(a.json()["execution"], n, "attempt {n} executed");
    }
    assert_eq!(qs.executions().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_answers_409_to_a_concurrent_duplicate_of_a_slow_order() {
    let qs = Quickstart::start().await;
    let body = json!({ "item": "book", "delay_ms": 1500 });
    let first = tokio::spawn(send(qs.order("alice", "order-slow", &body)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while qs.executions().await == 0 {
        assert!(Instant::now() < deadline, "the slow order never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dup = send(qs.order("alice", "order-slow", &body)).await;
    dup.assert_problem(409, "idempotency.in_flight");
    assert!(dup.header("retry-after").is_some());

    let first: Answer = bounded(Duration::from_secs(20), "the slow order", first)
        .await
        .expect("the slow order task");
    assert_eq!(first.status, 201, "{}", first.describe());
    let later = send(qs.order("alice", "order-slow", &body)).await;
    assert!(later.is_replay(), "{}", later.describe());
    assert_eq!(qs.executions().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_cors_preflight_from_another_origin_allows_the_idempotency_key_header() {
    let qs = Quickstart::start().await;
    let a = send(
        client()
            .request(Method::OPTIONS, format!("{}/orders", qs.base))
            .header("origin", "https://shop.example")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type,idempotency-key",
            ),
    )
    .await;
    assert!(a.status.is_success(), "{}", a.describe());
    assert_eq!(a.header("access-control-allow-origin"), Some("*"));
    let allowed = a
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    for h in ["authorization", "content-type", "idempotency-key"] {
        assert!(allowed.contains(h), "{h} is allowed: {allowed:?}");
    }
    let methods = a.header("access-control-allow-methods").unwrap_or_default();
    assert!(methods.contains("POST"), "POST is allowed: {methods:?}");
    assert_eq!(qs.executions().await, 0, "a preflight runs nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_cors_exposes_the_replayed_header() {
    let qs = Quickstart::start().await;
    let body = json!({ "item": "book" });
    for _ in 0..2 {
        let a = send(
            qs.order("alice", "order-cors", &body)
                .header("origin", "https://shop.example"),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.describe());
        assert_eq!(a.header("access-control-allow-origin"), Some("*"));
        let exposed = a
            .header("access-control-expose-headers")
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            exposed.contains("idempotent-replayed"),
            "a page can read the replay header: {exposed:?}"
        );
    }
}

/// The headers a page reads from a cross-origin answer (issue 11 item 16): `location` after
/// a 201, `retry-after` after a 409, and `idempotent-replayed` on a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_cors_exposes_location_and_retry_after() {
    let qs = Quickstart::start().await;
    let exposed = |a: &Answer| {
        assert_eq!(a.header("access-control-allow-origin"), Some("*"));
        a.header("access-control-expose-headers")
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let body = json!({ "item": "book", "delay_ms": 1500 });
    let from_page = |key: &str| {
        qs.order("alice", key, &body)
            .header("origin", "https://shop.example")
    };
    let first = tokio::spawn(send(from_page("order-cors-slow")));
    let deadline = Instant::now() + Duration::from_secs(10);
    while qs.executions().await == 0 {
        assert!(Instant::now() < deadline, "the slow order never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dup = send(from_page("order-cors-slow")).await;
    dup.assert_problem(409, "idempotency.in_flight");
    assert!(dup.header("retry-after").is_some());
    let on_409 = exposed(&dup);
    assert!(
        on_409.contains("retry-after"),
        "a page can read when to retry a 409: {on_409:?}"
    );

    let first: Answer = bounded(Duration::from_secs(20), "the slow order", first)
        .await
        .expect("the slow order task");
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(first.header("location").is_some());
    let on_201 = exposed(&first);
    for h in ["location", "idempotent-replayed", "retry-after"] {
        assert!(on_201.contains(h), "a page can read {h}: {on_201:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_stats_counts_executions() {
    let qs = Quickstart::start().await;
    assert_eq!(qs.executions().await, 0);
    let body = json!({ "item": "book" });
    send(qs.order("alice", "s-1", &body)).await;
    send(qs.order("alice", "s-1", &body)).await; // a replay
    send(qs.order("bob", "s-1", &body)).await; // another principal
    assert_eq!(qs.executions().await, 2, "two executions, one replay");
    // The key is optional: an unkeyed order runs every time.
    for _ in 0..2 {
        let a = send(
            client()
                .post(format!("{}/orders", qs.base))
                .header("authorization", "Bearer alice")
                .json(&body),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.describe());
        assert!(!a.is_replay());
    }
    assert_eq!(qs.executions().await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_refuses_a_keyed_order_without_a_principal() {
    let qs = Quickstart::start().await;
    let a = send(
        client()
            .post(format!("{}/orders", qs.base))
            .header("idempotency-key", "anon")
            .json(&json!({ "item": "book" })),
    )
    .await;
    a.assert_problem(401, "idempotency.principal_missing");
    assert_eq!(qs.executions().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_prints_how_to_try_it_with_curl() {
    let qs = Quickstart::start().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = qs.stdout.lock().expect("stdout").join("\n");
        if out.contains("curl") && out.contains(&qs.base) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the quickstart prints its address and a curl command; it printed: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! The quickstart example (`examples/quickstart`, the package `tower-idempotency-quickstart`)
//! as a child process, with the memory store or with Redis (`REDIS_URL`). It binds port 0 and
//! its first line names the port it got.
//!
//! The binary is `<target>/<profile>/examples/quickstart`, found next to the test binary
//! (`<target>/<profile>/deps/…`). `cargo test` builds examples before it runs tests; when the
//! binary is missing or older than the sources (`cargo test --test e2e quickstart::` builds only
//! the test target), it is built once per test process with
//! `cargo build -p tower-idempotency-quickstart --example quickstart --features redis` into the
//! same target directory. A binary built without `redis` serves the memory-store tests; the
//! first Redis test that meets one builds it again with the feature.

use super::http::{client, lock, send};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

const BUILD_LIMIT: Duration = Duration::from_secs(15 * 60);
const START_LIMIT: Duration = Duration::from_secs(20);
/// What the example prints when `REDIS_URL` is set but it was built without the feature.
const NO_FEATURE: &str = "without the `redis` feature";

/// `<target>/<profile>` of this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

fn quickstart_path() -> PathBuf {
    profile_dir()
        .join("examples")
        .join(format!("quickstart{}", std::env::consts::EXE_SUFFIX))
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the sources the example is built from.
fn newest_source() -> Option<SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<SystemTime>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, newest);
            } else if let Some(t) = modified(&p) {
                *newest = (*newest).max(Some(t));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut newest = None;
    walk(&root.join("src"), &mut newest);
    for f in [
        "examples/quickstart/main.rs",
        "examples/quickstart/Cargo.toml",
        "Cargo.toml",
    ] {
        newest = newest.max(modified(&root.join(f)));
    }
    newest
}

/// Builds the example with the `redis` feature into this test binary's target directory.
fn build_quickstart() -> Result<(), String> {
    let profile = profile_dir();
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
        "--features",
        "redis",
    ])
    .env("CARGO_TARGET_DIR", target)
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .stdin(Stdio::null());
    if profile.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    eprintln!(
        "building the quickstart example with `--features redis` into {}",
        target.display()
    );
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run cargo build: {e}"))?;
    let deadline = Instant::now() + BUILD_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => break,
            Ok(Some(s)) => return Err(format!("`cargo build --example quickstart` failed: {s}")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("building the quickstart took over {BUILD_LIMIT:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("waiting for cargo: {e}")),
        }
    }
    let binary = quickstart_path();
    if binary.is_file() {
        Ok(())
    } else {
        Err(format!("cargo built, but {} is missing", binary.display()))
    }
}

/// The quickstart binary, rebuilt (once per test process) when missing or older than the
/// sources; with `rebuild`, built once more (once per test process) with the `redis` feature.
fn quickstart_binary(rebuild: bool) -> PathBuf {
    static FRESH: OnceLock<Result<(), String>> = OnceLock::new();
    static FEATURED: OnceLock<Result<(), String>> = OnceLock::new();
    let path = quickstart_path();
    let fresh = FRESH.get_or_init(|| {
        let stale = match (modified(&path), newest_source()) {
            (Some(bin), Some(src)) => bin < src,
            (None, _) => true,
            (Some(_), None) => false,
        };
        if stale { build_quickstart() } else { Ok(()) }
    });
    if let Err(e) = fresh {
        panic!("the quickstart example is not available: {e}");
    }
    if rebuild && let Err(e) = FEATURED.get_or_init(build_quickstart) {
        panic!("the quickstart example could not be built with `redis`: {e}");
    }
    path
}

/// A quickstart process; killed and reaped on drop.
#[derive(Debug)]
pub(crate) struct Quickstart {
    child: Child,
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    /// `http://127.0.0.1:<port>`.
    pub(crate) base: String,
    client: reqwest::Client,
    stdout: Arc<Mutex<String>>,
    output: Arc<Mutex<String>>,
}

impl Drop for Quickstart {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Quickstart {
    /// Starts the example with the memory store (no `REDIS_URL`) on a free port and waits
    /// (bounded) until it accepts connections.
    pub(crate) async fn start_memory() -> Self {
        Self::try_start(None, quickstart_binary(false))
            .await
            .unwrap_or_else(|out| panic!("the quickstart did not start: {out}"))
    }

    /// Starts the example with `REDIS_URL=redis_url` on a free port and waits (bounded) until it
    /// accepts connections and says it uses Redis. Builds it with `--features redis` when needed.
    pub(crate) async fn start(redis_url: &str) -> Self {
        match Self::try_start(Some(redis_url), quickstart_binary(false)).await {
            Ok(qs) => qs,
            Err(out) if out.contains(NO_FEATURE) => {
                Self::try_start(Some(redis_url), quickstart_binary(true))
                    .await
                    .unwrap_or_else(|out| panic!("the quickstart did not start: {out}"))
            }
            Err(out) => panic!("the quickstart did not start: {out}"),
        }
    }

    async fn try_start(redis_url: Option<&str>, binary: PathBuf) -> Result<Self, String> {
        // Port 0: the child binds a port of its own and prints it, so no other server started
        // meanwhile can take the port between a pick and the child's bind.
        let mut cmd = Command::new(&binary);
        cmd.env("PORT", "0")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match redis_url {
            Some(url) => cmd.env("REDIS_URL", url),
            None => cmd.env_remove("REDIS_URL"),
        };
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // Both pipes are drained (stdout also on its own), so the child never blocks on a full
        // pipe.
        let stdout = Arc::new(Mutex::new(String::new()));
        let output = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().expect("piped stdout");
        let (lines, text) = (Arc::clone(&stdout), Arc::clone(&output));
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                for t in [&lines, &text] {
                    let mut t = lock(t);
                    t.push_str(&line);
                    t.push('\n');
                }
            }
        });
        let mut err = child.stderr.take().expect("piped stderr");
        let text = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                lock(&text).push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut qs = Self {
            child,
            port: 0,
            base: String::new(),
            client: client(),
            stdout,
            output,
        };
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(status) = qs.child.try_wait().expect("child status") {
                // Let the pipe readers catch up with what it said.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Err(format!("exited early ({status}): {}", qs.output()));
            }
            // Its first line names its address and its store; with Redis it must say Redis.
            if let Some(port) = listening_port(&qs.stdout())
                && (redis_url.is_none() || qs.output().contains("(redis store)"))
            {
                qs.port = port;
                qs.base = format!("http://127.0.0.1:{port}");
                return Ok(qs);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no connection within {START_LIMIT:?}: {}",
                    qs.output()
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Everything the process printed on stdout so far.
    pub(crate) fn stdout(&self) -> String {
        lock(&self.stdout).clone()
    }

    /// Everything the process printed so far (stdout and stderr).
    pub(crate) fn output(&self) -> String {
        lock(&self.output).clone()
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `POST /orders` as `principal` (`Authorization: Bearer <principal>`) with `key` and a
    /// JSON body.
    pub(crate) fn order(
        &self,
        principal: &str,
        key: &str,
        body: &serde_json::Value,
    ) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}/orders", self.base))
            .header("authorization", format!("Bearer {principal}"))
            .header("idempotency-key", key)
            .json(body)
    }

    /// The process's execution count (`GET /stats`).
    pub(crate) async fn executions(&self) -> u64 {
        let a = send(self.client.get(format!("{}/stats", self.base))).await;
        assert_eq!(a.status, 200, "{}", a.describe());
        a.json()["executions"]
            .as_u64()
            .unwrap_or_else(|| panic!("`executions` in {}", a.describe()))
    }

    /// The process's metrics in the Prometheus text format (`GET /metrics`), as
    /// `series → value` (a series is the name with its labels, as rendered).
    pub(crate) async fn metrics(&self) -> std::collections::BTreeMap<String, f64> {
        let a = send(self.client.get(format!("{}/metrics", self.base))).await;
        assert_eq!(a.status, 200, "{}", a.describe());
        assert_eq!(
            a.header("content-type"),
            Some("text/plain; version=0.0.4"),
            "the Prometheus text format"
        );
        a.text()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// Asserts the process is up and printed no panic.
    pub(crate) fn assert_healthy(&mut self) {
        let out = self.output();
        assert!(self.alive(), "the quickstart exited: {out}");
        assert!(!out.contains("panicked"), "the quickstart panicked: {out}");
    }
}

/// The port of the quickstart's first line, `tower-idempotency quickstart on
/// http://127.0.0.1:<port> (<store>)`.
fn listening_port(stdout: &str) -> Option<u16> {
    let rest = stdout.split_once("quickstart on http://127.0.0.1:")?.1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

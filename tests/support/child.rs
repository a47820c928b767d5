//! Application processes for the fault tests: this test binary started again as a child that
//! runs one `#[ignore]`d test, the child's body. A parent kills it with `kill -9`, as a crash
//! would, and reads what it printed line by line.
//!
//! A child test reads its settings with [`setting`] and returns at once when they are absent,
//! so a plain `--include-ignored` run passes through it. [`serve`] puts a router on a free
//! loopback port and prints `LISTENING <port>`; [`AppProcess`] starts such a child and waits
//! for that line.

use axum::Router;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// How long a child may take to print the line a parent waits for.
pub(crate) const START_LIMIT: Duration = Duration::from_secs(30);

/// A child's setting: the environment variable `name`, when the parent set it.
pub(crate) fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// In a child: serves `router` on a free 127.0.0.1 port, prints `LISTENING <port>`, and serves
/// until the parent kills the process.
pub(crate) async fn serve(router: Router) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    println!("LISTENING {port}");
    axum::serve(listener, router).await.expect("the server");
}

/// This test binary running the test `test` as a child process.
#[derive(Debug)]
pub(crate) struct ChildProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildProcess {
    /// Starts the child with the settings `env`. Its stderr goes to the parent's; its stdout is
    /// read line by line. The child is killed when this is dropped.
    pub(crate) fn spawn(test: &str, env: &[(&str, String)]) -> Self {
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        command
            .args([
                test,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("the child process");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits up to `within` for a line that contains `marker`, and returns what follows it.
    /// Lines before it are skipped. libtest may print its own text before a line, on the
    /// same line, hence "contains".
    pub(crate) async fn line_after(&mut self, marker: &str, within: Duration) -> String {
        let wait = async {
            while let Some(line) = self.lines.recv().await {
                if let Some(i) = line.find(marker) {
                    return Some(line[i + marker.len()..].trim().to_owned());
                }
            }
            None
        };
        match tokio::time::timeout(within, wait).await {
            Ok(Some(rest)) => rest,
            Ok(None) => panic!("the child exited before it printed {marker:?}"),
            Err(_) => panic!("the child printed no {marker:?} within {within:?}"),
        }
    }

    /// `kill -9`, then waits for the process to be gone.
    pub(crate) async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(START_LIMIT, self.child.wait()).await;
    }
}

/// A child that serves HTTP: started, and its port read from its `LISTENING` line.
#[derive(Debug)]
pub(crate) struct AppProcess {
    process: ChildProcess,
    port: u16,
}

impl AppProcess {
    /// Starts the child test `test` with the settings `env`; returns once it listens.
    pub(crate) async fn start(test: &str, env: &[(&str, String)]) -> Self {
        let mut process = ChildProcess::spawn(test, env);
        let port = process
            .line_after("LISTENING ", START_LIMIT)
            .await
            .parse()
            .expect("a port number");
        Self { process, port }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Its port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `kill -9`, as a crash would.
    pub(crate) async fn kill(&mut self) {
        self.process.kill().await;
    }
}

/// In a child: waits for the file `path` to appear, the parent's signal to start, so that
/// children started one by one act at once.
pub(crate) async fn wait_for_file(path: &str) {
    let deadline = tokio::time::Instant::now() + START_LIMIT;
    while !std::path::Path::new(path).exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no start file {path} within {START_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// In a child: the word a parent reads for an outcome of the transactional door.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn outcome_word(outcome: &tower_idempotency::transactional::Within) -> String {
    use tower_idempotency::transactional::Within;
    match outcome {
        Within::Recorded(_) => "ran".to_owned(),
        Within::Replayed(r) => format!("replayed {}", r.status),
        Within::InFlight => "in-flight".to_owned(),
        other => format!("unexpected {other:?}"),
    }
}

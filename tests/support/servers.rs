//! What every server the tests start shares: the switch that turns a missing server into a
//! failure, the temporary directory each server lives in, and the watchdog that stops a server
//! once the test process is gone. The loopback ports are [`super::ports`]'.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable that turns a missing server into a failure.
pub(crate) const REQUIRE_SERVERS: &str = "TOWER_IDEMPOTENCY_REQUIRE_SERVERS";

/// Whether a server can run, given what is `missing` for it (`None`: nothing). When something
/// is: panics if [`REQUIRE_SERVERS`] is set, so a missing server is a failure there, never a
/// skip; else prints `skipping: <missing>` once per server `kind` and returns `false` (the test
/// returns early). `install` says how to get it.
pub(crate) fn available(kind: &str, missing: Option<String>, install: &str) -> bool {
    let Some(missing) = missing else {
        return true;
    };
    assert!(
        std::env::var_os(REQUIRE_SERVERS).is_none(),
        "{REQUIRE_SERVERS} is set but {missing}; {install} (scripts/test.sh does) or unset \
         {REQUIRE_SERVERS}",
    );
    // Once per kind and test binary, and past libtest's output capture (which hides what
    // passing tests print), so a plain `cargo test` shows that the server tests did not run.
    static NOTICED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut noticed = NOTICED.lock().unwrap_or_else(|e| e.into_inner());
    if !noticed.iter().any(|k| k == kind) {
        noticed.push(kind.to_owned());
        let _ = writeln!(
            std::io::stderr(),
            "skipping: {missing}; run scripts/test.sh to run the {kind} tests"
        );
    }
    false
}

/// The first of `bin` in the directories of `PATH`.
pub(crate) fn on_path(bin: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(bin))
        .find(|p| p.is_file())
}

/// A directory name of its own for a `kind` of server on `port`, under the system's temporary
/// directory (not created): unique to this process and this start.
pub(crate) fn temp_dir(kind: &str, port: u16) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("ti-{kind}-{}-{n}-{port}", std::process::id()))
}

/// A shell loop that stops the process `server` and removes `dir` once this test process is
/// gone, so a server held in a `static` (never dropped), or left by a test that panicked, does
/// not outlive the test binary. It sends `signal` first (`"QUIT"`: PostgreSQL's immediate
/// shutdown) and `SIGKILL` 2 s later; with no signal, `SIGKILL` at once. The loop ends by
/// itself when the server does.
pub(crate) fn watchdog(server: u32, dir: &Path, signal: Option<&str>) -> Child {
    let first = signal.map_or(String::new(), |s| {
        format!("kill -{s} {server} 2>/dev/null; sleep 2; ")
    });
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {server} 2>/dev/null; do sleep 1; done; \
         {first}kill -9 {server} 2>/dev/null; \
         if ! kill -0 {parent} 2>/dev/null; then rm -rf '{dir}'; fi",
        parent = std::process::id(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the watchdog shell")
}

/// Kills and reaps a child (a server or its watchdog), if there is one.
pub(crate) fn end(child: Option<Child>) {
    if let Some(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
}

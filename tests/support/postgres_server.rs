//! A real PostgreSQL server for tests: `initdb` into a temporary directory, `pg_ctl start` on a
//! free loopback port (and a socket directory of its own), stopped with `pg_ctl stop -m
//! immediate` when dropped, or by a watchdog once the test process is gone.
//!
//! PostgreSQL refuses to run as root: when the tests run as root (as CI does), the server runs
//! as the `postgres` system user (`runuser -u postgres`), which Debian's `postgresql` package
//! creates. The binaries are found on `PATH`, else through `pg_config --bindir`, else in
//! `/usr/lib/postgresql/<version>/bin` (Debian keeps `initdb` there, off `PATH`).
//!
//! When PostgreSQL is not installed, [`available`] prints a notice and the test returns early;
//! with `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` set (as `scripts/test.sh` does) it panics, so a
//! missing server is a failure there, never a skip.

// Each test crate uses part of this.
#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The environment variable that turns a missing server into a failure.
pub const REQUIRE_SERVERS: &str = "TOWER_IDEMPOTENCY_REQUIRE_SERVERS";

/// The system user the server runs as when the tests run as root.
const SERVER_USER: &str = "postgres";

/// Where `initdb` and `pg_ctl` are, when they can be run (and, as root, the server user
/// exists).
fn bindir() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|dir| has_both(dir)));
    let from_pg_config = || {
        let out = Command::new("pg_config").arg("--bindir").output().ok()?;
        let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        has_both(&dir).then_some(dir)
    };
    let debian = || {
        let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| {
                let e = e.ok()?;
                let version = e.file_name().to_str()?.parse().ok()?;
                Some((version, e.path().join("bin")))
            })
            .filter(|(_, dir)| has_both(dir))
            .collect();
        dirs.sort();
        dirs.pop().map(|(_, dir)| dir)
    };
    on_path.or_else(from_pg_config).or_else(debian)
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

fn server_user_exists() -> bool {
    Command::new("id")
        .arg("-u")
        .arg(SERVER_USER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a PostgreSQL server can be started. When it cannot: panics if [`REQUIRE_SERVERS`]
/// is set, else prints a notice and returns `false` (skip the test).
pub fn available() -> bool {
    let missing = match bindir() {
        None => Some("initdb and pg_ctl not found (PATH, pg_config --bindir, /usr/lib/postgresql)"),
        Some(_) if running_as_root() && !server_user_exists() => {
            Some("running as root and there is no `postgres` user to run the server as")
        }
        Some(_) => None,
    };
    let Some(missing) = missing else {
        return true;
    };
    assert!(
        std::env::var_os(REQUIRE_SERVERS).is_none(),
        "{REQUIRE_SERVERS} is set but PostgreSQL cannot be started: {missing}; install it \
         (scripts/test.sh does: apt-get install postgresql) or unset {REQUIRE_SERVERS}",
    );
    static NOTICE: Once = Once::new();
    NOTICE.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "skipping: {missing}; run scripts/test.sh to run the PostgreSQL tests"
        );
    });
    false
}

/// One PostgreSQL server on a loopback port, stopped on drop.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    bindir: PathBuf,
    as_user: bool,
    watchdog: Option<Child>,
}

impl PostgresServer {
    /// A fresh cluster on a free port, with `fsync` off and room for 250 connections.
    pub fn start() -> Self {
        let bindir = bindir().expect("PostgreSQL binaries (check `available()` first)");
        let as_user = running_as_root();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut server = Self {
                port,
                dir: temp_dir(port),
                bindir: bindir.clone(),
                as_user,
                watchdog: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start PostgreSQL: {last}");
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the `postgres` database, as the `postgres` superuser (trust authentication).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A pool of up to `size` connections of the test's own.
    #[cfg(feature = "postgres")]
    pub async fn pool(&self, size: u32) -> tower_idempotency::store::postgres::sqlx::PgPool {
        tower_idempotency::store::postgres::sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&self.url())
            .await
            .expect("connect to the test server")
    }

    /// Runs a program of the server's as the server's user.
    fn command(&self, program: &str) -> Command {
        let bin = self.bindir.join(program);
        let mut cmd = if self.as_user {
            let mut c = Command::new("runuser");
            c.args(["-u", SERVER_USER, "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        // The server's user may not be allowed into the test's working directory.
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        cmd
    }

    fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        if self.as_user {
            run(Command::new("chown")
                .arg(format!("{SERVER_USER}:"))
                .arg(&self.dir))?;
        }
        let data = self.dir.join("data");
        run(self.command("initdb").arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]))?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={dir} \
             -c fsync=off -c full_page_writes=off -c max_connections=250 -c shared_buffers=64MB",
            port = self.port,
            dir = self.dir.display(),
        );
        run(self
            .command("pg_ctl")
            .arg("start")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "-o", &options]))
        .map_err(|e| {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            format!("{e}\nserver log:\n{log}")
        })?;
        let pid = std::fs::read_to_string(data.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok())
            .ok_or("no postmaster.pid after pg_ctl start")?;
        self.watchdog = Some(watchdog(pid, &self.dir));
        Ok(())
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`: no checkpoint, as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = self
                .command("pg_ctl")
                .arg("stop")
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-m", "immediate", "-w", "-t", "30"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a command to its end; its output as the error when it fails.
fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("spawning {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

fn temp_dir(port: u16) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("ti-pg-{}-{n}-{port}", std::process::id()))
}

/// A shell loop that stops the server (`SIGQUIT` to the postmaster: PostgreSQL's immediate
/// shutdown, which ends its children too) and removes its directory once this test process is
/// gone, so a server held in a `static` (never dropped) does not outlive the test binary.
fn watchdog(postmaster: u32, dir: &Path) -> Child {
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {postmaster} 2>/dev/null; do sleep 1; done; \
         kill -QUIT {postmaster} 2>/dev/null; sleep 2; kill -9 {postmaster} 2>/dev/null; \
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

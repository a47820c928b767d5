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

use super::servers::{self, temp_dir, watchdog};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The system user the server runs as when the tests run as root.
const SERVER_USER: &str = "postgres";

/// Where `initdb` and `pg_ctl` are, when they can be run (and, as root, the server user
/// exists).
fn bindir() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let on_path = servers::on_path("initdb")
        .and_then(|initdb| Some(initdb.parent()?.to_path_buf()))
        .filter(|dir| has_both(dir));
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

/// Whether a PostgreSQL server can be started (see [`servers::available`]).
pub fn available() -> bool {
    let missing = match bindir() {
        None => Some("initdb and pg_ctl not found (PATH, pg_config --bindir, /usr/lib/postgresql)"),
        Some(_) if running_as_root() && !server_user_exists() => {
            Some("running as root and there is no `postgres` user to run the server as")
        }
        Some(_) => None,
    };
    servers::available(
        "PostgreSQL",
        missing.map(str::to_owned),
        "install it (apt-get install postgresql)",
    )
}

/// One PostgreSQL server on a loopback port, stopped on drop.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    bindir: PathBuf,
    as_user: bool,
    /// Server settings (`-c name=value`) beside the defaults of [`start`](Self::start).
    extra: String,
    watchdog: Option<Child>,
}

impl PostgresServer {
    /// The test binary's one shared server, started by the first test that asks (`None`: no
    /// server can run here, skip). Its tests keep to tables of their own (a store prefix); a
    /// test that stops, kills or reconfigures its server starts one of its own. Only the
    /// process is shared: each `#[tokio::test]` has its own runtime, so each connects on its own.
    pub fn shared() -> Option<&'static Self> {
        static SERVER: OnceLock<PostgresServer> = OnceLock::new();
        available().then(|| SERVER.get_or_init(Self::start))
    }

    /// A fresh cluster on a free port, with `fsync` off and room for 250 connections.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with more server settings, such as `("synchronous_commit", "off")`.
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        let extra: String = settings
            .iter()
            .map(|(name, value)| format!(" -c {name}={value}"))
            .collect();
        let bindir = bindir().expect("PostgreSQL binaries (check `available()` first)");
        let as_user = running_as_root();
        let mut last = String::new();
        for _ in 0..5 {
            let port = super::ports::free_port(false);
            let mut server = Self {
                port,
                dir: temp_dir("pg", port),
                bindir: bindir.clone(),
                as_user,
                extra: extra.clone(),
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
        self.run_server()
    }

    /// `pg_ctl start` on the cluster in the directory, and a watchdog for it.
    fn run_server(&mut self) -> Result<(), String> {
        let data = self.dir.join("data");
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={dir} \
             -c fsync=off -c full_page_writes=off -c max_connections=250 -c shared_buffers=64MB{extra}",
            port = self.port,
            dir = self.dir.display(),
            extra = self.extra,
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
        self.watchdog = Some(watchdog(pid, &self.dir, Some("QUIT")));
        Ok(())
    }

    /// The postmaster's process id, from `postmaster.pid`.
    fn postmaster(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("data").join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `kill -9` of the postmaster and every backend, as a crash of the server would. The
    /// postmaster is stopped first (`SIGSTOP`), so that it forks nothing while its children
    /// are listed. Returns once every one of them is gone. The data directory stays:
    /// [`restart`](Self::restart) runs crash recovery on it.
    pub fn kill(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let Some(postmaster) = self.postmaster() else {
            return;
        };
        signal("STOP", &[postmaster]);
        let mut all = children(postmaster);
        all.push(postmaster);
        signal("KILL", &all);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while all.iter().any(|pid| alive(*pid)) {
            assert!(
                std::time::Instant::now() < deadline,
                "PostgreSQL processes outlived kill -9"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port and data directory, after [`kill`](Self::kill)
    /// or [`stop`](Self::stop). PostgreSQL runs crash recovery from its write-ahead log
    /// before it accepts connections; this returns once it does.
    pub fn restart(&mut self) {
        let mut last = String::new();
        for _ in 0..5 {
            match self.run_server() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart PostgreSQL: {last}");
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

/// `kill -<name> <pids>`: one command, so that they get it at once.
fn signal(name: &str, pids: &[u32]) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether `pid` is a live process (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

/// The process ids whose parent is `parent`, from `/proc`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`: comm may hold spaces, so split after its `)`.
            let ppid: u32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

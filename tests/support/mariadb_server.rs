//! A real MariaDB server for tests: `mariadb-install-db` into a temporary directory, `mariadbd`
//! on a free loopback port with a socket and pid file of its own, killed and its directory
//! removed when dropped, or by a watchdog once the test process is gone.
//!
//! Both programs run with `--no-defaults`: Debian's `/etc/mysql` settings (its socket and
//! data directory under `/run/mysqld` and `/var/lib/mysql`) are never read, so a system server,
//! running or not, is left alone. As root, the server runs as the `mysql` user that Debian's
//! `mariadb-server` package creates. The server skips its grant tables: any user name
//! connects, with every privilege, from loopback only.
//!
//! `mariadbd` cannot report a port it chose itself, so the port is a free one picked first;
//! a start that loses its port to another process is retried on another.
//!
//! When MariaDB is not installed, [`available`] prints a notice and the test returns early;
//! with `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` set (as `scripts/test.sh` does) it panics.

// Each test crate uses part of this.
#![allow(dead_code, unreachable_pub)]

use super::servers::{self, temp_dir, watchdog};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The system user the server runs as when the tests run as root.
const SERVER_USER: &str = "mysql";
/// How long a start may take before it is given up: seconds wide, for a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn program(name: &str) -> Option<PathBuf> {
    servers::on_path(name).or_else(|| {
        ["/usr/sbin", "/usr/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|p| p.is_file())
    })
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

/// Whether a MariaDB server can be started (see [`servers::available`]).
pub fn available() -> bool {
    let missing = if program("mariadbd").is_none() || program("mariadb-install-db").is_none() {
        Some("mariadbd and mariadb-install-db not found (PATH, /usr/sbin, /usr/bin)")
    } else if running_as_root() && !server_user_exists() {
        Some("running as root and there is no `mysql` user to run the server as")
    } else {
        None
    };
    servers::available(
        "MariaDB",
        missing.map(str::to_owned),
        "install it (apt-get install mariadb-server)",
    )
}

/// One MariaDB server on a loopback port, killed on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    dir: PathBuf,
    as_user: bool,
    server: Option<Child>,
    watchdog: Option<Child>,
}

impl MariaDbServer {
    /// The test binary's one shared server, started by the first test that asks (`None`: no
    /// server can run here, skip). Its tests keep to tables of their own or prefixes of their
    /// own; a test that kills its server starts one of its own.
    pub fn shared() -> Option<&'static Self> {
        static SERVER: OnceLock<MariaDbServer> = OnceLock::new();
        available().then(|| SERVER.get_or_init(Self::start))
    }

    /// A fresh data directory and server on a free port, with a database `app`.
    pub fn start() -> Self {
        let as_user = running_as_root();
        let mut last = String::new();
        for _ in 0..5 {
            let port = super::ports::free_port(false);
            let mut server = Self {
                port,
                dir: temp_dir("mariadb", port),
                as_user,
                server: None,
                watchdog: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start MariaDB: {last}");
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the `app` database (no grant tables: any user, no password).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/app", self.port)
    }

    /// A pool of up to `size` connections of the test's own.
    #[cfg(feature = "mysql")]
    pub async fn pool(&self, size: u32) -> tower_idempotency::store::mysql::sqlx::MySqlPool {
        tower_idempotency::store::mysql::sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&self.url())
            .await
            .expect("connect to the test server")
    }

    /// A program of the server's. As root, `--user` makes the program itself drop to the
    /// server's user, so the child is the server, not a wrapper around it.
    fn command(&self, program_path: &Path) -> Command {
        let mut cmd = Command::new(program_path);
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        cmd
    }

    /// `--user=mysql` as root: the program drops to it. Otherwise nothing: it runs as the
    /// test's own user.
    fn user(&self) -> Option<String> {
        self.as_user.then(|| format!("--user={SERVER_USER}"))
    }

    fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        if self.as_user {
            run(Command::new("chown")
                .arg(format!("{SERVER_USER}:"))
                .arg(&self.dir))?;
        }
        let data = self.dir.join("data");
        let install = program("mariadb-install-db").ok_or("no mariadb-install-db")?;
        run(self
            .command(&install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(self.user())
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ]))?;
        self.run_server()
    }

    /// Starts `mariadbd` on the data directory, waits until it answers, and creates `app`.
    fn run_server(&mut self) -> Result<(), String> {
        let data = self.dir.join("data");
        let mariadbd = program("mariadbd").ok_or("no mariadbd")?;
        let log = self.dir.join("server.log");
        let child = self
            .command(&mariadbd)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .args(self.user())
            .args([
                "--skip-grant-tables",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--max-connections=300",
                "--innodb-buffer-pool-size=64M",
                // The defaults kept where they matter to the store: durable commits.
                "--innodb-flush-log-at-trx-commit=1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning mariadbd: {e}"))?;
        let pid = child.id();
        self.server = Some(child);
        self.watchdog = Some(watchdog(pid, &self.dir, None));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.server.as_mut().map(Child::try_wait) {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("mariadbd exited ({status}):\n{log}"));
            }
            if self.sql("CREATE DATABASE IF NOT EXISTS app").is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("mariadbd did not answer in 60 s:\n{log}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `statement` with the `mariadb` client over the server's socket.
    pub fn sql(&self, statement: &str) -> Result<String, String> {
        let client = program("mariadb").ok_or("no mariadb client")?;
        let out = run(Command::new(client)
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .args(["-uroot", "-N", "-B", "-e", statement]))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kill -9` of the server, as a crash would. The data directory stays:
    /// [`restart`](Self::restart) runs InnoDB's crash recovery on it.
    pub fn kill(&mut self) {
        servers::end(self.watchdog.take());
        servers::end(self.server.take());
    }

    /// Starts the server again on the same port and data directory, after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        let mut last = String::new();
        for _ in 0..5 {
            match self.run_server() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("could not restart MariaDB: {last}");
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a command to its end; its output as the error when it fails.
fn run(cmd: &mut Command) -> Result<std::process::Output, String> {
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

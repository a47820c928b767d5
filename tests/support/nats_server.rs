//! A real `nats-server` with JetStream for tests: a free loopback port, a temporary store
//! directory, killed on drop (and by a watchdog if the test process dies first). A server can
//! be killed with SIGKILL and started again on the same port and store ([`NatsServer::kill`],
//! [`NatsServer::restart`]).
//!
//! When `nats-server` is not on `PATH` (Debian puts it in `/usr/sbin`, looked at too),
//! [`available`] prints a notice and the test returns early; with
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` set (as `scripts/test.sh` does) it panics.

use super::ports::free_port;
use super::servers::{self, end, temp_dir, watchdog};
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The `nats-server` binary: on `PATH`, or where Debian installs it.
fn binary() -> Option<PathBuf> {
    servers::on_path("nats-server").or_else(|| {
        let p = PathBuf::from("/usr/sbin/nats-server");
        p.is_file().then_some(p)
    })
}

/// Whether `nats-server` can be run (see [`servers::available`]).
pub(crate) fn available() -> bool {
    servers::available(
        "NATS",
        binary()
            .is_none()
            .then(|| "nats-server is not installed".to_owned()),
        "install it (Debian package nats-server)",
    )
}

/// One `nats-server -js` on a loopback port, killed on drop.
#[derive(Debug)]
pub(crate) struct NatsServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    watchdog: Option<Child>,
}

impl NatsServer {
    /// A server with JetStream on, on a free port, storing in a new temporary directory.
    pub(crate) fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port(false);
            let dir = temp_dir("nats", port);
            let mut server = Self {
                port,
                dir,
                child: None,
                watchdog: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start nats-server: {last}");
    }

    /// The server's name: its directory's, unique to this start.
    fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The address to connect to.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL, as a crash would, and keeps its store directory.
    pub(crate) fn kill(&mut self) {
        self.stop_children();
    }

    /// Starts the server again on the same port and store directory, after [`Self::kill`].
    /// Panics when it does not greet within 10 s (its port may have been taken meanwhile).
    pub(crate) fn restart(&mut self) {
        self.stop_children();
        if let Err(e) = self.spawn() {
            panic!("could not restart nats-server: {e}");
        }
    }

    fn stop_children(&mut self) {
        end(self.child.take()); // SIGKILL
        end(self.watchdog.take());
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = binary().ok_or("nats-server not found")?;
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let mut child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string()])
            // Named after its directory: the greeting tells this server from another test's
            // that holds the port this one failed to bind.
            .args(["--name", &self.name()])
            .arg("-sd")
            .arg(&self.dir)
            // No monitoring port, no cluster: only the client port is opened.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning nats-server: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "nats-server on port {} exited at start: {status}",
                    self.port
                ));
            }
            if greets(self.port, &self.name()) {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "nats-server on port {} did not greet within 10 s",
                    self.port
                ));
            }
            sleep(Duration::from_millis(20));
        }
        self.watchdog = Some(watchdog(child.id(), &self.dir, None));
        self.child = Some(child);
        Ok(())
    }
}

/// Whether the server on `port` sends its `INFO` greeting.
fn greets(port: u16, name: &str) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut line = String::new();
    let _ = BufReader::new(s.take(64 * 1024)).read_line(&mut line);
    line.starts_with("INFO") && line.contains(&format!("\"server_name\":\"{name}\""))
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop_children();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

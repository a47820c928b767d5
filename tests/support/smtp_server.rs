//! An SMTP server (Debian's `python3-aiosmtpd`, driven by `smtp_server.py` next to this file)
//! on a free loopback port, in a temporary directory, killed on drop. The test reads what it
//! took and tells it to stall or to answer with another reply.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::servers::{self, temp_dir, watchdog};

/// The Python that can import `aiosmtpd` (Debian's `/usr/bin/python3` first: a `python3`
/// earlier on `PATH`, pyenv's say, does not see Debian's packages).
fn python() -> Option<&'static str> {
    static PYTHON: OnceLock<Option<&'static str>> = OnceLock::new();
    *PYTHON.get_or_init(|| {
        ["/usr/bin/python3", "python3"].into_iter().find(|py| {
            Command::new(py)
                .args(["-c", "import aiosmtpd"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

/// Whether the SMTP server can run (see [`servers::available`]).
pub(crate) fn available() -> bool {
    servers::available(
        "SMTP",
        python()
            .is_none()
            .then(|| "no python3 can import aiosmtpd".to_owned()),
        "install python3-aiosmtpd",
    )
}

/// One SMTP server process.
#[derive(Debug)]
pub(crate) struct SmtpServer {
    child: Child,
    watchdog: Child,
    dir: PathBuf,
    port: u16,
}

impl SmtpServer {
    /// A server on a free port; on another one when that port was taken before the server
    /// bound it.
    pub(crate) fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_start_on(free_port(false)) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start the SMTP server: {last}");
    }

    fn try_start_on(port: u16) -> Result<Self, String> {
        let python = python().expect("check available() first");
        let dir = temp_dir("smtp", port);
        fs::create_dir_all(&dir).expect("a temporary directory");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/smtp_server.py");
        let child = Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the SMTP server");
        // Dropped on failure: the child is killed and its directory removed.
        let watchdog = watchdog(child.id(), &dir, None);
        let mut server = Self {
            child,
            watchdog,
            dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        // The script writes `ready` in its own directory once it listens: never another's.
        while !server.dir.join("ready").exists() {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("the SMTP server on port {port} exited: {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the SMTP server on port {port} did not start within 10 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The subjects of the messages the server took, in order.
    pub(crate) fn messages(&self) -> Vec<String> {
        fs::read_to_string(self.dir.join("messages"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Holds back the reply to the end of the data (after keeping the message), or not.
    pub(crate) fn stall(&self, on: bool) {
        self.flag("stall", on.then_some(""));
    }

    /// Answers the end of the data with `reply` (not keeping the message), or normally.
    pub(crate) fn reply(&self, reply: Option<&str>) {
        self.flag("reply", reply);
    }

    fn flag(&self, name: &str, content: Option<&str>) {
        let path = self.dir.join(name);
        match content {
            Some(c) => fs::write(path, c).expect("write a flag file"),
            None => {
                let _ = fs::remove_file(path);
            }
        }
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

//! A Redis Sentinel set for tests: a primary, one replica and three `redis-sentinel`
//! processes, all on free loopback ports, with short failure detection (`down-after` 500 ms,
//! `failover-timeout` 2 s) so a failover takes seconds. Everything is killed when dropped.
//!
//! When `redis-sentinel` is not on `PATH`, [`available`] prints a notice and the test returns
//! early; with `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` set (as `scripts/test.sh` does) it panics.

use super::ports::free_port;
use super::redis_server::{self, RedisServer, run_bounded};
use super::servers::{self, temp_dir, watchdog};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The name the sentinels monitor the primary under.
pub(crate) const SERVICE: &str = "ti-primary";

/// How long the set may take to form, and a failover to finish: generous for a loaded machine.
const SETTLE: Duration = Duration::from_secs(30);

/// Whether `redis-server`, `redis-cli` and `redis-sentinel` can be run (see the module docs).
pub(crate) fn available() -> bool {
    if !redis_server::available() {
        return false;
    }
    servers::available(
        "Sentinel",
        servers::on_path("redis-sentinel")
            .is_none()
            .then(|| "redis-sentinel is not on PATH".to_owned()),
        "install it",
    )
}

/// One `redis-sentinel` process, killed on drop.
#[derive(Debug)]
struct Sentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
    watchdog: Child,
}

impl Sentinel {
    fn start(primary: u16, failover_timeout_ms: u64) -> Self {
        // A port picked here may be taken before the sentinel binds it: started again on
        // another port until the sentinel answering is this one.
        for _ in 0..5 {
            let port = free_port(false);
            let dir = temp_dir("sentinel", port);
            std::fs::create_dir_all(&dir).expect("create the sentinel's directory");
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 500\n\
                     sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = dir.display(),
                ),
            )
            .expect("write the sentinel's configuration");
            let mut child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-sentinel");
            let deadline = Instant::now() + Duration::from_secs(10);
            let started = loop {
                if child.try_wait().is_ok_and(|s| s.is_some()) {
                    break false;
                }
                if redis_server::serves(port, child.id()) {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            if !started {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            }
            let watchdog = watchdog(child.id(), &dir, None);
            return Self {
                port,
                dir,
                child,
                watchdog,
            };
        }
        panic!("could not start redis-sentinel on a free port");
    }

    /// `SENTINEL master <service>` as field → value pairs (empty while it does not answer).
    fn master(&self) -> Vec<(String, String)> {
        let mut cli = Command::new("redis-cli");
        cli.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["SENTINEL", "master", SERVICE])
            .stdin(Stdio::null());
        let (ok, out) = run_bounded(cli, Duration::from_secs(5));
        if !ok {
            return Vec::new();
        }
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        lines
            .chunks(2)
            .filter_map(|p| match p {
                [k, v] => Some(((*k).to_owned(), (*v).to_owned())),
                _ => None,
            })
            .collect()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary, a replica and three sentinels watching them.
#[derive(Debug)]
pub(crate) struct SentinelSet {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<Sentinel>,
}

impl SentinelSet {
    /// Starts the set and waits (bounded) until the replica is in sync and every sentinel
    /// knows the replica and the two other sentinels.
    pub(crate) fn start() -> Self {
        let primary = RedisServer::start();
        let port = primary.port();
        Self::start_with(primary, port, 2000)
    }

    /// A set over `primary` whose replica replicates from `upstream` (the primary's port, or
    /// a proxy's in front of it), with the sentinels' `failover-timeout`. A long one keeps
    /// the sentinels from pointing a replica behind a proxy at the primary itself
    /// (`+fix-slave-config` waits that long); the first failover is as fast either way.
    pub(crate) fn start_with(
        primary: RedisServer,
        upstream: u16,
        failover_timeout_ms: u64,
    ) -> Self {
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &upstream.to_string()]);
        let set = Self {
            sentinels: (0..3)
                .map(|_| Sentinel::start(primary.port(), failover_timeout_ms))
                .collect(),
            primary,
            replica,
        };
        set.wait_for("the replica in sync", SETTLE, |s| {
            s.replica
                .command(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        // Its upstream's side too: `ROLE` lists a replica once its sync is done, and a store
        // that waits for replicas counts them from it.
        if upstream == set.primary.port() {
            set.wait_for("the primary to count its replica online", SETTLE, |s| {
                s.primary
                    .command(&["INFO", "replication"])
                    .contains("state=online")
            });
        }
        set.wait_for(
            "every sentinel to see the replica and the others",
            SETTLE,
            |s| {
                s.sentinels.iter().all(|sentinel| {
                    let m = sentinel.master();
                    let field = |name: &str| {
                        m.iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    field("num-slaves") == "1" && field("num-other-sentinels") == "2"
                })
            },
        );
        set
    }

    /// The sentinels' `redis://` URLs.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// The primary the set started with.
    pub(crate) fn primary(&mut self) -> &mut RedisServer {
        &mut self.primary
    }

    /// The replica the set started with.
    pub(crate) fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The port every sentinel names as the primary, once they agree (`None` before).
    pub(crate) fn primary_port(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self
            .sentinels
            .iter()
            .map(|s| {
                s.master()
                    .into_iter()
                    .find(|(k, _)| k == "port")
                    .and_then(|(_, v)| v.parse().ok())
            })
            .collect();
        match ports.first() {
            Some(Some(p)) if ports.iter().all(|q| *q == Some(*p)) => Some(*p),
            _ => None,
        }
    }

    /// Waits until every sentinel names the original replica as the primary, and it says so.
    pub(crate) fn wait_for_promotion(&self) {
        let replica = self.replica.port();
        self.wait_for("the replica promoted", SETTLE, |s| {
            s.primary_port() == Some(replica)
                && s.replica
                    .command(&["INFO", "replication"])
                    .contains("role:master")
        });
    }

    /// Asks a sentinel for a failover of a primary that is still up (`SENTINEL FAILOVER`),
    /// again until it takes the request (it refuses while it has no replica in good standing).
    /// Returns once it has started; [`Self::wait_for_promotion`] waits for its end.
    pub(crate) fn failover(&self) {
        let sentinel = &self.sentinels[0];
        self.wait_for("a sentinel to start a failover", SETTLE, |_| {
            let mut cli = Command::new("redis-cli");
            cli.args(["-h", "127.0.0.1", "-p", &sentinel.port.to_string()])
                .args(["SENTINEL", "FAILOVER", SERVICE])
                .stdin(Stdio::null());
            let (_, out) = run_bounded(cli, Duration::from_secs(5));
            let out = out.trim();
            // INPROG: one is under way already, from an earlier try that answered late.
            out == "OK" || out.contains("INPROG")
        });
    }

    fn wait_for(&self, what: &str, limit: Duration, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what} in the Sentinel set"
            );
            sleep(Duration::from_millis(100));
        }
    }
}

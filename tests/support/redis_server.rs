//! Real Redis servers for tests: a standalone `redis-server` or a three-primary Redis Cluster,
//! each on free loopback ports with persistence off, stopped when dropped.
//!
//! When `redis-server` is not on `PATH`, [`available`] prints a notice and the test returns
//! early; with `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` set (as `scripts/test.sh` does) it panics,
//! so a missing server is a failure there, never a skip.

use super::ports::free_port;
use super::servers::{self, end, temp_dir, watchdog};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The Redis key of `key` in a store whose `key_prefix()` is `prefix`: `<prefix>:{<id hex>}`,
/// the layout the Redis store's module docs describe.
pub(crate) fn redis_key(prefix: &str, key: &tower_idempotency::store::StoreKey) -> String {
    format!("{prefix}:{{{}}}", key.id_hex())
}

/// Whether `redis-server` and `redis-cli` can be run (see [`servers::available`]).
pub(crate) fn available() -> bool {
    let missing: Vec<&str> = ["redis-server", "redis-cli"]
        .into_iter()
        .filter(|b| servers::on_path(b).is_none())
        .collect();
    servers::available(
        "Redis",
        (!missing.is_empty()).then(|| format!("not on PATH: {}", missing.join(", "))),
        "install Redis",
    )
}

/// One `redis-server` process on a loopback port, killed on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
    watchdog: Option<Child>,
}

impl RedisServer {
    /// The test binary's one shared standalone server, started by the first test that asks
    /// (`None`: no server can run here, skip). Its tests keep to keys of their own (a store
    /// prefix or random keys); a test that stops, reconfigures or counts the commands of its
    /// server starts one of its own. Only the process is shared: each `#[tokio::test]` has its
    /// own runtime, so each connects on its own.
    pub(crate) fn shared() -> Option<&'static Self> {
        static SERVER: OnceLock<RedisServer> = OnceLock::new();
        available().then(|| SERVER.get_or_init(Self::start))
    }

    /// A standalone server on a free port.
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// A standalone server with extra `redis-server` arguments (`["--maxmemory", "10mb"]`).
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(ToString::to_string).collect();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port(false);
            let mut server = Self {
                port,
                dir: temp_dir("redis", port),
                extra: extra.clone(),
                child: None,
                watchdog: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server: {last}");
    }

    /// The port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The `redis://` URL of the server.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection of the test's own, to read and write keys directly.
    #[cfg(feature = "redis")]
    pub(crate) async fn connection(
        &self,
    ) -> tower_idempotency::store::redis::redis::aio::MultiplexedConnection {
        tower_idempotency::store::redis::redis::Client::open(self.url())
            .expect("a valid URL")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test server")
    }

    /// The value under `key` of `store` as it is in Redis (the store's layout), read directly.
    #[cfg(feature = "redis")]
    pub(crate) async fn get_value(
        &self,
        store: &tower_idempotency::store::redis::RedisStore,
        key: &tower_idempotency::store::StoreKey,
    ) -> Vec<u8> {
        let mut conn = self.connection().await;
        tower_idempotency::store::redis::redis::cmd("GET")
            .arg(redis_key(store.key_prefix(), key))
            .query_async::<Option<Vec<u8>>>(&mut conn)
            .await
            .expect("GET the key")
            .expect("the key is in Redis")
    }

    /// Writes `value` under `key` of `store` directly (`SET … PX 60000`), as a record written by
    /// someone else, or changed at rest, would be.
    #[cfg(feature = "redis")]
    pub(crate) async fn set_value(
        &self,
        store: &tower_idempotency::store::redis::RedisStore,
        key: &tower_idempotency::store::StoreKey,
        value: &[u8],
    ) {
        let mut conn = self.connection().await;
        tower_idempotency::store::redis::redis::cmd("SET")
            .arg(redis_key(store.key_prefix(), key))
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async::<()>(&mut conn)
            .await
            .expect("SET the key");
    }

    /// Kills the server (as a crash would: no shutdown, no save).
    pub(crate) fn stop(&mut self) {
        end(self.child.take());
        end(self.watchdog.take());
    }

    /// Starts the server again on the same port (empty: persistence is off).
    pub(crate) fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.spawn() {
            panic!("could not restart redis-server on port {}: {e}", self.port);
        }
    }

    /// The server's process id, to pause it with `SIGSTOP`.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// Sends one command and returns its reply (simple, integer, bulk or error line as text).
    pub(crate) fn command(&self, args: &[&str]) -> String {
        command(self.port, args).unwrap_or_else(|e| panic!("redis command {args:?} failed: {e}"))
    }

    fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--bind",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&self.dir)
        .args(&self.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawning redis-server: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited at start: {status}",
                    self.port
                ));
            }
            if command(self.port, &["PING"]).is_ok_and(|r| r == "PONG") {
                // Another test's server may hold the port this one failed to bind.
                if serves(self.port, child.id()) {
                    break;
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("port {} is another server's", self.port));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "redis-server on port {} did not answer PING within 10 s",
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three primaries (no replicas) on loopback, killed on drop.
#[derive(Debug)]
pub(crate) struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, creates the cluster with `redis-cli --cluster
    /// create`, and waits until every node reports `cluster_state:ok`.
    pub(crate) fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|i| {
                let mut last = String::new();
                for _ in 0..5 {
                    let port = free_port(true);
                    let dir = temp_dir("redis", port);
                    let conf = dir.join(format!("nodes-{i}.conf"));
                    let extra = vec![
                        "--cluster-enabled".to_owned(),
                        "yes".to_owned(),
                        "--cluster-config-file".to_owned(),
                        conf.display().to_string(),
                        "--cluster-node-timeout".to_owned(),
                        "5000".to_owned(),
                    ];
                    let mut node = RedisServer {
                        port,
                        dir,
                        extra,
                        child: None,
                        watchdog: None,
                    };
                    match node.spawn() {
                        Ok(()) => return node,
                        Err(e) => last = e,
                    }
                }
                panic!("could not start a cluster node: {last}");
            })
            .collect();

        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null());
        let out = run_bounded(create, Duration::from_secs(30));
        assert!(out.0, "redis-cli --cluster create failed:\n{}", out.1);

        let deadline = Instant::now() + Duration::from_secs(30);
        while !nodes.iter().all(|n| {
            command(n.port, &["CLUSTER", "INFO"]).is_ok_and(|i| i.contains("cluster_state:ok"))
        }) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok within 30 s"
            );
            sleep(Duration::from_millis(50));
        }
        Self { nodes }
    }

    /// The nodes' `redis://` URLs.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub(crate) fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}

/// Runs a command with a deadline; returns (success, combined output).
pub(crate) fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for child") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    (status.is_some_and(|s| s.success()), out)
}

/// Sends one RESP command to 127.0.0.1:`port` and reads one reply that is not an array:
/// `+OK` → `OK`, `:1` → `1`, `$n` → the bulk text, `-ERR x` → `Err`.
/// Whether the Redis server (or Sentinel) on `port` is the process `pid`.
pub(crate) fn serves(port: u16, pid: u32) -> bool {
    command(port, &["INFO", "server"]).is_ok_and(|info| {
        info.lines()
            .any(|l| l.trim() == format!("process_id:{pid}"))
    })
}

pub(crate) fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    // Seconds wide: a server busy with a sync's fork on a loaded machine answers late.
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(reply) = parse_reply(&buf)? {
            return Ok(reply);
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn parse_reply(buf: &[u8]) -> std::io::Result<Option<String>> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = String::from_utf8_lossy(&buf[1..end]).into_owned();
    match buf.first() {
        Some(b'+' | b':') => Ok(Some(line)),
        Some(b'-') => Err(bad(&line)),
        Some(b'$') => {
            let len: usize = line.parse().map_err(|_| bad("bad bulk length"))?;
            let start = end + 2;
            if buf.len() < start + len + 2 {
                return Ok(None);
            }
            Ok(Some(
                String::from_utf8_lossy(&buf[start..start + len]).into_owned(),
            ))
        }
        _ => Err(bad("unsupported reply type")),
    }
}

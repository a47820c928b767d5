//! The load benchmark's driver: one command runs every row × workload, `--runs` times, and
//! prints the setup and a markdown table of medians.
//!
//! ```text
//! load-driver [--runs 3] [--warmup 3] [--duration 10] [--connections 64] [--body 1024]
//!             [--rows bare,memory,redis,postgres,postgres-durable,postgres-pool,idempotent-memory,idempotent-redis,axum-idempotent]
//!             [--workloads fresh,replay] [--out FILE]
//! load-driver --mode long [--rows memory,memory-bounded,redis] [--duration 60] [--out FILE]
//! load-driver --mode wrk [--runs 2] [--warmup 2] [--duration 5] [--rows floor,bare,memory,…]
//!             [--replay-keys 100] [--out FILE]
//!             (every row of BENCHMARKS.md's table by default, PostgreSQL and the peers included)
//! load-driver --write-body FILE [--body 1024]
//! ```
//!
//! It spawns its own `redis-server` on a free loopback port (`--save "" --appendonly no`) when a
//! Redis row is asked for, and one `load-server` per row × workload (a fresh process, so RSS
//! and executions start from zero), with the server and redis-server pinned to core 0 and the
//! generator to core 1 (`taskset`). Redis is `FLUSHALL`ed and its stats reset before each
//! Redis case. The `redis-cluster` row runs against three cluster masters (no replicas), the
//! `redis-sentinel` rows against a primary, a replica and three sentinels, all of them pinned to
//! the server's core; their commands, memory and keys are summed over the masters, without the
//! deployment's own housekeeping (sentinels' `PING`, `INFO`, `PUBLISH`). For the `postgres` row it `initdb`s a PostgreSQL cluster in a temporary directory
//! and runs `postgres` on a free loopback port, pinned to core 0 like redis-server, with
//! `fsync=off` and `synchronous_commit=off` (no durability cost, as Redis runs without
//! persistence); the table is dropped before each case. The `postgres-durable` row gets a
//! cluster of its own with durability as deployed (`fsync`, `synchronous_commit` and
//! `full_page_writes` on); `postgres-pool` (the store over a sqlx pool with sqlx's defaults)
//! runs on `postgres`'s. After each `postgres` and `postgres-durable` case, pgbench runs the
//! store's statements (`loadtest/pgbench/*.sql`) on the same server, pinned to the server's
//! core, and the section "PostgreSQL at its own limit" sets the two side by side. Everything listens on 127.0.0.1 only, every request is bounded in time, and every
//! process it started is killed before it returns (or panics).

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ALL_ROWS: &str =
    "floor,bare,memory,redis,postgres,idempotent-memory,idempotent-redis,axum-idempotent";
/// The wrk mode's rows, those of BENCHMARKS.md's table: axum-idempotent needs a session per
/// connection (a login), which wrk's script does not do.
const WRK_ROWS: &str = "floor,bare,memory-bounded,memory,redis,redis-sentinel,redis-sentinel-wait,redis-cluster,postgres,postgres-durable,postgres-pool,idempotent-memory,idempotent-redis";

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[derive(Clone)]
struct Cfg {
    bin_dir: PathBuf,
    runs: usize,
    warmup: f64,
    duration: f64,
    connections: usize,
    body: usize,
    server_core: String,
    gen_core: String,
    log_dir: PathBuf,
    /// `--mode wrk`: wrk drives the load instead of load-gen.
    wrk: Option<Wrk>,
}

/// The wrk mode's generator: `wrk -t1 -cN` with loadtest/wrk/orders.lua.
#[derive(Clone)]
struct Wrk {
    script: PathBuf,
    body_file: PathBuf,
    /// Keys cycled by the replay workload.
    replay_keys: usize,
}

/// Kills the process when dropped (the driver never leaves a server behind).
struct Proc {
    child: Child,
    name: &'static str,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.name;
    }
}

/// A command whose process gets SIGKILL when the driver dies, even by a signal (`taskset`
/// execs the program, so the setting carries over to it).
fn command(program: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn is_redis_row(row: &str) -> bool {
    row.contains("redis")
}

/// The Sentinel deployment's service name.
const SENTINEL_SERVICE: &str = "bench-primary";

/// A loopback port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..100 {
        let port = free_port();
        if port
            .checked_add(10_000)
            .is_some_and(|bus| TcpListener::bind(("127.0.0.1", bus)).is_ok())
        {
            return port;
        }
    }
    panic!("no free port for a cluster node");
}

/// Which Redis deployment a row runs against: `redis-cluster*` the cluster,
/// `redis-sentinel*` the Sentinel deployment, any other Redis row the standalone server.
fn redis_of<'a>(row: &str, redis: &'a RedisSet) -> Option<&'a Redis> {
    if row.starts_with("redis-cluster") {
        redis.cluster.as_ref()
    } else if row.starts_with("redis-sentinel") {
        redis.sentinel.as_ref()
    } else {
        redis.standalone.as_ref()
    }
}

/// The Redis deployments the rows asked for.
struct RedisSet {
    standalone: Option<Redis>,
    cluster: Option<Redis>,
    sentinel: Option<Redis>,
}

impl RedisSet {
    fn start(cfg: &Cfg, rows: &[String]) -> Self {
        let wants = |f: &dyn Fn(&str) -> bool| rows.iter().any(|r| is_redis_row(r) && f(r));
        Self {
            standalone: wants(&|r| {
                !r.starts_with("redis-cluster") && !r.starts_with("redis-sentinel")
            })
            .then(|| Redis::start(cfg)),
            cluster: wants(&|r| r.starts_with("redis-cluster")).then(|| Redis::start_cluster(cfg)),
            sentinel: wants(&|r| r.starts_with("redis-sentinel"))
                .then(|| Redis::start_sentinel(cfg)),
        }
    }
}

// ---------- PostgreSQL ----------

/// A PostgreSQL server of the driver's own: stopped (immediate shutdown) and removed on drop.
struct Postgres {
    child: Child,
    port: u16,
    dir: PathBuf,
    bindir: PathBuf,
}

fn pg_bindir() -> PathBuf {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(d) =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| has(d)))
    {
        return d;
    }
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        .filter_map(|e| {
            let e = e.ok()?;
            Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin")))
        })
        .filter(|(_, d)| has(d))
        .collect();
    dirs.sort();
    dirs.pop().expect("no /usr/lib/postgresql/<version>/bin").1
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

impl Postgres {
    fn start(cfg: &Cfg, durable: bool) -> Self {
        let bindir = pg_bindir();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("load-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("pg dir");
        let root = is_root();
        // PostgreSQL refuses to run as root: as root, as the `postgres` user (setpriv execs,
        // so the pid is the postmaster's).
        let as_user = |program: &str| {
            let mut c = if root {
                let mut c = command("setpriv");
                c.args([
                    "--reuid=postgres",
                    "--regid=postgres",
                    "--init-groups",
                    "--",
                ]);
                c.arg(bindir.join(program));
                c
            } else {
                command(bindir.join(program).to_str().expect("utf-8 path"))
            };
            c.current_dir(&dir).stdin(Stdio::null());
            c
        };
        if root {
            let ok = Command::new("chown")
                .arg("postgres:")
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown the PostgreSQL directory to the postgres user");
        }
        let out = as_user("initdb")
            .arg("-D")
            .arg(dir.join("data"))
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = if durable { "postgres-durable" } else { "postgres" };
        let log = std::fs::File::create(cfg.log_dir.join(format!("{name}.log"))).expect("log");
        let mut cmd = command("taskset");
        cmd.args(["-c", &cfg.server_core]);
        if root {
            cmd.args([
                "setpriv",
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ]);
        }
        let child = cmd
            .arg(bindir.join("postgres"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-c", "listen_addresses=127.0.0.1", "-p", &port.to_string()])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .args(if durable {
                // As deployed: PostgreSQL's defaults, spelled out.
                ["-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on"]
            } else {
                ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
            })
            .args(["-c", "shared_buffers=256MB", "-c", "max_connections=50"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn postgres");
        let pg = Self {
            child,
            port,
            dir,
            bindir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while pg.sql("SELECT 1").is_none() {
            assert!(
                Instant::now() < deadline,
                "postgres did not start (see {name}.log)"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        pg
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs one statement with psql; its first output line.
    fn sql(&self, statement: &str) -> Option<String> {
        let psql = self.bindir.join("psql");
        let psql = if psql.is_file() {
            psql
        } else {
            PathBuf::from("psql")
        };
        let out = Command::new(psql)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", "postgres", "-X", "-A", "-t", "-q", "-c", statement])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The CPU seconds of the postmaster and its children (the backends), those that exited
    /// included (the postmaster's `cutime` and `cstime`).
    fn cpu_seconds(&self) -> f64 {
        let root = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{root}/stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let reaped: f64 = f.get(13).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(14).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let mut total = cpu_seconds(root) + reaped / 100.0;
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for e in entries.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                    continue;
                };
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, a)| a.split_whitespace().nth(1)?.parse::<u32>().ok());
                if ppid == Some(root) {
                    total += cpu_seconds(pid);
                }
            }
        }
        total
    }

    /// Transactions committed in the `postgres` database so far: one per statement the store
    /// sends, as each is a transaction of its own. A backend reports its count when it exits
    /// or at most once a second.
    fn commits(&self) -> f64 {
        self.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// A fingerprint and a record the store wrote, as hex, for pgbench's statements.
    fn sample_row(&self) -> Option<(String, String)> {
        let row = self.sql(
            "SELECT encode(fingerprint, 'hex') || '|' || encode(record, 'hex') \
             FROM tower_idempotency WHERE state = 'D' LIMIT 1",
        )?;
        let (fp, rec) = row.split_once('|')?;
        Some((fp.to_owned(), rec.to_owned()))
    }

    /// pgbench with the store's own statements for `workload` (loadtest/pgbench/*.sql), pinned
    /// to the server's core like load-server, with as many connections as the store's pool:
    /// an unmeasured run of `warmup` s, then `duration` s measured. `rps` is transactions per
    /// second; a transaction is the statements of one request.
    fn pgbench(&self, cfg: &Cfg, workload: &str, sample: &(String, String)) -> Case {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../pgbench/{workload}.sql"));
        assert!(script.is_file(), "{} is missing", script.display());
        let (fp, rec) = sample;
        self.sql("TRUNCATE tower_idempotency").expect("truncate");
        if workload == "replay" {
            self.sql(&format!(
                "INSERT INTO tower_idempotency (expires_at, key, state, fingerprint, record) \
                 SELECT now() + interval '1 day', decode(lpad(to_hex(k::int8), 80, '0'), 'hex'), \
                 'D', '\\x{fp}', '\\x{rec}' FROM generate_series(1, 100) k"
            ))
            .expect("the replay keys");
        }
        self.sql("VACUUM").expect("vacuum");
        let pgbench = self.bindir.join("pgbench");
        let pgbench = if pgbench.is_file() { pgbench } else { PathBuf::from("pgbench") };
        let run = |secs: f64| {
            let mut cmd = command("taskset");
            cmd.args(["-c", &cfg.server_core])
                .arg(&pgbench)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"])
                .args(["-n", "-M", "prepared", "-c", &PG_POOL.to_string(), "-j", "1"])
                .arg(format!("-T{}", secs.round().max(1.0)))
                .arg(format!("-Dfp=\\x{fp}"))
                .arg(format!("-Drec=\\x{rec}"))
                .args(["-Dlease=30000", "-Dttl=86400000", "-f"])
                .arg(&script)
                .arg("postgres");
            let child = cmd
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn pgbench (Debian: apt-get install postgresql-client)");
            let (out, cpu) = wait_child(child, "pgbench");
            let text = String::from_utf8_lossy(&out).into_owned();
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|r| r.trim_start_matches([' ', '=']).split_whitespace().next()?.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("no `{name}` in pgbench's output: {text}"))
            };
            (field("tps"), field("latency average"), field("number of transactions actually processed:"), cpu)
        };
        let _ = run(cfg.warmup);
        // The warm-up's backends exit and are reaped before the measured run starts.
        std::thread::sleep(Duration::from_millis(500));
        let (commits0, pg0) = (self.commits(), self.cpu_seconds());
        let t0 = Instant::now();
        let (tps, latency_ms, sent, client_cpu) = run(cfg.duration);
        let wall = t0.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(300));
        let pg_cpu = self.cpu_seconds() - pg0;
        Case {
            rps: tps,
            p50_us: latency_ms * 1000.0,
            p99_us: f64::NAN,
            sent,
            core0_busy: (pg_cpu + client_cpu) / wall,
            pg_busy: Some(pg_cpu / wall),
            pg_commits: Some(self.commits() - commits0),
            ..Case::default()
        }
    }
}

/// Connections of the store's own pool (`PostgresStore::connect`), and of pgbench.
const PG_POOL: usize = 10;

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGQUIT: PostgreSQL's immediate shutdown, which ends the backends too.
        let _ = Command::new("kill")
            .args(["-QUIT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------- a minimal RESP client (enough for INFO, CONFIG, FLUSHALL, DBSIZE, PING) ----------

struct Redis {
    proc: Proc,
    port: u16,
    /// What load-server gets as `--redis-url`: this server's URL, a cluster's node URLs or
    /// the sentinels' URLs (comma-separated).
    url: String,
    /// A cluster's other masters: their commands, memory and keys count with this one's.
    masters: Vec<Redis>,
    /// A Sentinel deployment's replica (its CPU counts, on the server core).
    replicas: Vec<Redis>,
    /// A Sentinel deployment's sentinels (their CPU counts, on the server core).
    helpers: Vec<Proc>,
    /// The deployment's own commands (sentinels' and cluster clients' housekeeping), left out
    /// of the commands per request.
    housekeeping: &'static [&'static str],
    /// Files of the deployment (cluster and sentinel configurations), removed on drop.
    dir: Option<PathBuf>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.helpers.clear();
        self.replicas.clear();
        self.masters.clear();
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The commands a Sentinel deployment or a cluster exchanges by itself (sentinels' `PING`,
/// `INFO`, `PUBLISH` hello messages, a replica's `REPLCONF`, a cluster client's topology).
const HA_HOUSEKEEPING: &[&str] = &[
    "ping",
    "info",
    "publish",
    "subscribe",
    "replconf",
    "psync",
    "sync",
    "cluster",
    "client",
    "hello",
    "command",
    "readonly",
    "role",
    "config",
];

#[derive(Debug)]
#[allow(dead_code)] // the payloads show in panics' Debug output
enum Resp {
    Simple(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Resp>),
    Error(String),
}

fn read_resp(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end_matches("\r\n");
    let (t, rest) = line.split_at(1.min(line.len()));
    Ok(match t {
        "+" => Resp::Simple(rest.into()),
        "-" => Resp::Error(rest.into()),
        ":" => Resp::Int(rest.parse().unwrap_or(0)),
        "$" => {
            let n: i64 = rest.parse().unwrap_or(-1);
            if n < 0 {
                Resp::Bulk(None)
            } else {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Resp::Bulk(Some(buf))
            }
        }
        "*" => {
            let n: i64 = rest.parse().unwrap_or(-1);
            let mut v = Vec::new();
            for _ in 0..n.max(0) {
                v.push(read_resp(r)?);
            }
            Resp::Array(v)
        }
        _ => Resp::Error(format!("unexpected reply `{line}`")),
    })
}

/// One command to the Redis server (or sentinel) on `port`, on a connection of its own.
fn resp_cmd(port: u16, args: &[&str]) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n{a}\r\n", a.len());
    }
    s.write_all(out.as_bytes())?;
    read_resp(&mut BufReader::new(s))
}

impl Redis {
    fn start(cfg: &Cfg) -> Self {
        Self::start_node(cfg, "redis", free_port(), &[])
    }

    /// A redis-server on `port`, pinned to the server core, with `extra` arguments.
    fn start_node(cfg: &Cfg, name: &str, port: u16, extra: &[String]) -> Self {
        let log = std::fs::File::create(cfg.log_dir.join(format!("{name}.log"))).expect("log");
        let child = command("taskset")
            .args([
                "-c",
                &cfg.server_core,
                "redis-server",
                "--port",
                &port.to_string(),
            ])
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ])
            .args(["--loglevel", "warning"])
            .args(extra)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn redis-server (is it installed?)");
        let r = Self {
            proc: Proc {
                child,
                name: "redis-server",
            },
            port,
            url: format!("redis://127.0.0.1:{port}/"),
            masters: Vec::new(),
            replicas: Vec::new(),
            helpers: Vec::new(),
            housekeeping: &[],
            dir: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Resp::Simple(s)) = r.cmd(&["PING"]) {
                if s == "PONG" {
                    return r;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A Redis Cluster of three masters (no replicas), each pinned to the server core; the
    /// first is `self`, the others in `masters`.
    fn start_cluster(cfg: &Cfg) -> Self {
        let dir = cfg.log_dir.join("cluster");
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let mut nodes: Vec<Redis> = (0..3)
            .map(|i| {
                let port = free_cluster_port();
                let conf = dir.join(format!("nodes-{port}.conf"));
                let extra = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    conf.to_str().expect("utf-8 path"),
                    "--cluster-node-timeout",
                    "5000",
                    "--dir",
                    dir.to_str().expect("utf-8 path"),
                ]
                .map(str::to_owned);
                Self::start_node(cfg, &format!("redis-cluster-{i}"), port, &extra)
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !nodes.iter().all(|n| {
            matches!(n.cmd(&["CLUSTER", "INFO"]), Ok(Resp::Bulk(Some(b)))
                if String::from_utf8_lossy(&b).contains("cluster_state:ok"))
        }) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
        let mut first = nodes.remove(0);
        first.url = urls.join(",");
        first.masters = nodes;
        first.housekeeping = HA_HOUSEKEEPING;
        first.dir = Some(dir);
        first
    }

    /// A primary, one replica and three sentinels (quorum 2) watching it as `bench-primary`,
    /// all pinned to the server core. `url` is the sentinels' URLs.
    fn start_sentinel(cfg: &Cfg) -> Self {
        let dir = cfg.log_dir.join("sentinel");
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        // Their files (the replica's copy of the primary's RDB) in the deployment's directory.
        let in_dir = [
            "--dir".to_owned(),
            dir.to_str().expect("utf-8 path").to_owned(),
        ];
        let mut primary = Self::start_node(cfg, "redis-primary", free_port(), &in_dir);
        let replica_port = free_port();
        let replica = Self::start_node(
            cfg,
            "redis-replica",
            replica_port,
            &[
                "--replicaof",
                "127.0.0.1",
                &primary.port.to_string(),
                "--dir",
                dir.to_str().expect("utf-8 path"),
                "--dbfilename",
                &format!("replica-{replica_port}.rdb"),
            ]
            .map(str::to_owned),
        );
        let mut urls = Vec::new();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_SERVICE} 5000\n\
                     sentinel failover-timeout {SENTINEL_SERVICE} 60000\n",
                    dir.display(),
                    primary.port
                ),
            )
            .expect("sentinel conf");
            let log =
                std::fs::File::create(cfg.log_dir.join(format!("sentinel-{i}.log"))).expect("log");
            let child = command("taskset")
                .args(["-c", &cfg.server_core, "redis-sentinel"])
                .arg(&conf)
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn redis-sentinel (is it installed?)");
            sentinels.push(Proc {
                child,
                name: "redis-sentinel",
            });
            urls.push(format!("redis://127.0.0.1:{port}/"));
        }
        // Ready when the replica is in sync and every sentinel knows the replica and the other
        // sentinels.
        let deadline = Instant::now() + Duration::from_secs(60);
        let ready = || {
            let synced = replica
                .info("replication")
                .get("master_link_status")
                .is_some_and(|v| v == "up");
            synced
                && urls.iter().all(|u| {
                    let port: u16 = u
                        .trim_start_matches("redis://127.0.0.1:")
                        .trim_end_matches('/')
                        .parse()
                        .expect("port");
                    let master = resp_cmd(port, &["SENTINEL", "master", SENTINEL_SERVICE]);
                    let Ok(Resp::Array(fields)) = master else {
                        return false;
                    };
                    let field = |name: &str| {
                        fields.chunks(2).find_map(|kv| match kv {
                            [Resp::Bulk(Some(k)), Resp::Bulk(Some(v))] if k == name.as_bytes() => {
                                Some(String::from_utf8_lossy(v).into_owned())
                            }
                            _ => None,
                        })
                    };
                    field("num-slaves").as_deref() == Some("1")
                        && field("num-other-sentinels").as_deref() == Some("2")
                })
        };
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "the Sentinel deployment did not settle"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        primary.url = urls.join(",");
        primary.replicas.push(replica);
        primary.helpers.extend(sentinels);
        primary.housekeeping = HA_HOUSEKEEPING;
        primary.dir = Some(dir);
        primary
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    /// This server and a cluster's other masters.
    fn nodes(&self) -> impl Iterator<Item = &Redis> {
        std::iter::once(self).chain(&self.masters)
    }

    /// The CPU seconds of every process of the deployment.
    fn cpu_seconds(&self) -> f64 {
        self.nodes()
            .chain(&self.replicas)
            .map(|n| cpu_seconds(n.proc.pid()))
            .sum::<f64>()
            + self
                .helpers
                .iter()
                .map(|p| cpu_seconds(p.pid()))
                .sum::<f64>()
    }

    /// `FLUSHALL` and `CONFIG RESETSTAT` on every master (a replica follows its primary).
    fn reset(&self) {
        for n in self.nodes() {
            n.cmd(&["FLUSHALL"]).expect("FLUSHALL");
            n.cmd(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
        }
    }

    /// Calls per command on every master, without the deployment's housekeeping.
    fn all_commandstats(&self) -> BTreeMap<String, u64> {
        let mut all = BTreeMap::new();
        for n in self.nodes() {
            for (k, v) in n.commandstats() {
                if !self.housekeeping.contains(&k.as_str()) {
                    *all.entry(k).or_default() += v;
                }
            }
        }
        all
    }

    fn all_used_memory(&self) -> i64 {
        self.nodes().map(Redis::used_memory).sum()
    }

    fn all_dbsize(&self) -> i64 {
        self.nodes().map(Redis::dbsize).sum()
    }

    fn cmd(&self, args: &[&str]) -> std::io::Result<Resp> {
        resp_cmd(self.port, args)
    }

    fn info(&self, section: &str) -> BTreeMap<String, String> {
        let Ok(Resp::Bulk(Some(b))) = self.cmd(&["INFO", section]) else {
            panic!("INFO {section} failed")
        };
        String::from_utf8_lossy(&b)
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Calls per command, from `INFO commandstats`.
    fn commandstats(&self) -> BTreeMap<String, u64> {
        self.info("commandstats")
            .into_iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix("cmdstat_")?.to_owned();
                let calls = v
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls="))?
                    .parse()
                    .ok()?;
                Some((name, calls))
            })
            .collect()
    }

    fn used_memory(&self) -> i64 {
        self.info("memory")
            .get("used_memory")
            .and_then(|v| v.parse().ok())
            .expect("used_memory")
    }

    /// Watches `MONITOR` for `secs` and counts the commands clients sent and the commands
    /// scripts called (`[0 lua]` lines), by name.
    fn monitor_sample(&self, secs: f64) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let (mut client, mut lua) = (BTreeMap::new(), BTreeMap::new());
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return (client, lua);
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        let _ = s.write_all(b"*1\r\n$7\r\nMONITOR\r\n");
        let mut r = BufReader::new(s);
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut line = String::new();
        while Instant::now() < end {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => continue,
            }
            // +1700000000.123456 [0 127.0.0.1:5555] "evalsha" "…"   |   … [0 lua] "get" "…"
            let Some((meta, rest)) = line.split_once("] \"") else {
                continue;
            };
            let name = rest.split('"').next().unwrap_or("").to_ascii_lowercase();
            let map = if meta.ends_with(" lua") {
                &mut lua
            } else {
                &mut client
            };
            *map.entry(name).or_default() += 1;
        }
        (client, lua)
    }

    fn dbsize(&self) -> i64 {
        match self.cmd(&["DBSIZE"]) {
            Ok(Resp::Int(n)) => n,
            other => panic!("DBSIZE: {other:?}"),
        }
    }
}

// ---------- the server under test ----------

fn http_get_json(port: u16, path: &str) -> std::io::Result<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).map_err(std::io::Error::other)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // after ')': state is field 3, utime 14, stime 15 → indices 11, 12 here.
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn start_server(cfg: &Cfg, row: &str, redis: Option<&Redis>, pg: Option<&Postgres>) -> (Proc, u16) {
    let port = free_port();
    let log = std::fs::File::create(cfg.log_dir.join(format!("server-{row}.log"))).expect("log");
    let mut cmd = command("taskset");
    cmd.args(["-c", &cfg.server_core])
        .arg(cfg.bin_dir.join("load-server"))
        .args(["--row", row, "--port", &port.to_string()]);
    if let Some(r) = redis {
        cmd.args(["--redis-url", &r.url()]);
    }
    if let Some(pg) = pg {
        cmd.args(["--postgres-url", &pg.url()]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn load-server");
    let p = Proc {
        child,
        name: "load-server",
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while http_get_json(port, "/stats").is_err() {
        assert!(
            Instant::now() < deadline,
            "load-server --row {row} did not start (see its log)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (p, port)
}

fn spawn_gen(
    cfg: &Cfg,
    port: u16,
    workload: &str,
    login: bool,
    warmup: f64,
    duration: f64,
) -> Child {
    let mut cmd = command("taskset");
    cmd.args(["-c", &cfg.gen_core])
        .arg(cfg.bin_dir.join("load-gen"))
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--workload",
            workload,
        ])
        .args([
            "--connections",
            &cfg.connections.to_string(),
            "--body",
            &cfg.body.to_string(),
        ])
        .args([
            "--warmup",
            &warmup.to_string(),
            "--duration",
            &duration.to_string(),
        ]);
    if login {
        cmd.arg("--login");
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn load-gen")
}

/// One `POST /orders` with the wrk mode's headers and `key`, on a connection of its own: the
/// replay workload stores each of its keys once this way before wrk starts. Returns the status.
fn http_post_order(port: u16, key: &str, body: &[u8]) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer client-0042\r\nCookie: session=9f86d081884c7d659a2feaa0c55ad015; theme=dark\r\nIdempotency-Key: \"{key}\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    buf.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {buf:?}")))
}

/// Starts `wrk` on the generator's core for `secs` (whole seconds: wrk's unit).
fn spawn_wrk(cfg: &Cfg, w: &Wrk, port: u16, workload: &str, prefix: &str, secs: f64) -> Child {
    let mut cmd = command("taskset");
    cmd.args(["-c", &cfg.gen_core, "wrk", "-t1"])
        .arg(format!("-c{}", cfg.connections))
        .arg(format!("-d{}s", secs.round().max(1.0)))
        .arg("-s")
        .arg(&w.script)
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--")
        .arg(workload)
        .arg(&w.body_file)
        .arg(prefix)
        .arg(w.replay_keys.to_string());
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn wrk (Debian: apt-get install wrk)")
}

/// Waits for wrk; returns the JSON line its script's `done()` printed and its CPU seconds.
fn wait_wrk(child: Child) -> (Value, f64) {
    let (out, cpu) = wait_child(child, "wrk");
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in wrk's output: {text}"));
    (serde_json::from_str(line).expect("wrk JSON"), cpu)
}

/// Waits for the generator; also returns its CPU seconds (read while it is a zombie).
fn wait_gen(child: Child) -> (Value, f64) {
    let (buf, cpu) = wait_child(child, "load-gen");
    (serde_json::from_slice(&buf).expect("load-gen JSON"), cpu)
}

/// Reads a generator's stdout to the end, then its CPU time (while it is a zombie), then reaps
/// it.
fn wait_child(mut child: Child, name: &str) -> (Vec<u8>, f64) {
    let mut stdout = child.stdout.take().expect("piped");
    let mut buf = Vec::new();
    stdout.read_to_end(&mut buf).expect("generator output");
    // The pipe closed: the generator is exiting. Wait for it without reaping, read its CPU
    // time, then reap it.
    let pid = child.id();
    let mut cpu = 0.0;
    for _ in 0..200 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        cpu = cpu_seconds(pid);
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, a)| a.trim_start().starts_with('Z'))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = child.wait().expect(name);
    assert!(status.success(), "{name} failed");
    (buf, cpu)
}

#[derive(Clone, Debug, Default)]
struct Case {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    sent: f64,
    executions: f64,
    non_201: f64,
    replayed: f64,
    errors: f64,
    rss_before_kib: f64,
    rss_after_kib: f64,
    records: Option<f64>,
    core0_busy: f64,
    core1_busy: f64,
    redis_cmds: Option<BTreeMap<String, u64>>,
    redis_top_level: Option<f64>,
    redis_client_names: Vec<String>,
    redis_mem_delta: Option<f64>,
    redis_keys: Option<f64>,
    /// `pg_total_relation_size` of the table after the case (table, indexes, TOAST).
    pg_bytes: Option<f64>,
    /// PostgreSQL's share of core 0 (postmaster and backends).
    pg_busy: Option<f64>,
    /// Transactions PostgreSQL committed during the case (a statement each, for the store).
    pg_commits: Option<f64>,
    per_second: Vec<f64>,
}

fn run_case(
    cfg: &Cfg,
    row: &str,
    workload: &str,
    redis: Option<&Redis>,
    pg: Option<&Postgres>,
    warmup: f64,
    duration: f64,
) -> Case {
    let redis = if is_redis_row(row) { redis } else { None };
    let pg = if row.starts_with("postgres") { pg } else { None };
    if let Some(pg) = pg {
        pg.sql("DROP TABLE IF EXISTS tower_idempotency")
            .expect("drop the table");
        pg.sql("VACUUM").expect("vacuum");
    }
    // The previous case's backends have exited: every open connection is this case's.
    let pg_start = pg.map(Postgres::commits);
    let pg_cpu = std::cell::RefCell::new(Vec::new());
    let mut mem0 = 0;
    if let Some(r) = redis {
        r.reset();
        mem0 = r.all_used_memory();
    }
    let (server, port) = start_server(cfg, row, redis, pg);
    let s0 = http_get_json(port, "/stats").expect("stats");
    let cs0 = redis.map_or(BTreeMap::new(), Redis::all_commandstats);
    let server_cpu = || {
        let pg_cpu_now = pg.map_or(0.0, Postgres::cpu_seconds);
        pg_cpu.borrow_mut().push(pg_cpu_now);
        cpu_seconds(server.pid()) + redis.map_or(0.0, Redis::cpu_seconds) + pg_cpu_now
    };
    // Which of the Redis commands are sent by the client and which run inside scripts: a
    // MONITOR sample in the middle of the warm-up (never in the measured window).
    let sample_warmup = || {
        redis.map(|r| {
            std::thread::sleep(Duration::from_secs_f64(warmup * 0.4));
            r.monitor_sample((warmup * 0.3).min(0.5))
        })
    };
    let (g, gen_cpu, wall, cpu0, cpu1, sample) = if let Some(w) = &cfg.wrk {
        // wrk has no warm-up of its own: store the replay keys, run it once unmeasured, then
        // measure a second run (CPU figures cover the measured run only).
        let body = std::fs::read(&w.body_file).expect("body file");
        let mut sent = 0.0;
        if workload == "replay" {
            for i in 0..w.replay_keys {
                let status = http_post_order(port, &format!("r-{i}"), &body).expect("pre-warm");
                assert_eq!(status, 201, "pre-warm of key r-{i} answered {status}");
                sent += 1.0;
            }
        }
        let prefix = |phase: &str| {
            if workload == "replay" {
                "r-".to_owned()
            } else {
                format!("f-{phase}-")
            }
        };
        let warm = spawn_wrk(cfg, w, port, workload, &prefix("w"), warmup);
        let sample = sample_warmup();
        let (gw, _) = wait_wrk(warm);
        let cpu0 = server_cpu();
        let t0 = Instant::now();
        let (gm, gen_cpu) = wait_wrk(spawn_wrk(cfg, w, port, workload, &prefix("m"), duration));
        let wall = t0.elapsed().as_secs_f64();
        let cpu1 = server_cpu();
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
        let requests = f(&gm, "requests");
        sent += f(&gw, "requests") + requests;
        let g = serde_json::json!({
            "rps": requests / (f(&gm, "duration_us") / 1e6),
            "p50_us": f(&gm, "p50_us"),
            "p99_us": f(&gm, "p99_us"),
            "sent_total": sent,
            // wrk counts answers outside 2xx/3xx; the rest are taken as 201 (the server's
            // executions per request show whether they ran or were replayed).
            "statuses": { "201": requests - f(&gm, "non_2xx_3xx"), "other": f(&gm, "non_2xx_3xx") },
            "replayed": null,
            "errors": f(&gm, "socket_errors") + f(&gw, "socket_errors"),
        });
        (g, gen_cpu, wall, cpu0, cpu1, sample)
    } else {
        let cpu0 = server_cpu();
        let t0 = Instant::now();
        let gen_proc = spawn_gen(
            cfg,
            port,
            workload,
            row == "axum-idempotent",
            warmup,
            duration,
        );
        let sample = sample_warmup();
        let (g, gen_cpu) = wait_gen(gen_proc);
        let wall = t0.elapsed().as_secs_f64();
        (g, gen_cpu, wall, cpu0, server_cpu(), sample)
    };
    let s1 = http_get_json(port, "/stats").expect("stats");
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let statuses = g["statuses"].as_object().cloned().unwrap_or_default();
    let non_201: f64 = statuses
        .iter()
        .filter(|(k, _)| *k != "201")
        .map(|(_, v)| v.as_f64().unwrap_or(0.0))
        .sum();
    let mut c = Case {
        rps: f(&g, "rps"),
        p50_us: f(&g, "p50_us"),
        p99_us: f(&g, "p99_us"),
        sent: f(&g, "sent_total"),
        executions: f(&s1, "executions") - f(&s0, "executions"),
        non_201,
        replayed: f(&g, "replayed"),
        errors: f(&g, "errors"),
        rss_before_kib: f(&s0, "rss_kib"),
        rss_after_kib: f(&s1, "rss_kib"),
        records: s1["records"].as_f64(),
        core0_busy: (cpu1 - cpu0) / wall,
        core1_busy: gen_cpu / wall,
        per_second: g["per_second"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default(),
        ..Case::default()
    };
    if let Some(r) = redis {
        let cs1 = r.all_commandstats();
        let mut d = BTreeMap::new();
        for (k, v) in &cs1 {
            // The driver's own commands between the snapshots: the first INFO and the MONITOR.
            let own = match k.as_str() {
                "info" => 1,
                "monitor" => 1,
                _ => 0,
            };
            let delta = v
                .saturating_sub(cs0.get(k).copied().unwrap_or(0))
                .saturating_sub(own);
            if delta > 0 {
                d.insert(k.clone(), delta);
            }
        }
        // commandstats counts every call, those made inside a script included; the share the
        // client sent comes from the MONITOR sample.
        if let Some((mut client, lua)) = sample {
            client.retain(|k, _| !r.housekeeping.contains(&k.as_str()));
            let (nc, nl) = (
                client.values().sum::<u64>() as f64,
                lua.values().sum::<u64>() as f64,
            );
            let all: f64 = d.values().sum::<u64>() as f64;
            if nc + nl > 0.0 {
                c.redis_top_level = Some(all * nc / (nc + nl));
            }
            c.redis_client_names = client.keys().cloned().collect();
        }
        c.redis_cmds = Some(d);
        c.redis_mem_delta = Some((r.all_used_memory() - mem0) as f64);
        c.redis_keys = Some(r.all_dbsize() as f64);
    }
    if let Some(pg) = pg {
        c.pg_bytes = pg
            .sql("SELECT pg_total_relation_size('tower_idempotency')")
            .and_then(|v| v.parse().ok());
        let cpu = pg_cpu.borrow();
        if let (Some(a), Some(b)) = (cpu.first(), cpu.last()) {
            c.pg_busy = Some((b - a) / wall);
        }
        // The commits once the store's backends have exited and reported.
        let commits0 = pg_start.unwrap_or_default();
        drop(server);
        std::thread::sleep(Duration::from_millis(500));
        c.pg_commits = Some(pg.commits() - commits0);
        return c;
    }
    drop(server);
    c
}

// ---------- reporting ----------

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn fmt_bytes(b: f64) -> String {
    if !b.is_finite() {
        "—".into()
    } else if b.abs() >= 10_000.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn setup_text(cfg: &Cfg, mode: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total = mem
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .unwrap_or("?")
        .to_owned();
    let redis = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .unwrap_or("?")
                .to_owned()
        })
        .unwrap_or_else(|_| "not installed".into());
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let mut s = String::new();
    let gib = mem_total.parse::<f64>().unwrap_or(0.0) / 1_048_576.0;
    let _ = writeln!(
        s,
        "- machine: {model}, {cpus} CPUs (nproc {}), {gib:.0} GiB RAM, Linux {}",
        nproc(),
        kernel.trim()
    );
    let _ = writeln!(
        s,
        "- load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        s,
        "- {rustc}; redis-server {redis}; release build (thin LTO, 1 codegen unit)"
    );
    if let Some(w) = &cfg.wrk {
        let version = Command::new("wrk")
            .arg("-v")
            .output()
            .map(|o| {
                let out = String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr);
                out.split_whitespace().nth(1).unwrap_or("?").to_owned()
            })
            .unwrap_or_else(|_| "not installed".into());
        let _ = writeln!(
            s,
            "- server: Tokio, 1 worker thread, pinned to core {} (with redis-server); generator: wrk {version}, 1 thread (`wrk -t1 -c{}`, loadtest/wrk/orders.lua), pinned to core {}",
            cfg.server_core, cfg.connections, cfg.gen_core
        );
        let _ = writeln!(
            s,
            "- {} keep-alive HTTP/1.1 connections, closed loop; `POST /orders` with a {}-byte JSON body, `Content-Type`, `Authorization: Bearer client-0042` (the principal: one for the whole run), a `Cookie` and an `Idempotency-Key` (an sf-string); fresh: a new key per request; replay: {} keys cycled, each stored once before wrk starts",
            cfg.connections, cfg.body, w.replay_keys
        );
        let _ = writeln!(
            s,
            "- `floor`: reads the body into `Bytes` and answers a 10-byte JSON 201; `bare`: parses the body with serde_json and answers a ~50-byte JSON 201"
        );
    } else {
        let _ = writeln!(
            s,
            "- server: Tokio, 1 worker thread, pinned to core {} (with redis-server); generator: hyper 1 client, 1 thread, pinned to core {}",
            cfg.server_core, cfg.gen_core
        );
        let _ = writeln!(
            s,
            "- {} keep-alive HTTP/1.1 connections, closed loop; `POST /orders` with a {}-byte JSON body parsed by serde_json, answered 201 with a ~50-byte JSON body",
            cfg.connections, cfg.body
        );
    }
    if mode == "long" {
        let _ = writeln!(
            s,
            "- long mode: warm-up {} s, then {} s of fresh keys",
            cfg.warmup, cfg.duration
        );
    } else {
        let _ = writeln!(
            s,
            "- each case: a fresh server process, warm-up {} s, then {} s measured; {} runs of every row × workload, medians reported (ratios are taken within each run, then the median)",
            cfg.warmup, cfg.duration, cfg.runs
        );
    }
    s
}

fn nproc() -> String {
    Command::new("nproc")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn table(
    rows: &[String],
    workloads: &[String],
    runs: &[BTreeMap<(String, String), Case>],
) -> String {
    let mut s = String::new();
    s.push_str("| row | workload | req/s | p50 | p99 | req/s ÷ floor | req/s ÷ bare | p99 ÷ bare | executions / request | non-201 | server RSS after | RSS / record | Redis commands / request: sent by the client / all (commandstats) | store memory / record (Redis `used_memory`, PostgreSQL table size) | CPU: server (+ Redis or PostgreSQL) / generator |\n");
    s.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n");
    for row in rows {
        for w in workloads {
            let key = (row.clone(), w.clone());
            let cases: Vec<&Case> = runs.iter().filter_map(|r| r.get(&key)).collect();
            if cases.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Case) -> f64| median(cases.iter().map(|c| f(c)).collect());
            let ratio_to = |base: &str, f: &dyn Fn(&Case) -> f64| {
                median(
                    runs.iter()
                        .filter_map(|r| {
                            Some(f(r.get(&key)?) / f(r.get(&(base.to_owned(), w.clone()))?))
                        })
                        .collect(),
                )
            };
            let ratio = |f: &dyn Fn(&Case) -> f64| ratio_to("bare", f);
            let fresh = w == "fresh";
            let rss_per = if fresh {
                fmt_bytes(m(&|c| {
                    (c.rss_after_kib - c.rss_before_kib) * 1024.0 / c.executions
                }))
            } else {
                "—".into()
            };
            let (cmds, rmem) = if cases[0].redis_cmds.is_some() {
                let top = m(&|c| c.redis_top_level.unwrap_or(f64::NAN) / c.sent);
                let all = m(&|c| {
                    c.redis_cmds
                        .as_ref()
                        .map_or(f64::NAN, |d| d.values().sum::<u64>() as f64)
                        / c.sent
                });
                let mut names: Vec<String> = cases[0]
                    .redis_cmds
                    .as_ref()
                    .map(|d| d.keys().cloned().collect())
                    .unwrap_or_default();
                names.sort();
                let parts: Vec<String> = names
                    .iter()
                    .map(|n| {
                        let v = m(&|c| {
                            c.redis_cmds
                                .as_ref()
                                .and_then(|d| d.get(n))
                                .copied()
                                .unwrap_or(0) as f64
                                / c.sent
                        });
                        format!("{n} {v:.2}")
                    })
                    .filter(|p| !p.ends_with(" 0.00"))
                    .collect();
                let rmem = if fresh {
                    fmt_bytes(m(&|c| c.redis_mem_delta.unwrap_or(f64::NAN) / c.executions))
                } else {
                    "—".into()
                };
                let client: Vec<&str> = cases[0]
                    .redis_client_names
                    .iter()
                    .map(String::as_str)
                    .collect();
                (
                    format!(
                        "{top:.2} / {all:.2} ({}; client: {})",
                        parts.join(", "),
                        client.join(", ")
                    ),
                    rmem,
                )
            } else if cases[0].pg_bytes.is_some() && fresh {
                // The table's total size (heap, indexes, TOAST) per record it holds.
                let per = m(&|c| c.pg_bytes.unwrap_or(f64::NAN) / c.executions);
                ("—".into(), format!("{} in PostgreSQL", fmt_bytes(per)))
            } else {
                ("—".into(), "—".into())
            };
            let _ = writeln!(
                s,
                "| {row} | {w} | {:.0} | {} | {} | {:.2}× | {:.2}× | {:.2}× | {} | {:.0} | {:.1} MiB | {rss_per} | {cmds} | {rmem} | {:.0}% / {:.0}% |",
                m(&|c| c.rps),
                fmt_us(m(&|c| c.p50_us)),
                fmt_us(m(&|c| c.p99_us)),
                ratio_to("floor", &|c| c.rps),
                ratio(&|c| c.rps),
                ratio(&|c| c.p99_us),
                if fresh {
                    format!("{:.3}", m(&|c| c.executions / c.sent))
                } else {
                    format!("{:.5}", m(&|c| c.executions / c.sent))
                },
                m(&|c| c.non_201 + c.errors),
                m(&|c| c.rss_after_kib / 1024.0),
                m(&|c| c.core0_busy * 100.0),
                m(&|c| c.core1_busy * 100.0),
            );
        }
    }
    s
}

fn per_run(
    rows: &[String],
    workloads: &[String],
    runs: &[BTreeMap<(String, String), Case>],
) -> String {
    let mut s = String::from(
        "| run | row | workload | req/s | p50 | p99 | executions | requests sent | answered as replays | records (store) | Redis keys |\n| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (i, r) in runs.iter().enumerate() {
        for row in rows {
            for w in workloads {
                if let Some(c) = r.get(&(row.clone(), w.clone())) {
                    let _ = writeln!(
                        s,
                        "| {} | {row} | {w} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} |",
                        i + 1,
                        c.rps,
                        fmt_us(c.p50_us),
                        fmt_us(c.p99_us),
                        c.executions,
                        c.sent,
                        c.replayed,
                        c.records.map_or("—".into(), |n| format!("{n:.0}")),
                        c.redis_keys.map_or("—".into(), |n| format!("{n:.0}")),
                    );
                }
            }
        }
    }
    s
}

/// The generator mode's targets, each the median over the runs of a value taken within one run.
fn targets(runs: &[BTreeMap<(String, String), Case>]) -> String {
    type Run = BTreeMap<(String, String), Case>;
    let get = |r: &Run, row: &str, w: &str| r.get(&(row.to_owned(), w.to_owned())).cloned();
    let med = |f: &dyn Fn(&Run) -> Option<f64>| median(runs.iter().filter_map(f).collect());
    let mut s = String::from(
        "| target | measured (median of per-run values) | holds |\n| --- | ---: | --- |\n",
    );
    let mut line = |name: &str, v: f64, ok: bool, unit: &str| {
        if v.is_finite() {
            let _ = writeln!(
                s,
                "| {name} | {v:.2}{unit} | {} |",
                if ok { "yes" } else { "no" }
            );
        }
    };
    let v = med(&|r| Some(get(r, "memory", "fresh")?.rps / get(r, "bare", "fresh")?.rps));
    line("memory fresh ≥ 0.95× bare req/s", v, v >= 0.95, "×");
    let v = med(&|r| Some(get(r, "memory", "fresh")?.p99_us / get(r, "bare", "fresh")?.p99_us));
    line("memory fresh p99 ≤ 1.5× bare p99", v, v <= 1.5, "×");
    let v = med(&|r| {
        let best = ["idempotent-memory", "idempotent-redis", "axum-idempotent"]
            .iter()
            .filter_map(|p| get(r, p, "replay").map(|c| c.rps))
            .fold(f64::NAN, f64::max);
        Some(get(r, "memory", "replay")?.rps / best)
    });
    line(
        "memory replay ≥ 1.2× the best peer's replay req/s",
        v,
        v >= 1.2,
        "×",
    );
    let v = med(&|r| {
        let c = get(r, "memory", "fresh")?;
        Some((c.rss_after_kib - c.rss_before_kib) * 1024.0 / c.executions)
    });
    line("memory RSS per stored record ≤ 300 B", v, v <= 300.0, " B");
    let v =
        med(&|r| Some(get(r, "redis", "fresh")?.rps / get(r, "idempotent-redis", "fresh")?.rps));
    line(
        "Redis fresh ≥ 2× idempotent's Redis fresh req/s",
        v,
        v >= 2.0,
        "×",
    );
    let v =
        med(&|r| Some(get(r, "redis", "replay")?.rps / get(r, "idempotent-redis", "replay")?.rps));
    line(
        "Redis replay ≥ 1.5× idempotent's Redis replay req/s",
        v,
        v >= 1.5,
        "×",
    );
    let cmds_of = |r: &Run, row: &str, w: &str, client: bool| -> Option<f64> {
        let c = get(r, row, w)?;
        let n = if client {
            c.redis_top_level?
        } else {
            c.redis_cmds.as_ref()?.values().sum::<u64>() as f64
        };
        Some(n / c.sent)
    };
    let cmds = |r: &Run, w: &str, client: bool| cmds_of(r, "redis", w, client);
    let v = med(&|r| cmds(r, "fresh", true));
    line(
        "Redis fresh: 2 commands per request, counting those the client sends",
        v,
        v <= 2.05,
        "",
    );
    let v = med(&|r| cmds(r, "fresh", false));
    line(
        "Redis fresh: 2 commands per request, counting in-script calls too (commandstats)",
        v,
        v <= 2.05,
        "",
    );
    let v = med(&|r| cmds(r, "replay", true));
    line(
        "Redis replay: 1 command per request, counting those the client sends",
        v,
        v <= 1.05,
        "",
    );
    let v = med(&|r| cmds(r, "replay", false));
    line(
        "Redis replay: 1 command per request, counting in-script calls too (commandstats)",
        v,
        v <= 1.05,
        "",
    );
    for (row, name) in [
        ("redis-cluster", "Redis Cluster"),
        ("redis-sentinel", "Redis Sentinel"),
        (
            "redis-sentinel-wait",
            "Redis Sentinel, wait_for_replicas(1)",
        ),
    ] {
        for (w, n) in [("fresh", 2.0), ("replay", 1.0)] {
            let v = med(&|r| cmds_of(r, row, w, false));
            line(
                &format!("{name} {w}: {n} commands per request (commandstats, every master)"),
                v,
                v <= n
                    + 0.05
                    + if row.ends_with("-wait") && w == "fresh" {
                        1.0
                    } else {
                        0.0
                    },
                "",
            );
        }
    }
    let v = med(&|r| {
        let c = get(r, "redis", "fresh")?;
        Some(c.redis_mem_delta? / c.executions)
    });
    line(
        "Redis memory per stored record ≤ 350 B",
        v,
        v <= 350.0,
        " B",
    );
    s
}

/// A row's memory per stored record: the store's own (Redis `used_memory`, PostgreSQL table
/// size) where it has one, else the server's RSS growth.
fn per_record(c: &Case) -> (f64, &'static str) {
    if let Some(d) = c.redis_mem_delta {
        (d / c.executions, "in Redis")
    } else if let Some(b) = c.pg_bytes {
        (b / c.executions, "of table")
    } else {
        (
            (c.rss_after_kib - c.rss_before_kib) * 1024.0 / c.executions,
            "of RSS",
        )
    }
}

/// The figures BENCHMARKS.md quotes, computed from this invocation's own cases: one line per
/// row, then the comparisons with the peer. Rates and p99 are medians over the runs; every
/// ratio is taken within one run, then the median over the runs.
fn summary(rows: &[String], runs: &[BTreeMap<(String, String), Case>]) -> String {
    type Run = BTreeMap<(String, String), Case>;
    let get = |r: &Run, row: &str, w: &str| r.get(&(row.to_owned(), w.to_owned())).cloned();
    let med = |f: &dyn Fn(&Run) -> Option<f64>| median(runs.iter().filter_map(f).collect());
    let ratio = |a: (&str, &str), b: (&str, &str), f: fn(&Case) -> f64| {
        med(&|r| Some(f(&get(r, a.0, a.1)?) / f(&get(r, b.0, b.1)?)))
    };
    let rps = |c: &Case| c.rps;
    let p99 = |c: &Case| c.p99_us;
    let mem = |c: &Case| per_record(c).0;
    let x = |v: f64| {
        if v.is_finite() {
            format!("{v:.2}×")
        } else {
            "—".into()
        }
    };
    let mut s = String::from(
        "| row | fresh req/s | ÷ bare | fresh p99 | replay req/s | ÷ floor | replay p99 | per stored record | core-0 µs over bare: fresh / replay |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    // 10⁶ ÷ the row's rate, less 10⁶ ÷ the reference's, within each run.
    let over = |row: &str, w: &str, base: &str| {
        med(&|r| Some(1e6 / get(r, row, w)?.rps - 1e6 / get(r, base, w)?.rps))
    };
    let us = |v: f64| {
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            "—".into()
        }
    };
    for row in rows {
        let of = |w: &str, f: fn(&Case) -> f64| med(&|r| Some(f(&get(r, row, w)?)));
        let fresh_rps = of("fresh", rps);
        let replay_rps = of("replay", rps);
        if !fresh_rps.is_finite() && !replay_rps.is_finite() {
            continue;
        }
        let record = runs
            .iter()
            .find_map(|r| get(r, row, "fresh"))
            .filter(|_| !matches!(row.as_str(), "floor" | "bare"))
            .map_or("—".to_owned(), |c| {
                format!("{} {}", fmt_bytes(of("fresh", mem)), per_record(&c).1)
            });
        let _ = writeln!(
            s,
            "| {row} | {:.0} | {} | {} | {:.0} | {} | {} | {record} | {} / {} |",
            fresh_rps,
            x(ratio((row, "fresh"), ("bare", "fresh"), rps)),
            fmt_us(of("fresh", p99)),
            replay_rps,
            x(ratio((row, "replay"), ("floor", "replay"), rps)),
            fmt_us(of("replay", p99)),
            us(over(row, "fresh", "bare")),
            us(over(row, "replay", "floor")),
        );
    }
    let peers = [
        (
            "Redis, one server, fresh req/s ÷ `idempotent`'s Redis fresh",
            ratio(("redis", "fresh"), ("idempotent-redis", "fresh"), rps),
        ),
        (
            "Redis, one server, replay req/s ÷ `idempotent`'s Redis replay",
            ratio(("redis", "replay"), ("idempotent-redis", "replay"), rps),
        ),
        (
            "Redis memory per record ÷ `idempotent`'s",
            ratio(("redis", "fresh"), ("idempotent-redis", "fresh"), mem),
        ),
        (
            "bounded memory store fresh req/s ÷ `idempotent`'s memory fresh",
            ratio(
                ("memory-bounded", "fresh"),
                ("idempotent-memory", "fresh"),
                rps,
            ),
        ),
        (
            "bounded memory store RSS per record ÷ `idempotent`'s",
            ratio(
                ("memory-bounded", "fresh"),
                ("idempotent-memory", "fresh"),
                mem,
            ),
        ),
        (
            "bounded memory store fresh p99 ÷ `idempotent`'s",
            ratio(
                ("memory-bounded", "fresh"),
                ("idempotent-memory", "fresh"),
                p99,
            ),
        ),
        (
            "unbounded memory store fresh req/s ÷ `idempotent`'s memory fresh",
            ratio(("memory", "fresh"), ("idempotent-memory", "fresh"), rps),
        ),
    ];
    let mut first = true;
    for (name, v) in peers {
        if v.is_finite() {
            if first {
                s.push_str("\nAgainst the peer (median of per-run ratios):\n\n");
                first = false;
            }
            let _ = writeln!(s, "- {name}: {v:.2}×");
        }
    }
    s
}

/// The wrk mode's targets, each the median over the runs of a ratio taken within
/// one run.
fn targets_wrk(runs: &[BTreeMap<(String, String), Case>]) -> String {
    type Run = BTreeMap<(String, String), Case>;
    let get = |r: &Run, row: &str, w: &str| r.get(&(row.to_owned(), w.to_owned())).cloned();
    let med = |f: &dyn Fn(&Run) -> Option<f64>| median(runs.iter().filter_map(f).collect());
    let ratio = |a: (&str, &str), b: (&str, &str), f: fn(&Case) -> f64| {
        med(&|r| Some(f(&get(r, a.0, a.1)?) / f(&get(r, b.0, b.1)?)))
    };
    let rps = |c: &Case| c.rps;
    let p99 = |c: &Case| c.p99_us;
    let mut s = String::from(
        "| target | measured (median of per-run ratios) | holds |\n| --- | ---: | --- |\n",
    );
    let rows = [
        (
            "memory replay ≥ 0.90× the floor",
            ratio(("memory", "replay"), ("floor", "replay"), rps),
            0.90,
            true,
        ),
        (
            "memory fresh ≥ 0.85× bare (the store bounded: memory-bounded)",
            ratio(("memory-bounded", "fresh"), ("bare", "fresh"), rps),
            0.85,
            true,
        ),
        (
            "memory fresh p99 ≤ 1.5× bare p99 (memory-bounded)",
            ratio(("memory-bounded", "fresh"), ("bare", "fresh"), p99),
            1.5,
            false,
        ),
        (
            "(memory fresh, unbounded store, ÷ bare)",
            ratio(("memory", "fresh"), ("bare", "fresh"), rps),
            f64::NAN,
            true,
        ),
        (
            "Redis fresh ≥ 2× idempotent's Redis fresh",
            ratio(("redis", "fresh"), ("idempotent-redis", "fresh"), rps),
            2.0,
            true,
        ),
        (
            "Redis replay ≥ 2× idempotent's Redis replay",
            ratio(("redis", "replay"), ("idempotent-redis", "replay"), rps),
            2.0,
            true,
        ),
        (
            "(Redis Cluster fresh ÷ idempotent's Redis fresh)",
            ratio(
                ("redis-cluster", "fresh"),
                ("idempotent-redis", "fresh"),
                rps,
            ),
            f64::NAN,
            true,
        ),
        (
            "(Redis Cluster replay ÷ idempotent's Redis replay)",
            ratio(
                ("redis-cluster", "replay"),
                ("idempotent-redis", "replay"),
                rps,
            ),
            f64::NAN,
            true,
        ),
        (
            "(Redis Sentinel fresh ÷ idempotent's Redis fresh)",
            ratio(
                ("redis-sentinel", "fresh"),
                ("idempotent-redis", "fresh"),
                rps,
            ),
            f64::NAN,
            true,
        ),
        (
            "(Redis Sentinel replay ÷ idempotent's Redis replay)",
            ratio(
                ("redis-sentinel", "replay"),
                ("idempotent-redis", "replay"),
                rps,
            ),
            f64::NAN,
            true,
        ),
        (
            "(memory replay ÷ idempotent's memory replay)",
            ratio(("memory", "replay"), ("idempotent-memory", "replay"), rps),
            f64::NAN,
            true,
        ),
        (
            "memory fresh ≥ 1.3× idempotent's memory fresh",
            ratio(("memory", "fresh"), ("idempotent-memory", "fresh"), rps),
            1.3,
            true,
        ),
    ];
    for (name, v, bound, at_least) in rows {
        if v.is_finite() {
            let holds = if bound.is_nan() {
                "—"
            } else if (at_least && v >= bound) || (!at_least && v <= bound) {
                "yes"
            } else {
                "no"
            };
            let _ = writeln!(s, "| {name} | {v:.2}× | {holds} |");
        }
    }
    s
}

/// The store's PostgreSQL rows beside pgbench running the same statements on the same server
/// and core, right after each case. Cost ratio: pgbench transactions/s ÷ the store's req/s, each
/// the median of per-run values (the goal is at most 1.5).
fn pg_limit(
    rows: &[String],
    workloads: &[String],
    runs: &[BTreeMap<(String, String), Case>],
) -> String {
    let mut s = String::from(
        "| row | workload | store req/s | pgbench tx/s | request ÷ pgbench tx (cost) | ≤ 1.5× | PostgreSQL transactions / request | PostgreSQL CPU / request: store, pgbench | rest of core 0 / request: load-server, pgbench |\n| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n",
    );
    for row in rows.iter().filter(|r| r.starts_with("postgres")) {
        for w in workloads {
            let key = (row.clone(), w.clone());
            // `postgres-pool` runs on the server of `postgres`.
            let server = if row == "postgres-pool" { "postgres" } else { row };
            let bkey = (format!("pgbench:{server}"), w.clone());
            let pairs: Vec<(&Case, &Case)> = runs
                .iter()
                .filter_map(|r| Some((r.get(&key)?, r.get(&bkey)?)))
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let m = |f: &dyn Fn(&Case, &Case) -> f64| {
                median(pairs.iter().map(|(c, b)| f(c, b)).collect())
            };
            let ratio = m(&|c, b| b.rps / c.rps);
            let us = |busy: f64, rps: f64| busy / rps * 1e6;
            let _ = writeln!(
                s,
                "| {row} | {w} | {:.0} | {:.0} | {ratio:.2}× | {} | {:.2} | {:.0} µs, {:.0} µs | {:.0} µs, {:.0} µs |",
                m(&|c, _| c.rps),
                m(&|_, b| b.rps),
                if ratio <= 1.5 { "yes" } else { "no" },
                m(&|c, _| c.pg_commits.unwrap_or(f64::NAN) / c.sent),
                m(&|c, _| us(c.pg_busy.unwrap_or(f64::NAN), c.rps)),
                m(&|_, b| us(b.pg_busy.unwrap_or(f64::NAN), b.rps)),
                m(&|c, _| us(c.core0_busy - c.pg_busy.unwrap_or(f64::NAN), c.rps)),
                m(&|_, b| us(b.core0_busy - b.pg_busy.unwrap_or(f64::NAN), b.rps)),
            );
        }
    }
    s.push_str("\nA pgbench transaction is the statements of one request: the claim of a stored key for a replay; the claim of a new key, then its complete, for a fresh request. Transactions are counted in `pg_stat_database`; exchanges per step are counted by `tests/store/postgres_exchanges.rs`.\n");
    s
}

fn emit(out: Option<&Path>, text: &str) {
    print!("{text}");
    let _ = std::io::stdout().flush();
    if let Some(p) = out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .expect("--out file");
        f.write_all(text.as_bytes()).expect("write --out");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The request body every mode sends, for scripts that drive a server themselves
    // (loadtest/perf.sh).
    if let Some(file) = arg(&args, "--write-body") {
        let size = arg(&args, "--body").map_or(1024, |v| v.parse().expect("bytes"));
        std::fs::write(&file, tower_idempotency_load::order_body(size)).expect("--write-body");
        return;
    }
    let mode = arg(&args, "--mode").unwrap_or_else(|| "table".into());
    let long = mode == "long";
    let wrk = mode == "wrk";
    assert!(
        matches!(mode.as_str(), "table" | "long" | "wrk"),
        "--mode table|long|wrk"
    );
    let bin_dir = std::env::current_exe()
        .expect("exe")
        .parent()
        .expect("dir")
        .to_path_buf();
    let log_dir =
        std::env::temp_dir().join(format!("tower-idempotency-load-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).expect("log dir");
    let cfg = Cfg {
        bin_dir,
        // wrk mode runs every row of BENCHMARKS.md's table: 2 runs of 5 s keep it near 10
        // minutes.
        runs: arg(&args, "--runs").map_or(if wrk { 2 } else { 3 }, |v| v.parse().expect("number")),
        warmup: arg(&args, "--warmup")
            .map_or(if wrk { 2.0 } else { 3.0 }, |v| v.parse().expect("secs")),
        duration: arg(&args, "--duration").map_or(
            if long {
                60.0
            } else if wrk {
                5.0
            } else {
                10.0
            },
            |v| v.parse().expect("secs"),
        ),
        connections: arg(&args, "--connections").map_or(64, |v| v.parse().expect("number")),
        body: arg(&args, "--body").map_or(1024, |v| v.parse().expect("bytes")),
        server_core: arg(&args, "--server-core").unwrap_or_else(|| "0".into()),
        gen_core: arg(&args, "--gen-core").unwrap_or_else(|| "1".into()),
        log_dir: log_dir.clone(),
        wrk: None,
    };
    let mut cfg = cfg;
    if wrk {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wrk/orders.lua");
        assert!(script.is_file(), "{} is missing", script.display());
        let body_file = log_dir.join("order.json");
        std::fs::write(&body_file, tower_idempotency_load::order_body(cfg.body)).expect("body");
        cfg.wrk = Some(Wrk {
            script,
            body_file,
            replay_keys: arg(&args, "--replay-keys").map_or(100, |v| v.parse().expect("number")),
        });
    }
    let rows: Vec<String> = arg(&args, "--rows")
        .unwrap_or_else(|| {
            if long {
                "memory,memory-bounded,redis".into()
            } else if wrk {
                WRK_ROWS.into()
            } else {
                ALL_ROWS.into()
            }
        })
        .split(',')
        .map(str::to_owned)
        .collect();
    let workloads: Vec<String> = arg(&args, "--workloads")
        .unwrap_or_else(|| "fresh,replay".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let out = arg(&args, "--out").map(PathBuf::from);
    let command = std::env::var("LOAD_COMMAND").unwrap_or_else(|_| args.join(" "));

    emit(
        out.as_deref(),
        &format!(
            "## Setup ({mode} mode)\n\n`{command}`\n\n{}\n",
            setup_text(&cfg, &mode)
        ),
    );
    let redis = RedisSet::start(&cfg, &rows);
    let pg = rows
        .iter()
        .any(|r| r == "postgres" || r == "postgres-pool")
        .then(|| Postgres::start(&cfg, false));
    let pg_durable = rows
        .iter()
        .any(|r| r == "postgres-durable")
        .then(|| Postgres::start(&cfg, true));
    let pg_of = |row: &str| match row {
        "postgres" | "postgres-pool" => pg.as_ref(),
        "postgres-durable" => pg_durable.as_ref(),
        _ => None,
    };

    if long {
        let mut s = String::from(
            "| row | req/s, first 10 s | req/s, last 10 s | last ÷ first | p99 (whole run) | executions / request | server RSS after |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for row in &rows {
            eprintln!("load-driver: long {row}");
            let c = run_case(
                &cfg,
                row,
                "fresh",
                redis_of(row, &redis),
                pg_of(row),
                cfg.warmup,
                cfg.duration,
            );
            let n = c.per_second.len();
            let first: f64 = c.per_second.iter().take(10).sum::<f64>() / 10.0;
            let last: f64 = c.per_second.iter().skip(n.saturating_sub(10)).sum::<f64>() / 10.0;
            let _ = writeln!(
                s,
                "| {row} | {first:.0} | {last:.0} | {:.3} | {} | {:.3} | {:.1} MiB |",
                last / first,
                fmt_us(c.p99_us),
                c.executions / c.sent,
                c.rss_after_kib / 1024.0
            );
            let per_s: Vec<String> = c.per_second.iter().map(|v| format!("{v:.0}")).collect();
            eprintln!("load-driver: {row} per second: {}", per_s.join(" "));
        }
        emit(out.as_deref(), &format!("{s}\n"));
    } else {
        let mut runs = Vec::new();
        for i in 0..cfg.runs {
            let mut r = BTreeMap::new();
            for row in &rows {
                for w in &workloads {
                    eprintln!("load-driver: run {}/{} {row} {w}", i + 1, cfg.runs);
                    let c = run_case(
                        &cfg,
                        row,
                        w,
                        redis_of(row, &redis),
                        pg_of(row),
                        cfg.warmup,
                        cfg.duration,
                    );
                    // PostgreSQL's own limit for the same statements, right after on the same
                    // server: pgbench, pinned like load-server.
                    let sample = pg_of(row)
                        .filter(|_| row != "postgres-pool")
                        .and_then(|pg| Some((pg, pg.sample_row()?)));
                    if let Some((pg, sample)) = sample.filter(|_| !long) {
                        eprintln!("load-driver: run {}/{} pgbench on {row} {w}", i + 1, cfg.runs);
                        let b = pg.pgbench(&cfg, w, &sample);
                        eprintln!("load-driver:   {:.0} transactions/s", b.rps);
                        r.insert((format!("pgbench:{row}"), w.clone()), b);
                    }
                    eprintln!(
                        "load-driver:   {:.0} req/s, p50 {}, p99 {}, executions {:.0} / sent {:.0}, non-201 {:.0}",
                        c.rps,
                        fmt_us(c.p50_us),
                        fmt_us(c.p99_us),
                        c.executions,
                        c.sent,
                        c.non_201 + c.errors
                    );
                    r.insert((row.clone(), w.clone()), c);
                }
            }
            runs.push(r);
        }
        emit(
            out.as_deref(),
            &format!(
                "## Medians of {} runs\n\n{}\n",
                cfg.runs,
                table(&rows, &workloads, &runs)
            ),
        );
        emit(
            out.as_deref(),
            &format!("### Summary\n\n{}\n", summary(&rows, &runs)),
        );
        if rows.iter().any(|r| r.starts_with("postgres")) {
            emit(
                out.as_deref(),
                &format!(
                    "### PostgreSQL at its own limit\n\n{}\n",
                    pg_limit(&rows, &workloads, &runs)
                ),
            );
        }
        if wrk {
            emit(
                out.as_deref(),
                &format!("### Targets (wrk mode)\n\n{}\n", targets_wrk(&runs)),
            );
        } else {
            emit(
                out.as_deref(),
                &format!("### Targets\n\n{}\n", targets(&runs)),
            );
        }
        emit(
            out.as_deref(),
            &format!("### Every run\n\n{}\n", per_run(&rows, &workloads, &runs)),
        );
    }
    drop(redis);
    drop(pg);
    drop(pg_durable);
    let _ = std::fs::remove_dir_all(&log_dir);
}

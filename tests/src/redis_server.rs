//! Redis for the Redis sink's tests: a `redis-server` of the test's own on
//! a free port, with `appendonly yes` and `appendfsync always` so an
//! acknowledged write survives the server's SIGKILL (the machine's shared
//! Redis keeps nothing on disk), and the reads the tests check results by.
//!
//! It must not write into a pipeline's keys.

use crate::scenarios::TestSink;
use crate::{PipelineToml, Seen, TempDir, free_port};
use redis::Commands;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of one test; killed when dropped.
pub struct RedisServer {
    pub port: u16,
    dir: TempDir,
    child: Option<Child>,
    /// `appendfsync always` (else no persistence at all).
    durable: bool,
    /// TLS only (no plain port), with this certificate.
    tls: Option<ServerTls>,
}

/// A TLS-only server's certificate, key and the authority that signed it.
struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl RedisServer {
    /// Starts a server persisting to its own directory.
    pub fn start(name: &str) -> RedisServer {
        Self::start_with(name, true)
    }

    /// Starts a server that persists every write (`durable`) or nothing.
    pub fn start_with(name: &str, durable: bool) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: TempDir::new(&format!("redis-{name}")),
            child: None,
            durable,
            tls: None,
        };
        server.restart();
        server
    }

    /// Starts a server that speaks only TLS, with `tls`'s server
    /// certificate (persisting nothing); [`RedisServer::url`] is then a
    /// `rediss://` URL, and the test's own connections trust `tls.ca`.
    pub fn start_tls(name: &str, tls: &crate::tls::Authority) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: TempDir::new(&format!("redis-{name}")),
            child: None,
            durable: false,
            tls: Some(ServerTls {
                cert: tls.cert.clone(),
                key: tls.key.clone(),
                ca: tls.ca.clone(),
            }),
        };
        server.restart();
        server
    }

    /// Starts (again) on the same port and directory: the AOF is replayed.
    pub fn restart(&mut self) {
        let port = self.port.to_string();
        let ports: Vec<&std::ffi::OsStr> = match &self.tls {
            None => vec!["--port".as_ref(), port.as_ref()],
            Some(tls) => vec![
                "--port".as_ref(),
                "0".as_ref(),
                "--tls-port".as_ref(),
                port.as_ref(),
                "--tls-cert-file".as_ref(),
                tls.cert.as_os_str(),
                "--tls-key-file".as_ref(),
                tls.key.as_os_str(),
                "--tls-ca-cert-file".as_ref(),
                tls.ca.as_os_str(),
                "--tls-auth-clients".as_ref(),
                "no".as_ref(),
            ],
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(match self.durable {
                true => ["--appendonly", "yes", "--appendfsync", "always"],
                false => ["--appendonly", "no", "--appendfsync", "no"],
            })
            .args(["--save", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (Debian package redis-server)");
        self.child = Some(child);
        let started = Instant::now();
        while self.try_conn().is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "redis-server did not answer on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the server (nothing is flushed beyond what the AOF holds).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to the server (SIGSTOP freezes it, SIGCONT thaws).
    pub fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("running").id() as i32;
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(pid, signal) };
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    fn try_conn(&self) -> Option<redis::Connection> {
        let client = match &self.tls {
            None => redis::Client::open(self.url()).ok()?,
            Some(tls) => {
                let root = std::fs::read(&tls.ca).expect("read the CA");
                let certificates = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                };
                redis::Client::build_with_tls(self.url(), certificates).ok()?
            }
        };
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        redis::cmd("PING").query::<String>(&mut conn).ok()?;
        Some(conn)
    }

    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect to the test's redis-server")
    }

    /// Committed batches of `pipeline` (its lineage entries).
    pub fn committed_batches(&self, pipeline: &str) -> i64 {
        self.try_conn()
            .and_then(|mut c| c.llen(format!("sluice_lineage:{pipeline}")).ok())
            .unwrap_or(0)
    }

    /// Records per second from the first to the last batch commit in
    /// `pipeline`'s lineage (the first batch's records left out), and the
    /// batch count.
    pub fn lineage_rate(&self, pipeline: &str) -> (f64, usize) {
        let entries: Vec<String> = self
            .conn()
            .lrange(format!("sluice_lineage:{pipeline}"), 0, -1)
            .expect("LRANGE");
        let parsed: Vec<(i64, i64)> = entries
            .iter()
            .map(|e| {
                let v: serde_json::Value = serde_json::from_str(e).expect("lineage JSON");
                (
                    v["committed_at_ms"].as_i64().unwrap(),
                    v["records"].as_i64().unwrap(),
                )
            })
            .collect();
        let (first_ms, first_records) = parsed[0];
        let last_ms = parsed.last().unwrap().0;
        let total: i64 = parsed.iter().map(|p| p.1).sum();
        let span = (last_ms - first_ms).max(1) as f64 / 1000.0;
        ((total - first_records) as f64 / span, parsed.len())
    }

    pub fn dead_letters(&self, pipeline: &str) -> usize {
        self.conn()
            .llen(format!("sluice_dead_letters:{pipeline}"))
            .expect("LLEN")
    }

    /// Asserts the lineage entries' ranges are contiguous per partition.
    pub fn assert_contiguous_lineage(&self, pipeline: &str) -> usize {
        let entries: Vec<String> = self
            .conn()
            .lrange(format!("sluice_lineage:{pipeline}"), 0, -1)
            .expect("LRANGE");
        crate::assert_entry_ranges_contiguous(entries.iter().map(String::as_str));
        entries.len()
    }

    /// The stream `rec:{partition}` an identity pipeline writes, as the
    /// records its entries came from.
    fn stream(&self, conn: &mut redis::Connection, partition: i32) -> Vec<Seen> {
        let entries: Vec<(String, BTreeMap<String, Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(format!("rec:{partition}"))
            .arg("-")
            .arg("+")
            .query(conn)
            .expect("XRANGE");
        entries
            .iter()
            .map(|(_, f)| Seen {
                partition,
                offset: String::from_utf8_lossy(&f["offset"]).parse().unwrap(),
                key: f
                    .get("key")
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                value: String::from_utf8_lossy(&f["value"]).into_owned(),
            })
            .collect()
    }

    /// Asserts what [`identity_redis_config`] writes equals `expected`
    /// (an independent `read_committed` read): per partition the stream
    /// `rec:P` holds each record once, in offset order; the hash `counts`
    /// counts them; the set `keys:P` holds their keys. Also: contiguous
    /// lineage, no dead letters. Returns the records checked.
    pub fn assert_identity_exactly_once(&self, pipeline: &str, expected: &[Seen]) -> usize {
        let mut conn = self.conn();
        let mut by_partition: BTreeMap<i32, Vec<&Seen>> = BTreeMap::new();
        for s in expected {
            by_partition.entry(s.partition).or_default().push(s);
        }
        let counts: BTreeMap<String, i64> = conn.hgetall("counts").expect("HGETALL counts");
        for (p, want) in &by_partition {
            let got = self.stream(&mut conn, *p);
            assert_eq!(
                got.len(),
                want.len(),
                "partition {p}: stream entries differ in number from the committed input"
            );
            assert!(
                got.iter().zip(want).all(|(g, w)| g == *w),
                "partition {p}: stream entries differ from the committed input"
            );
            assert_eq!(counts.get(&p.to_string()), Some(&(want.len() as i64)));
            let members: BTreeSet<String> = conn.smembers(format!("keys:{p}")).expect("SMEMBERS");
            let keys: BTreeSet<String> = want.iter().filter_map(|s| s.key.clone()).collect();
            assert_eq!(members, keys, "partition {p}: key set differs");
        }
        assert_eq!(
            counts.len(),
            by_partition.len(),
            "counts of unknown partitions"
        );
        self.assert_contiguous_lineage(pipeline);
        assert_eq!(self.dead_letters(pipeline), 0);
        expected.len()
    }
}

impl TestSink for RedisServer {
    fn label(&self) -> String {
        "redis".into()
    }

    /// The sink of [`identity_redis_config`].
    fn configure(&self, config: PipelineToml) -> PipelineToml {
        redis_identity(config, &self.url())
    }

    async fn progress(&self, pipeline: &str) -> i64 {
        self.committed_batches(pipeline)
    }

    /// The streams `rec:{partition}`.
    async fn identity_output(&self) -> Vec<Seen> {
        let mut conn = self.conn();
        let streams: Vec<String> = conn.keys("rec:*").expect("KEYS");
        let mut partitions: Vec<i32> = streams
            .iter()
            .filter_map(|k| k.strip_prefix("rec:")?.parse().ok())
            .collect();
        partitions.sort_unstable();
        partitions
            .into_iter()
            .flat_map(|p| self.stream(&mut conn, p))
            .collect()
    }

    async fn assert_lineage(&self, pipeline: &str) -> usize {
        let batches = self.assert_contiguous_lineage(pipeline);
        assert_eq!(self.dead_letters(pipeline), 0);
        batches
    }

    /// Also: the hash `counts` counts each partition's records, the sets
    /// `keys:P` hold their keys.
    async fn assert_identity_exactly_once(&self, pipeline: &str, expected: &[Seen]) -> usize {
        RedisServer::assert_identity_exactly_once(self, pipeline, expected)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The identity pipeline into Redis at `url` (`lock_timeout_ms = 3000`):
/// each record `xadd`ed to `rec:{partition}` (offset, key, value), counted
/// by partition in the hash `counts`, its key added to the set
/// `keys:{partition}`; exactly-once.
pub fn identity_redis_config(
    pipeline: &str,
    brokers: &str,
    topic: &str,
    url: &str,
    max_records: u32,
) -> PipelineToml {
    redis_identity(
        PipelineToml::identity(pipeline, brokers, topic, max_records),
        url,
    )
}

/// `config`'s `[sink]` pointed at Redis `url`, the identity's `records`
/// written as [`identity_redis_config`] says.
fn redis_identity(config: PipelineToml, url: &str) -> PipelineToml {
    config
        .sink_url(url)
        .sink("lock_timeout_ms", 3000)
        .targets(|target| {
            target
                .redis(&[
                    ("command", "xadd".into()),
                    ("key", "rec:{partition}".into()),
                    ("fields", vec!["offset", "key", "value"].into()),
                ])
                .redis(&[
                    ("command", "hincrby".into()),
                    ("key", "counts".into()),
                    ("field", "{partition}".into()),
                ])
                .redis(&[
                    ("command", "sadd".into()),
                    ("key", "keys:{partition}".into()),
                    ("member", "{key}".into()),
                ])
        })
}

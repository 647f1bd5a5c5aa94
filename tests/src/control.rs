//! Helpers for the module-lifecycle tests: a long-running `sluice run` with
//! its control API on a free port, the CLI, a producer that writes until
//! told to stop, and the check that every committed row matches the module
//! version its batch's lineage row names.

use crate::sinks::SinkDb;
use crate::{Produce, Seen, free_port, sluice_bin};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The token the tests' hosts accept for writes.
pub const TOKEN: &str = "test-token-1234";

/// The Prometheus text the control API on `port` serves at `/metrics`,
/// asserted to be that (200, Prometheus's text content type).
pub fn scrape_metrics(port: u16) -> String {
    let answer = raw_request(port, "GET /metrics HTTP/1.1", b"");
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        answer.headers
    );
    answer.body
}

/// Sums the samples of metric `name` whose labels contain every one of
/// `labels` (`key="value"`) in a Prometheus text scrape.
pub fn metric_sample(scrape: &str, name: &str, labels: &[&str]) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name && labels.iter().all(|label| rest.contains(label))
        })
        .map(|(_, value)| value.parse::<f64>().expect("a sample value"))
        .sum::<f64>()
        // An empty float sum is -0.0.
        + 0.0
}

/// A free port for a control API, and its base URL.
pub fn control_port() -> (u16, String) {
    let port = free_port();
    (port, format!("http://127.0.0.1:{port}"))
}

/// A `sluice run CONFIG` (no end) with `SLUICE_CONTROL_TOKEN` set and
/// info logs in a file; killed on drop.
pub struct Host {
    child: Option<Child>,
    log: PathBuf,
    /// The control API's port, once [`Host::wait_for_api`] saw it up.
    api: std::cell::Cell<Option<u16>>,
}

impl Host {
    pub fn start(config: &Path, log: &Path) -> Host {
        Host::start_as(config, log, None)
    }

    /// [`Host::start`] as static member `instance` of the group
    /// (`SLUICE_INSTANCE_ID`, as a StatefulSet pod gets its name).
    pub fn start_as(config: &Path, log: &Path, instance: Option<&str>) -> Host {
        let mut command = Command::new(sluice_bin());
        if let Some(id) = instance {
            command.env("SLUICE_INSTANCE_ID", id);
        }
        let child = command
            .arg("run")
            .arg(config)
            .env("SLUICE_LOG", "info")
            .env("SLUICE_CONTROL_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("spawn sluice");
        Host {
            child: Some(child),
            log: log.to_path_buf(),
            api: std::cell::Cell::new(None),
        }
    }

    /// Waits until the control API at `port` accepts connections.
    pub fn wait_for_api(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "control API on {port} did not come up; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.api.set(Some(port));
    }

    /// Metric `name` scraped from the control API, summed over its label
    /// sets (0 before it is first set).
    pub fn metric(&self, name: &str) -> f64 {
        let port = self.api.get().expect("wait_for_api first");
        metric_sample(&scrape_metrics(port), name, &[])
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's warnings and errors and its last `lines` lines: what a
    /// failure message can carry whole when a run logs every batch.
    pub fn log_summary(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        let tail_from = all.len().saturating_sub(lines);
        let notable = all[..tail_from]
            .iter()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "));
        let mut summary: Vec<&str> = notable.copied().collect();
        summary.push("[...]");
        summary.extend_from_slice(&all[tail_from..]);
        summary.join("\n")
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// The process's peak resident memory so far (`VmHWM`), in MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        proc_status_kib(self.pid(), "VmHWM:") / 1024
    }

    /// The process's resident memory now (`VmRSS`), in MiB.
    pub fn rss_mib(&self) -> u64 {
        proc_status_kib(self.pid(), "VmRSS:") / 1024
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("try_wait").is_none()
    }

    /// Sends SIGTERM and waits up to `limit` for the process to exit
    /// (`what` names the case if it does not); returns how long it took.
    pub fn terminate_within(&mut self, limit: Duration, what: &str) -> Duration {
        let asked = Instant::now();
        self.signal(libc::SIGTERM);
        while self.is_running() {
            assert!(
                asked.elapsed() < limit,
                "{what}: still running {limit:?} after SIGTERM; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        asked.elapsed()
    }

    /// How the process ended, once it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut().expect("started");
        child.try_wait().expect("try_wait")
    }

    /// Waits until the log contains `needle` `times` times.
    pub fn wait_for_log(&self, needle: &str, times: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.log().matches(needle).count() < times {
            assert!(
                Instant::now() < deadline,
                "`{needle}` not logged {times} times within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until [`Host::metric`] `name` reaches `at_least`.
    pub fn wait_for_metric(&self, name: &str, at_least: f64, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.metric(name) < at_least {
            assert!(
                Instant::now() < deadline,
                "`{name}` stayed below {at_least} for {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM (drain), then asserts a clean exit.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().expect("wait");
        assert!(
            status.success(),
            "sluice exited with {status}; log:\n{}",
            self.log()
        );
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One field of `/proc/PID/status`, in KiB.
fn proc_status_kib(pid: i32, field: &str) -> u64 {
    status_kib(pid, field).unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// An HTTP answer read off a raw connection.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    /// Header lines, names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON; panics (naming the answer) if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {self:?}"))
    }
}

/// Sends `head` (request line and headers, without the blank line) and
/// `body` on a new connection, with `Connection: close`, and reads the
/// whole answer. For requests no well-behaved client would send.
pub fn raw_request(port: u16, head: &str, body: &[u8]) -> RawAnswer {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = format!("{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).expect("send head");
    // The server may refuse before reading the whole body.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let read = stream.read_to_end(&mut answer);
    assert!(!answer.is_empty(), "no answer to {head:?}: {read:?}");
    parse_answer(&answer)
}

/// Reads what the server sends on `stream` until it closes the connection:
/// the answer, if it sent one (`None` if it closed or reset without one).
pub fn raw_answer_or_closed(stream: &mut std::net::TcpStream) -> Option<RawAnswer> {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    (!answer.is_empty()).then(|| parse_answer(&answer))
}

/// True if the server closes (or resets) `stream` within `limit`; bytes it
/// sends before are read and dropped.
pub fn closed_within(stream: &mut std::net::TcpStream, limit: Duration) -> bool {
    use std::io::{ErrorKind, Read};
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).expect("timeout");
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

fn parse_answer(raw: &[u8]) -> RawAnswer {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    RawAnswer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// Runs the CLI with `args` against the control API at `url`, with `token`
/// (if any) in the environment.
pub fn cli(url: &str, token: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut command = Command::new(sluice_bin());
    command
        .args(args)
        .env("SLUICE_CONTROL_URL", url)
        .env_remove("SLUICE_CONTROL_TOKEN");
    if let Some(t) = token {
        command.env("SLUICE_CONTROL_TOKEN", t);
    }
    command.output().expect("run sluice CLI")
}

/// Runs the CLI and asserts success; returns its stdout.
pub fn cli_ok(url: &str, args: &[&str]) -> String {
    let out = cli(url, Some(TOKEN), args);
    assert!(
        out.status.success(),
        "sluice {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sluice deploy hostile.wasm --params {"mode":MODE} --activate` against
/// the control API at `url`; its output.
pub fn deploy_hostile(url: &str, mode: &str) -> String {
    let hostile = crate::plugin("hostile");
    let params = format!(r#"{{"mode":"{mode}"}}"#);
    cli_ok(
        url,
        &[
            "deploy",
            hostile.to_str().unwrap(),
            "--params",
            &params,
            "--activate",
        ],
    )
}

/// Runs `sluice ARGS` (no control API involved) and asserts success;
/// returns its stdout.
pub fn sluice_ok(args: &[&str]) -> String {
    let out = Command::new(sluice_bin())
        .args(args)
        .output()
        .expect("run sluice");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sluice {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `verify` replays every batch of `config`'s pipeline alike; returns how
/// many.
pub fn assert_verified(config: &std::path::Path) -> usize {
    let out = sluice_ok(&["verify", config.to_str().unwrap()]);
    let line = out
        .lines()
        .find(|l| l.starts_with("verified "))
        .unwrap_or_else(|| panic!("no verify summary: {out}"));
    let batches: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        line.contains(&format!("{batches} match, 0 differ")) && batches > 0,
        "{out}"
    );
    batches
}

/// Every dead letter `sluice dead-letters list CONFIG --json --limit 0`
/// prints, parsed.
pub fn listed_dead_letters(config: &str) -> Vec<serde_json::Value> {
    sluice_ok(&["dead-letters", "list", config, "--json", "--limit", "0"])
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a listed dead letter as JSON"))
        .collect()
}

/// A listed dead letter's record as `dead-letters show` takes it:
/// `TOPIC:PARTITION:OFFSET`.
pub fn record_of(listed: &serde_json::Value) -> String {
    format!(
        "{}:{}:{}",
        listed["topic"].as_str().expect("a topic"),
        listed["partition"],
        listed["offset"]
    )
}

/// Produces numbered records in small acknowledged chunks until stopped.
pub struct Producer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Producer {
    pub fn start(brokers: &str, topic: &str, partitions: i32) -> Producer {
        let stop = Arc::new(AtomicBool::new(false));
        let (brokers, topic, flag) = (brokers.to_string(), topic.to_string(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            use rdkafka::producer::Producer as _;
            // One connection for the whole run, so records arrive steadily.
            let producer = crate::producer(&brokers, None);
            let mut sent = 0;
            while !flag.load(Ordering::SeqCst) {
                let chunk: Vec<Produce> = (sent..sent + 200)
                    .map(|i| Produce {
                        partition: (i as i32) % partitions,
                        key: Some(format!("k{i}")),
                        value: format!("value {i}"),
                    })
                    .collect();
                for r in &chunk {
                    crate::send(&producer, &topic, r);
                }
                producer.flush(Duration::from_secs(60)).expect("flush");
                sent += chunk.len();
                std::thread::sleep(Duration::from_millis(20));
            }
            sent
        });
        Producer {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops producing; returns how many records were produced.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("producer")
    }
}

/// Waits until `db`'s `records` table holds `expected` rows.
pub async fn wait_for_rows(db: &SinkDb, expected: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    let count = format!("SELECT COUNT(*) FROM {}", db.table("records"));
    loop {
        let n = db.scalar(&count).await.unwrap_or(0) as usize;
        if n >= expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of {expected} rows within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One committed batch as lineage records it.
#[derive(Debug, Clone)]
pub struct LineageBatch {
    pub batch_id: String,
    pub module_digest: String,
    pub params_digest: String,
    pub committed_at_ms: i64,
    /// (partition, from, until)
    pub ranges: Vec<(i32, i64, i64)>,
}

/// Every committed batch of `pipeline`, in commit order.
pub async fn lineage(db: &SinkDb, pipeline: &str) -> Vec<LineageBatch> {
    let pool = db.pool().await;
    let batches: Vec<(String, String, String, i64)> = sqlx::query_as(&format!(
        "SELECT {id}, {m}, {p}, {at} FROM {t} WHERE {pl} = '{pipeline}' ORDER BY {at}, {id}",
        id = db.ident("batch_id"),
        m = db.ident("module_digest"),
        p = db.ident("params_digest"),
        at = db.ident("committed_at_ms"),
        pl = db.ident("pipeline"),
        t = db.table("sluice_batches"),
    ))
    .fetch_all(&pool)
    .await
    .expect("batches");
    let ranges: Vec<(String, i64, i64, i64)> = sqlx::query_as(&format!(
        "SELECT {id}, {part}, {f}, {u} FROM {t} WHERE {pl} = '{pipeline}'",
        id = db.ident("batch_id"),
        part = db.ident("partition"),
        f = db.ident("from_offset"),
        u = db.ident("until_offset"),
        pl = db.ident("pipeline"),
        t = db.table("sluice_batch_ranges"),
    ))
    .fetch_all(&pool)
    .await
    .expect("batch ranges");
    batches
        .into_iter()
        .map(
            |(batch_id, module_digest, params_digest, committed_at_ms)| LineageBatch {
                ranges: ranges
                    .iter()
                    .filter(|r| r.0 == batch_id)
                    .map(|r| (r.1 as i32, r.2, r.3))
                    .collect(),
                batch_id,
                module_digest,
                params_digest,
                committed_at_ms,
            },
        )
        .collect()
}

/// Asserts every row in `rows` is `expected`'s record as transformed by the
/// version its batch's lineage row names: `transform(module_digest, record)`
/// gives the value that version writes. Rows and expected records must match
/// one to one (nothing lost, nothing duplicated).
pub fn assert_rows_follow_lineage(
    rows: &[Seen],
    expected: &[Seen],
    batches: &[LineageBatch],
    transform: impl Fn(&str, &str) -> String,
) {
    assert_eq!(
        rows.len(),
        expected.len(),
        "row count vs read_committed input"
    );
    for (row, input) in rows.iter().zip(expected) {
        assert_eq!(
            (row.partition, row.offset, &row.key),
            (input.partition, input.offset, &input.key),
            "rows differ from the input"
        );
        let batch = batches
            .iter()
            .find(|b| {
                b.ranges
                    .iter()
                    .any(|&(p, f, u)| p == row.partition && f <= row.offset && row.offset < u)
            })
            .unwrap_or_else(|| panic!("no batch covers {}@{}", row.partition, row.offset));
        assert_eq!(
            row.value,
            transform(&batch.module_digest, &input.value),
            "row {}@{} does not match the version of batch {}",
            row.partition,
            row.offset,
            batch.batch_id
        );
    }
}

/// What a sampled run of `sluice` left behind.
pub struct SampledRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// The process's own peak resident memory (`VmHWM`), in MiB.
    pub peak_rss_mib: u64,
    /// The largest peak seen among the processes it started, in MiB.
    pub children_peak_rss_mib: u64,
}

/// Runs `sluice ARGS` to completion, sampling every 2 ms the peak resident
/// memory of the process and of each process it starts (a compile worker).
/// Unlike wait4's rusage, neither figure inherits the high-water mark of
/// the test process that forked it. A child living under 2 ms may be
/// missed; its peak is then not counted.
///
/// The process's own figure is read only once its name is the binary's:
/// `spawn` may return while `execve` is still switching the new process
/// from the test's memory to its own (the kernel wakes a vfork parent
/// before it swaps the memory map, and renames the task after), and a
/// sample in that window reads the test process's high-water mark (seen:
/// 788 MiB for a `sluice check` that peaks at 33).
pub fn sluice_sampled(args: &[&std::ffi::OsStr]) -> SampledRun {
    sluice_sampled_logging(args, "warn")
}

/// [`sluice_sampled`] with `SLUICE_LOG=log`.
pub fn sluice_sampled_logging(args: &[&std::ffi::OsStr], log: &str) -> SampledRun {
    let bin = sluice_bin();
    let name: String = bin
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default();
    let mut child = Command::new(&bin)
        .args(args)
        .env("SLUICE_LOG", log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let pid = child.id() as i32;
    let read_all = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("piped")));
    let reader = read_all(Box::new(child.stderr.take().expect("piped")));
    let (mut own, mut children) = (0, 0);
    let status = loop {
        if status_text(pid, "Name:").is_some_and(|n| n == name) {
            own = own.max(status_kib(pid, "VmHWM:").unwrap_or(0));
        }
        for c in children_of(pid) {
            children = children.max(status_kib(c, "VmHWM:").unwrap_or(0));
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    SampledRun {
        success: status.success(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: reader.join().expect("stderr reader"),
        peak_rss_mib: own / 1024,
        children_peak_rss_mib: children / 1024,
    }
}

/// The processes `pid` started, from any of its threads.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|l| {
            l.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// A field of `/proc/PID/status` in KiB, if the process is still there.
pub fn status_kib(pid: i32, field: &str) -> Option<u64> {
    status_text(pid, field)?
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// A field of `/proc/PID/status` as text, if the process is still there.
fn status_text(pid: i32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_string())
}

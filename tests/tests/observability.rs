//! What an operator sees of a running pipeline, through the CLI and the
//! control API of a real `sluice run`: Prometheus metrics that agree with
//! what the sink committed, module log lines kept with their level and
//! batch (read, filtered and followed with `sluice logs`), and JSON log
//! output for log shippers, and secrets from the environment or files kept
//! out of all of it.
//!
//! Each test has its own topic, pipeline, SQLite file and control port.

use serde_json::Value as Json;
use sluice_tests::control::{
    Host, TOKEN, control_port, metric_sample, raw_request, scrape_metrics,
};
use sluice_tests::{
    PipelineToml, Produce, Target, TempDir, create_topic, identity_config, plugin, produce,
    shared_broker, sluice_bin,
};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A `sluice run` of pipeline `topic` on a new 2-partition topic of that
/// name, running plugin `module` into SQLite with the one target given,
/// serving its control API; returns it with the API's port and the
/// database's path.
fn start_host(
    dir: &TempDir,
    topic: &str,
    module: &str,
    target: Target,
) -> (Host, u16, std::path::PathBuf) {
    create_topic(shared_broker(), topic, 2);
    let (port, _) = control_port();
    let db = dir.path().join("out.db");
    let path = PipelineToml::new(topic, shared_broker(), &[topic], &plugin(module))
        .max_records_per_partition(300)
        .batch_interval_ms(100)
        .sink_url(&format!("sqlite://{}", db.display()))
        .target(target)
        .control(port, 4 * 1024 * 1024)
        .write(dir.path());
    let host = Host::start(&path, &dir.path().join("host.log"));
    host.wait_for_api(port);
    (host, port, db)
}

/// Scrapes until `sluice_records_in_total` reaches `records`.
fn scrape_when_caught_up(port: u16, records: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let metrics = scrape_metrics(port);
        if metric_sample(&metrics, "sluice_records_in_total", &[]) >= records as f64 {
            return metrics;
        }
        assert!(Instant::now() < deadline, "not caught up:\n{metrics}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET /metrics` scraped while a pipeline runs (no token: it is a read),
/// after each of two waves of records: its counters equal what the sink
/// committed (records in = the lineage's records, rows per target = the
/// target's rows, dead letters by kind = the dead-letter table's, batches
/// = lineage rows), each partition's checkpoint is the stored one and its
/// lag is log end − checkpoint, and the active module is the one lineage
/// names.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_agree_with_the_committed_lineage() {
    let topic = "obs-metrics";
    let dir = TempDir::new(topic);
    let (host, port, db) = start_host(
        &dir,
        topic,
        "json-filter",
        Target::new("purchases")
            .column("id", "integer")
            .column("user", "text")
            .column("amount", "real"),
    );
    let pool = sluice_tests::sqlite(&db).await;
    let mut produced = 0;
    for wave in 0..2 {
        let records: Vec<Produce> = (produced..produced + 2000)
            .map(|i| Produce {
                partition: (i % 2) as i32,
                key: None,
                // Every tenth is not JSON: a dead letter.
                value: if i % 10 == 3 {
                    format!("not json {i}")
                } else {
                    format!(r#"{{"id":{i},"user":"u{i}","event":"purchase","amount":20.0}}"#)
                },
            })
            .collect();
        produce(shared_broker(), topic, &records);
        produced += records.len();
        let metrics = scrape_when_caught_up(port, produced);
        let pipeline = format!(r#"pipeline="{topic}""#);
        let of_pipeline = |name: &str, labels: &[&str]| {
            let mut all = labels.to_vec();
            all.push(&pipeline);
            metric_sample(&metrics, name, &all)
        };
        let lineage: (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), sum(records_in), sum(rows_out), sum(dead_letters) FROM sluice_batches",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM purchases")
            .fetch_one(&pool)
            .await
            .unwrap();
        let rejected: i64 =
            sqlx::query_scalar("SELECT count(*) FROM sluice_dead_letters WHERE kind = 'rejected'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(lineage.1, produced as i64, "wave {wave}");
        assert_eq!(
            of_pipeline("sluice_records_in_total", &[]),
            lineage.1 as f64
        );
        assert_eq!(of_pipeline("sluice_batches_total", &[]), lineage.0 as f64);
        assert_eq!(
            of_pipeline("sluice_batch_duration_seconds_count", &[]),
            lineage.0 as f64
        );
        assert_eq!(
            of_pipeline("sluice_fuel_used_per_batch_count", &[]),
            lineage.0 as f64
        );
        assert!(of_pipeline("sluice_fuel_used_per_batch_sum", &[]) > 0.0);
        assert_eq!(
            of_pipeline("sluice_rows_out_total", &[r#"target="purchases""#]),
            rows as f64
        );
        assert_eq!(rows, lineage.2);
        assert_eq!(rejected, produced as i64 / 10, "wave {wave}");
        assert_eq!(
            of_pipeline("sluice_dead_letters_total", &[r#"kind="rejected""#]),
            rejected as f64
        );
        assert_eq!(
            of_pipeline("sluice_dead_letters_total", &[]),
            lineage.3 as f64
        );
        assert_eq!(of_pipeline("sluice_assigned_partitions", &[]), 2.0);
        assert_eq!(of_pipeline("sluice_fenced_commits_total", &[]), 0.0);
        let checkpoints: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT partition, next_offset FROM sluice_checkpoints ORDER BY partition",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(checkpoints.len(), 2);
        for (partition, next) in checkpoints {
            let labels = [format!(r#"partition="{partition}""#)];
            let labels = [labels[0].as_str()];
            let checkpoint = of_pipeline("sluice_partition_checkpoint", &labels);
            let log_end = of_pipeline("sluice_partition_log_end", &labels);
            let lag = of_pipeline("sluice_partition_lag", &labels);
            assert_eq!(checkpoint, next as f64, "partition {partition}");
            assert_eq!(lag, log_end - checkpoint, "partition {partition}");
            assert!(lag >= 0.0);
        }
        let module: String =
            sqlx::query_scalar("SELECT DISTINCT module_digest FROM sluice_batches")
                .fetch_one(&pool)
                .await
                .unwrap();
        let active = format!(r#"module_digest="{module}""#);
        assert_eq!(of_pipeline("sluice_active_module", &[&active]), 1.0);
        assert_eq!(of_pipeline("sluice_active_module", &[]), 1.0);
        println!(
            "wave {wave}: {} batches, {} records, {rows} rows, {rejected} dead letters agree",
            lineage.0, lineage.1
        );
    }
    host.stop();
}

/// `sluice logs` with the control token (and `--json`, `--batch`,
/// `--follow`) against a running pipeline whose module logs: every
/// batch's info line is there once, with the batch's id and its record
/// count from lineage; warnings and errors keep their level; `--batch`
/// shows one batch's lines; a follower prints the lines of batches
/// committed after it started, each line once; a reader without the token
/// is refused.
#[tokio::test(flavor = "multi_thread")]
async fn module_logs_are_kept_with_their_level_and_batch_and_followed() {
    let topic = "obs-logs";
    let dir = TempDir::new(topic);
    let (host, port, db) = start_host(
        &dir,
        topic,
        "chatty",
        Target::new("records")
            .column("offset", "integer")
            .column("value", "text"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let values = |from: usize, to: usize| -> Vec<Produce> {
        (from..to)
            .map(|i| Produce {
                partition: (i % 2) as i32,
                key: None,
                value: match i % 50 {
                    0 => "warn",
                    1 => "error",
                    _ => "quiet",
                }
                .into(),
            })
            .collect()
    };
    produce(shared_broker(), topic, &values(0, 1000));
    scrape_when_caught_up(port, 1000);
    let logs = |args: &[&str], token: Option<&str>| {
        let mut command = Command::new(sluice_bin());
        command
            .arg("logs")
            .args(args)
            .env("SLUICE_CONTROL_URL", &url)
            .env_remove("SLUICE_CONTROL_TOKEN");
        if let Some(token) = token {
            command.env("SLUICE_CONTROL_TOKEN", token);
        }
        command.output().expect("run sluice logs")
    };
    let out = logs(&["--json"], Some(TOKEN));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let pool = sluice_tests::sqlite(&db).await;
    let batches: Vec<(String, i64)> =
        sqlx::query_as("SELECT batch_id, records_in FROM sluice_batches ORDER BY batch_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(batches.len() >= 2, "{batches:?}");
    for (batch, records) in &batches {
        let infos: Vec<&Json> = lines
            .iter()
            .filter(|l| l["batch_id"] == batch.as_str() && l["level"] == "info")
            .collect();
        assert_eq!(infos.len(), 1, "batch {batch}: {infos:?}");
        let said = infos[0]["message"].as_str().unwrap();
        assert!(
            said.starts_with(&format!("{records} records from ")),
            "{said}"
        );
    }
    let count = |level: &str| lines.iter().filter(|l| l["level"] == level).count();
    assert_eq!(count("warn"), 20);
    assert_eq!(count("error"), 20);
    assert_eq!(count("info"), batches.len());
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    // One batch's lines, as text.
    let (one, records) = &batches[0];
    let out = logs(&["--batch", one], Some(TOKEN));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.lines().all(|l| l.starts_with(one.as_str())), "{text}");
    assert!(
        text.contains(&format!("info   {records} records from ")),
        "{text}"
    );

    // No token, or a wrong one: refused, and nothing printed.
    for token in [None, Some("wrong")] {
        let out = logs(&[], token);
        assert!(!out.status.success());
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("module logs may carry record data"), "{err}");
    }

    // A follower sees the lines of batches committed after it started.
    let mut follower = Command::new(sluice_bin())
        .args(["logs", "--follow", "--json"])
        .env("SLUICE_CONTROL_URL", &url)
        .env("SLUICE_CONTROL_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if seen_tx.send(line).is_err() {
                break;
            }
        }
    });
    let initial = lines.len();
    produce(shared_broker(), topic, &values(1000, 1500));
    scrape_when_caught_up(port, 1500);
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice_batches")
        .fetch_one(&pool)
        .await
        .unwrap();
    let expected = initial + (total as usize - batches.len()) + 20;
    let mut followed: Vec<Json> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while followed.len() < expected && Instant::now() < deadline {
        if let Ok(line) = seen.recv_timeout(Duration::from_millis(500)) {
            followed.push(serde_json::from_str(&line).unwrap());
        }
    }
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(follower.id() as i32, libc::SIGTERM) };
    let stopped = follower.wait().unwrap();
    assert!(stopped.success(), "the follower stops cleanly on SIGTERM");
    assert_eq!(followed.len(), expected, "lines followed");
    let followed_seqs: Vec<u64> = followed
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert!(
        followed_seqs.windows(2).all(|w| w[0] < w[1]),
        "each line once"
    );
    let newest: Vec<String> = sqlx::query_scalar(
        "SELECT batch_id FROM sluice_batches ORDER BY committed_at_ms DESC LIMIT 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        followed.iter().any(|l| l["batch_id"] == newest[0].as_str()),
        "the newest batch's line was followed"
    );
    println!(
        "{} lines over {total} batches, {} followed",
        lines.len() + followed.len() - initial,
        followed.len()
    );
    host.stop();
}

/// `SLUICE_LOG_FORMAT=json`: every line a pipeline run writes to stderr is
/// one JSON object, its fields at the top level (a committed batch's id
/// and record count among them); another value is refused before anything
/// runs.
#[test]
fn json_log_format_gives_one_object_per_line() {
    let topic = "obs-json-logs";
    let dir = TempDir::new(topic);
    create_topic(shared_broker(), topic, 1);
    let records: Vec<Produce> = (0..200)
        .map(|i| Produce {
            partition: 0,
            key: None,
            value: format!("v{i}"),
        })
        .collect();
    produce(shared_broker(), topic, &records);
    let config = dir.path().join("pipeline.toml");
    std::fs::write(
        &config,
        identity_config(
            topic,
            shared_broker(),
            topic,
            &dir.path().join("out.db"),
            100,
        )
        .to_string(),
    )
    .unwrap();
    let out = Command::new(sluice_bin())
        .args(["run", "--until-caught-up"])
        .arg(&config)
        .env("SLUICE_LOG", "info")
        .env("SLUICE_LOG_FORMAT", "json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let events: Vec<Json> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let committed: Vec<&Json> = events
        .iter()
        .filter(|e| e["message"] == "batch committed")
        .collect();
    assert!(!committed.is_empty(), "{stderr}");
    let records: u64 = committed
        .iter()
        .map(|e| e["records"].as_u64().unwrap())
        .sum();
    assert_eq!(records, 200);
    assert!(
        committed
            .iter()
            .all(|e| e["level"] == "INFO" && e["batch"].is_string())
    );

    let out = Command::new(sluice_bin())
        .arg("check")
        .arg(&config)
        .env("SLUICE_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("SLUICE_LOG_FORMAT is `xml`"), "{stderr}");
}

/// A headless Chromium (Debian's `chromium`, or `$CHROMIUM`), run as the
/// page's reader: the DOM after its script ran, and a screenshot.
fn chromium(args: &[&str], url: &str) -> String {
    let browser = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let profile = TempDir::new("obs-chromium-profile");
    let out = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            // Lets the page's fetches and first refresh finish first.
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("{browser} (scripts/test.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of the element with `id` in `dom` (a leaf: no tags inside).
fn text_of(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = at + dom[at..].find('>')? + 1;
    let end = start + dom[start..].find('<')?;
    Some(dom[start..end].to_string())
}

/// `GET /` served to a real browser (headless Chromium) while a pipeline
/// with dead letters is caught up: the page's script fills in the numbers
/// and they are the API's (counters, each partition's checkpoint, log end
/// and lag, the newest batches and dead letters, the version history and
/// a chart with bars); a screenshot is kept under the test's target
/// directory. The page carries a CSP that allows its own script only.
#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_shows_in_a_browser_what_the_api_says() {
    let topic = "obs-page";
    let dir = TempDir::new(topic);
    let (host, port, _db) = start_host(
        &dir,
        topic,
        "json-filter",
        Target::new("purchases")
            .column("id", "integer")
            .column("user", "text")
            .column("amount", "real"),
    );
    let records: Vec<Produce> = (0..1500)
        .map(|i| Produce {
            partition: i % 2,
            key: None,
            value: if i % 10 == 3 {
                format!("not json {i}")
            } else {
                format!(r#"{{"id":{i},"user":"u{i}","event":"purchase","amount":20.0}}"#)
            },
        })
        .collect();
    produce(shared_broker(), topic, &records);
    scrape_when_caught_up(port, records.len());

    let page = raw_request(port, "GET / HTTP/1.1", b"");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|t| t.starts_with("text/html"))
    );
    let csp = page.header("content-security-policy").expect("a CSP");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-eval"),
        "{csp}"
    );

    let url = format!("http://127.0.0.1:{port}/");
    let api = |path: &str| raw_request(port, &format!("GET {path} HTTP/1.1"), b"").json();
    // The pipeline is idle: the API says the same before and after the
    // browser read the page, or the reading is repeated.
    let (status, versions, dom) = loop {
        let before = api("/v1/status");
        let dom = chromium(&["--dump-dom"], &url);
        let after = api("/v1/status");
        if before["running"] == after["running"] {
            break (after, api("/v1/versions"), dom);
        }
    };
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the script did not run:\n{dom}"
    );
    let running = &status["running"];
    assert_eq!(text_of(&dom, "pipeline").as_deref(), Some(topic));
    for counter in ["batches", "records", "rows", "dead_letters", "fenced"] {
        assert_eq!(
            text_of(&dom, &format!("counter-{counter}")),
            Some(running[counter].to_string()),
            "{counter}"
        );
    }
    assert_eq!(running["records"], 1500);
    assert_eq!(running["dead_letters"], 150);
    let partitions = running["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 2);
    for p in partitions {
        let key = format!("{}-{}", p["topic"].as_str().unwrap(), p["partition"]);
        assert_eq!(
            text_of(&dom, &format!("checkpoint-{key}")),
            Some(p["next_offset"].to_string())
        );
        assert_eq!(
            text_of(&dom, &format!("log-end-{key}")),
            Some(p["log_end"].to_string())
        );
        assert_eq!(
            text_of(&dom, &format!("lag-{key}")),
            Some(p["lag"].to_string())
        );
    }
    let recent = running["recent_batches"].as_array().unwrap();
    assert!(!recent.is_empty());
    for b in recent {
        assert!(dom.contains(&format!("id=\"batch-{}\"", b["batch_id"].as_str().unwrap())));
    }
    let dead = running["recent_dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 20);
    for d in dead {
        assert!(
            dom.contains(&format!("<td>{}</td>", d["record"].as_str().unwrap())),
            "{d}"
        );
    }
    for v in versions["history"].as_array().unwrap() {
        assert!(dom.contains(&format!("id=\"version-{}\"", v["version"])));
    }
    assert!(dom.contains("class=\"bars\""), "no bars in the chart");
    assert!(!dom.contains("cannot reach the host"));

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &[
            "--window-size=1280,1700",
            &format!("--screenshot={}", shot.display()),
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("status page screenshot: {}", shot.display());
    host.stop();
}

/// A batch that traps on one record runs many times (a retry, then
/// bisection down to that record), yet `sluice logs` has each of its
/// records' lines once: every `warn` line once, and the panic message of
/// the record that became a dead letter once.
#[tokio::test(flavor = "multi_thread")]
async fn a_bisected_batch_logs_each_records_lines_once() {
    let topic = "obs-logs-bisect";
    let dir = TempDir::new(topic);
    let (host, port, db) = start_host(
        &dir,
        topic,
        "chatty",
        Target::new("records")
            .column("offset", "integer")
            .column("value", "text"),
    );
    // Partition 0: a warn every 7th record, one panic at its offset 100.
    let records: Vec<Produce> = (0..400)
        .map(|i| Produce {
            partition: i % 2,
            key: None,
            value: match (i % 2, i / 2) {
                (0, 100) => "panic".to_string(),
                (0, o) if o % 7 == 0 => "warn".to_string(),
                _ => "quiet".to_string(),
            },
        })
        .collect();
    produce(shared_broker(), topic, &records);
    scrape_when_caught_up(port, records.len());
    let pool = sluice_tests::sqlite(&db).await;
    let traps: Vec<(i64, String)> =
        sqlx::query_as("SELECT \"offset\", reason FROM sluice_dead_letters WHERE kind = 'trap'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(traps.len(), 1, "{traps:?}");
    assert_eq!(traps[0].0, 100);
    assert!(
        traps[0].1.contains("offset 100 says panic"),
        "{}",
        traps[0].1
    );

    let out = Command::new(sluice_bin())
        .args([
            "logs",
            "--json",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .env("SLUICE_CONTROL_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let with = |text: &str| {
        lines
            .iter()
            .filter(|l| l["message"].as_str().unwrap().contains(text))
            .count()
    };
    for offset in (0..200).filter(|o| o % 7 == 0 && *o != 100) {
        assert_eq!(
            with(&format!("offset {offset} says warn")),
            1,
            "offset {offset}"
        );
    }
    assert_eq!(with("offset 100 says panic"), 1, "{lines:#?}");
    host.stop();
}

/// `GET /readyz` through a rebalance, as a rolling deploy meets it: an
/// instance that has settled once stays ready while a second one joins
/// (a rebalance is routine, not a reason to pull a pod from service); the
/// joining one says it waits for the group until it owns partitions; both
/// then answer with their share; when the second leaves, the first is
/// ready with every partition again. Every record lands once meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_answers_through_a_rebalance() {
    use sluice_tests::sinks::SinkDb;
    let name = "ready_rebalance";
    let brokers = shared_broker();
    create_topic(brokers, name, 4);
    let db = SinkDb::fresh_postgres(name).await;
    let producing = sluice_tests::control::Producer::start(brokers, name, 4);
    let dirs = [TempDir::new(name), TempDir::new(&format!("{name}-b"))];
    let ports = [control_port().0, control_port().0];
    let configs: Vec<std::path::PathBuf> = (0..2)
        .map(|i| {
            db.configure(
                PipelineToml::identity(name, brokers, name, 100)
                    .short_session()
                    .control(ports[i], 1 << 20),
            )
            .write(dirs[i].path())
        })
        .collect();
    let ready = |i: usize| raw_request(ports[i], "GET /readyz HTTP/1.1", b"");
    let share = |i: usize| {
        let answer = ready(i);
        (answer.status == 200).then(|| answer.json()["partitions"].as_u64().unwrap())
    };
    let wait_until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    let first = Host::start(&configs[0], &dirs[0].path().join("host.log"));
    first.wait_for_api(ports[0]);
    wait_until("the first instance never ready with 4 partitions", &|| {
        share(0) == Some(4)
    });

    let mut second = Host::start(&configs[1], &dirs[1].path().join("host.log"));
    second.wait_for_api(ports[1]);
    // Until the split: the first always ready, the second saying why not.
    let (mut second_said, deadline) = (Vec::new(), Instant::now() + Duration::from_secs(90));
    loop {
        let (a, b) = (ready(0), ready(1));
        assert_eq!(
            a.status, 200,
            "the first instance unready in a rebalance: {a:?}"
        );
        match b.status {
            200 => {
                let owned = |x: &sluice_tests::control::RawAnswer| x.json()["partitions"].as_u64();
                let (a, b) = (owned(&a).unwrap(), owned(&b).unwrap());
                if a > 0 && b > 0 && a + b == 4 {
                    break;
                }
            }
            _ => second_said.push(b.json()["reasons"].to_string()),
        }
        assert!(
            Instant::now() < deadline,
            "the group never split the partitions"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        second_said
            .iter()
            .any(|r| r.contains("the consumer group has not assigned partitions yet")),
        "the joining instance never said it waits for the group: {second_said:?}"
    );
    second.terminate_within(Duration::from_secs(30), "the second instance");
    wait_until(
        "the first instance never took every partition back",
        &|| share(0) == Some(4),
    );
    let produced = producing.stop();
    sluice_tests::control::wait_for_rows(&db, produced, Duration::from_secs(120)).await;
    first.stop();
    let checked = db.assert_exactly_once(brokers, name, 4, name).await;
    assert_eq!(checked, produced);
}

/// Secrets kept out of the config file: the Postgres password comes from
/// the environment (`${NAME}`) and the control token from a file
/// (`${file:PATH}`, as a mounted Kubernetes Secret). The pipeline runs with
/// them, and neither appears in anything sluice says: its logs at debug,
/// the run summary, the status API and page, the metrics, `verify`, and the
/// lineage and module tables. `check` names a variable that is not set,
/// never a value.
#[tokio::test(flavor = "multi_thread")]
async fn secrets_from_the_environment_and_files_never_appear_in_any_output() {
    use sluice_tests::sinks::SinkDb;
    let name = "secrets_leak";
    let (password, token) = ("pw-7f3a9c0d-not-for-logs", "tok-5e1b22aa-not-for-logs");
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    produce(brokers, name, &sluice_tests::numbered(name, 500, 2));
    let db = SinkDb::fresh_postgres(name).await;
    let dir = TempDir::new(name);
    std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
    let (port, _) = control_port();
    let url = "postgres://postgres:${SLUICE_TEST_PG_PASSWORD}@127.0.0.1:5432/test";
    let config = PipelineToml::identity(name, brokers, name, 100)
        .sink_url(url)
        .sink("schema", name)
        .control(port, 4 * 1024 * 1024)
        .field("control", "token", "${file:token}")
        .write(dir.path());
    let sluice = |args: &[&str]| {
        let mut command = Command::new(sluice_bin());
        command
            .args(args)
            .env("SLUICE_LOG", "debug")
            .env("SLUICE_TEST_PG_PASSWORD", password)
            .env_remove("SLUICE_CONTROL_TOKEN");
        command
    };
    let config_arg = config.to_str().unwrap();
    let mut said = String::new();
    let (out_log, err_log) = (dir.path().join("run.out"), dir.path().join("run.err"));
    let host = sluice(&["run", config_arg])
        .stdout(std::fs::File::create(&out_log).unwrap())
        .stderr(std::fs::File::create(&err_log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "no control API: {}",
            std::fs::read_to_string(&err_log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let caught_up = scrape_when_caught_up(port, 500);
    said.push_str(&caught_up);
    for path in ["/v1/status", "/", "/v1/versions", "/metrics"] {
        let answer = raw_request(port, &format!("GET {path} HTTP/1.1"), b"");
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        said.push_str(&answer.body);
    }
    // The token from the file is the one writes need.
    let refused = raw_request(port, "POST /v1/rollback HTTP/1.1\r\nContent-Length: 0", b"");
    assert_eq!(refused.status, 401, "{refused:?}");
    unsafe { libc::kill(host.id() as i32, libc::SIGTERM) };
    let run = host.wait_with_output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        std::fs::read_to_string(&err_log).unwrap()
    );
    for log in [&out_log, &err_log] {
        said.push_str(&std::fs::read_to_string(log).unwrap());
    }
    assert!(said.contains("DEBUG"), "the run logged at debug");
    for out in [
        sluice(&["verify", config_arg]).output().unwrap(),
        sluice(&["check", config_arg]).output().unwrap(),
    ] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        said.push_str(&String::from_utf8_lossy(&out.stdout));
        said.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    assert!(said.contains("verified "), "verify ran");
    let pool = db.pool().await;
    for table in ["sluice_batches", "sluice_versions", "sluice_checkpoints"] {
        let rows: Vec<(String,)> =
            sqlx::query_as(&format!("SELECT t::text FROM {} t", db.table(table)))
                .fetch_all(&pool)
                .await
                .unwrap_or_else(|e| panic!("{table}: {e}"));
        assert!(!rows.is_empty(), "{table} has rows");
        said.extend(rows.into_iter().map(|(r,)| r));
    }
    for secret in [password, token] {
        assert!(!said.contains(secret), "a secret leaked:\n{said}");
    }
    // Unset: `check` names the variable and the field, and says no value.
    let out = Command::new(sluice_bin())
        .args(["check", config_arg])
        .env_remove("SLUICE_TEST_PG_PASSWORD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("`sink.url`")
            && stderr.contains("environment variable `SLUICE_TEST_PG_PASSWORD` is not set"),
        "{stderr}"
    );
}

/// `GET /healthz` and `GET /readyz` (no token) through a sink outage: ready
/// once the module is loaded, partitions assigned and the sink answers;
/// while Redis is down the loop retries, so the host stays alive but not
/// ready, saying why; ready again once Redis is back and the input done.
#[test]
fn health_probes_answer_through_a_sink_outage() {
    use sluice_tests::redis_server::{RedisServer, identity_redis_config};
    let name = "health_probes";
    let brokers = shared_broker();
    create_topic(brokers, name, 2);
    produce(brokers, name, &sluice_tests::numbered(name, 200, 2));
    let mut redis = RedisServer::start(name);
    let dir = TempDir::new(name);
    let (port, _) = control_port();
    let config = identity_redis_config(name, brokers, name, &redis.url(), 100)
        .batch_interval_ms(50)
        .control(port, 1 << 20)
        .write(dir.path());
    let host = Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    let get = |path: &str| raw_request(port, &format!("GET {path} HTTP/1.1"), b"");
    let wait_for = |path: &str, status: u16, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let answer = get(path);
            if answer.status == status {
                return answer.json();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {answer:?}\n{}",
                host.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let ready = wait_for("/readyz", 200, "never ready");
    assert_eq!(ready["status"], "ready");
    assert_eq!(get("/healthz").json()["status"], "alive");
    host.wait_for_metric("sluice_records_in_total", 200.0, Duration::from_secs(60));
    redis.kill();
    produce(brokers, name, &sluice_tests::numbered("after", 100, 2));
    let down = wait_for("/readyz", 503, "ready while the sink is down");
    let reasons = down["reasons"].to_string();
    assert!(reasons.contains("the sink's last try failed"), "{down}");
    let alive = get("/healthz");
    assert_eq!(
        (alive.status, &alive.json()["status"]),
        (200, &Json::from("alive"))
    );
    redis.restart();
    wait_for("/readyz", 200, "not ready after the sink came back");
    host.wait_for_metric("sluice_records_in_total", 300.0, Duration::from_secs(60));
    host.stop();
}

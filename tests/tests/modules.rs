//! Module lifecycle through the public interface: `sluice run` with its
//! control API, and the CLI (`deploy`, `activate`, `rollback`, `versions`,
//! `status`). Hot swaps under a continuous producer, two instances
//! following one activation, and the refusals (no token, wrong token, bad
//! modules) that must store nothing.
//!
//! Each test has its own topic, pipeline, database schema and control port.

use sluice::batch::sha256_hex;
use sluice::control::api::Versions;
use sluice::control::{ClientError, ControlClient};
use sluice_tests::control::{
    Host, Producer, TOKEN, assert_rows_follow_lineage, cli, cli_ok, control_port, deploy_hostile,
    lineage, wait_for_rows,
};
use sluice_tests::sinks::SinkDb;
use sluice_tests::{
    PipelineToml, Target, TempDir, create_topic, plugin, read_committed, shared_broker,
};
use std::time::Duration;

const PARTITIONS: i32 = 4;

fn digest_of(name: &str) -> String {
    sha256_hex(&std::fs::read(plugin(name)).expect("plugin built"))
}

/// The value the identity (as is) or stamp (`tag` + value) version writes.
fn versioned_value(tag: &str) -> impl Fn(&str, &str) -> String {
    let (identity, stamp) = (digest_of("identity"), digest_of("stamp"));
    let tag = tag.to_string();
    move |module: &str, value: &str| {
        if module == identity {
            value.to_string()
        } else if module == stamp {
            format!("{tag}{value}")
        } else {
            panic!("batch ran unknown module {module}")
        }
    }
}

/// An identity pipeline into `db` serving its control API on `port`.
fn pipeline_config(name: &str, topic: &str, db: &SinkDb, port: u16) -> PipelineToml {
    db.configure(PipelineToml::identity(name, shared_broker(), topic, 500))
        .control(port, 4 * 1024 * 1024)
}

/// One instance of the identity pipeline into `db`, its config in `dir`
/// under `name`, its control API up; returns the host, config and API URL.
fn start_instance(
    pipeline: &str,
    topic: &str,
    db: &SinkDb,
    dir: &TempDir,
    name: &str,
) -> (Host, std::path::PathBuf, String) {
    let (port, url) = control_port();
    let config = dir.path().join(format!("{name}.toml"));
    std::fs::write(
        &config,
        pipeline_config(pipeline, topic, db, port).to_string(),
    )
    .unwrap();
    let host = Host::start(&config, &dir.path().join(format!("{name}.log")));
    host.wait_for_api(port);
    (host, config, url)
}

/// `sluice deploy stamp.wasm --params {"tag":"v2:"} --activate`; its output.
fn deploy_stamp_v2(url: &str) -> String {
    let stamp = plugin("stamp");
    let stamp = stamp.to_str().unwrap();
    cli_ok(
        url,
        &[
            "deploy",
            stamp,
            "--params",
            r#"{"tag":"v2:"}"#,
            "--activate",
        ],
    )
}

/// Batches committed after `at_ms` that still ran `old_module`.
fn late_batches(
    batches: &[sluice_tests::control::LineageBatch],
    at_ms: i64,
    old_module: &str,
) -> usize {
    batches
        .iter()
        .filter(|b| b.committed_at_ms > at_ms && b.module_digest == old_module)
        .count()
}

fn activated_at(versions: &Versions, version: i64) -> i64 {
    versions
        .history
        .iter()
        .find(|v| v.version == version)
        .map(|v| v.activated_at_ms)
        .expect("activation time")
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_swap_under_load_then_rollback_on_postgres() {
    let db = SinkDb::fresh_postgres("sluice_it_hot_swap").await;
    hot_swap_under_load_then_rollback(db, "modules-hot-swap-pg").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_swap_under_load_then_rollback_on_mariadb() {
    let db = SinkDb::fresh_mysql("sluice_it_hot_swap").await;
    hot_swap_under_load_then_rollback(db, "modules-hot-swap-my").await;
}

/// Waits until `pipeline` committed a batch with module `digest`.
async fn wait_for_batches_of(db: &SinkDb, pipeline: &str, digest: &str) {
    let started = std::time::Instant::now();
    while !lineage(db, pipeline)
        .await
        .iter()
        .any(|b| b.module_digest == digest)
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no batch of module {digest} committed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// v1 -> v2 -> rollback through the CLI under a continuous producer: nothing
/// lost or duplicated, every row made by the version its batch names; then
/// `verify` (all match, then a tampered digest is named) and `shadow`.
async fn hot_swap_under_load_then_rollback(db: SinkDb, topic: &str) {
    let pipeline = "hot-swap";
    create_topic(shared_broker(), topic, PARTITIONS);
    let dir = TempDir::new(topic);
    let (host, config, url) = start_instance(pipeline, topic, &db, &dir, "sluice");
    let producer = Producer::start(shared_broker(), topic, PARTITIONS);
    tokio::time::sleep(Duration::from_secs(3)).await;

    let deployed = deploy_stamp_v2(&url);
    assert!(deployed.contains("activated version 2"), "{deployed}");
    host.wait_for_metric("sluice_module_swaps_total", 1.0, Duration::from_secs(10));
    // v2 must commit batches before the rollback, however loaded the
    // machine is (a fixed sleep was once too short on a busy CI run).
    wait_for_batches_of(&db, pipeline, &digest_of("stamp")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rolled = cli_ok(&url, &["rollback"]);
    assert!(rolled.contains("activated version 3"), "{rolled}");
    host.wait_for_metric("sluice_module_swaps_total", 2.0, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let produced = producer.stop();

    let expected = read_committed(shared_broker(), topic, PARTITIONS);
    assert_eq!(expected.len(), produced);
    wait_for_rows(&db, expected.len(), Duration::from_secs(60)).await;
    let status = cli_ok(&url, &["status"]);
    assert!(status.contains(&digest_of("identity")), "{status}");
    let versions = ControlClient::new(&url, None).versions().await.unwrap();
    host.stop();

    let rows = db.identity_rows().await;
    let batches = lineage(&db, pipeline).await;
    assert_rows_follow_lineage(&rows, &expected, &batches, versioned_value("v2:"));
    db.assert_contiguous_lineage(pipeline).await;
    let (identity, stamp) = (digest_of("identity"), digest_of("stamp"));
    let ran = |m: &str| batches.iter().filter(|b| b.module_digest == m).count();
    assert!(ran(&stamp) > 0 && ran(&identity) > 0, "both versions ran");
    // Every batch committed after an activation became visible runs the new
    // version, but for the one committing at that moment (and the check,
    // made every half batch interval).
    let (v2_at, v3_at) = (activated_at(&versions, 2), activated_at(&versions, 3));
    let after_v2: Vec<_> = batches
        .iter()
        .filter(|b| b.committed_at_ms < v3_at)
        .cloned()
        .collect();
    assert!(
        late_batches(&after_v2, v2_at + 200, &identity) <= 1,
        "v2 reached the pipeline late"
    );
    assert!(
        late_batches(&batches, v3_at + 200, &stamp) <= 1,
        "rollback reached the pipeline late"
    );
    let actions: Vec<&str> = versions.history.iter().map(|v| v.action.as_str()).collect();
    assert_eq!(actions, ["seed", "activate", "rollback"]);

    // verify: every batch, across the swaps, reproduces its recorded output.
    let config_arg = config.to_str().unwrap();
    let verified = cli_ok(&url, &["verify", config_arg]);
    assert!(
        verified.contains(&format!(
            "verified {n} batches: {n} match, 0 differ",
            n = batches.len()
        )),
        "{verified}"
    );
    // shadow: a candidate's difference is shown, nothing is written.
    let shadowed = cli_ok(
        &url,
        &[
            "shadow",
            config_arg,
            plugin("stamp").to_str().unwrap(),
            "--params",
            r#"{"tag":"x:"}"#,
            "--last",
            "3",
        ],
    );
    assert!(shadowed.contains("records: "), "{shadowed}");
    assert!(shadowed.contains("x:value"), "{shadowed}");
    assert_eq!(
        lineage(&db, pipeline).await.len(),
        batches.len(),
        "shadow wrote lineage"
    );
    // A recorded digest altered by hand: verify fails and names the batch.
    let tampered = &batches[batches.len() / 2].batch_id;
    let pool = db.pool().await;
    sqlx::query(&format!(
        "UPDATE {} SET output_digest = 'altered' WHERE batch_id = '{tampered}'",
        db.table("sluice_batches")
    ))
    .execute(&pool)
    .await
    .unwrap();
    let out = cli(&url, None, &["verify", config_arg]);
    assert!(!out.status.success(), "verify passed a tampered digest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("MISMATCH batch {tampered}")),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(tampered.as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn two_instances_both_follow_one_activation() {
    let topic = "modules-two-instances";
    let pipeline = "two-hosts";
    create_topic(shared_broker(), topic, PARTITIONS);
    let db = SinkDb::fresh_postgres("sluice_it_two_hosts").await;
    let dir = TempDir::new("two-hosts");
    let (a, _, url) = start_instance(pipeline, topic, &db, &dir, "a");
    let (b, _, _) = start_instance(pipeline, topic, &db, &dir, "b");
    let producer = Producer::start(shared_broker(), topic, PARTITIONS);
    tokio::time::sleep(Duration::from_secs(8)).await;

    deploy_stamp_v2(&url);
    a.wait_for_metric("sluice_module_swaps_total", 1.0, Duration::from_secs(10));
    b.wait_for_metric("sluice_module_swaps_total", 1.0, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let produced = producer.stop();

    let expected = read_committed(shared_broker(), topic, PARTITIONS);
    assert_eq!(expected.len(), produced);
    wait_for_rows(&db, expected.len(), Duration::from_secs(60)).await;
    a.stop();
    b.stop();
    let rows = db.identity_rows().await;
    let batches = lineage(&db, pipeline).await;
    assert_rows_follow_lineage(&rows, &expected, &batches, versioned_value("v2:"));
    db.assert_contiguous_lineage(pipeline).await;
    let last = batches.last().expect("batches");
    assert_eq!(last.module_digest, digest_of("stamp"));
}

/// A refused call's HTTP status.
fn refused_status<T: std::fmt::Debug>(result: Result<T, ClientError>) -> (u16, String) {
    match result {
        Err(ClientError::Refused { status, message }) => (status.as_u16(), message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_need_the_token_and_bad_modules_store_nothing() {
    let topic = "modules-refusals";
    let pipeline = "refusals";
    create_topic(shared_broker(), topic, 1);
    let dir = TempDir::new("refusals");
    let db = SinkDb::Sqlite(dir.path().join("out.db"));
    let (host, _, url) = start_instance(pipeline, topic, &db, &dir, "sluice");
    let stamp = std::fs::read(plugin("stamp")).unwrap();
    let stamp_digest = digest_of("stamp");

    // No token, wrong token: 401 on every write, from the API and the CLI.
    for client in [
        ControlClient::new(&url, None),
        ControlClient::new(&url, Some("wrong".into())),
    ] {
        let (status, message) = refused_status(client.deploy(stamp.clone(), "{}", true).await);
        assert_eq!(status, 401, "{message}");
        assert!(message.contains("bearer token"), "{message}");
        assert_eq!(
            refused_status(client.activate(&digest_of("identity"), "{}").await).0,
            401
        );
        assert_eq!(refused_status(client.rollback().await).0, 401);
    }
    let out = cli(
        &url,
        None,
        &["deploy", plugin("stamp").to_str().unwrap(), "--activate"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));

    // Bad modules and params, with the right token: clear 4xx.
    let client = ControlClient::new(&url, Some(TOKEN.into()));
    let cases: Vec<(&str, Vec<u8>, &str, u16, &str)> = vec![
        (
            "garbage",
            b"definitely not wasm".to_vec(),
            "{}",
            422,
            "not a WebAssembly component",
        ),
        (
            "other world",
            std::fs::read(plugin("other-world")).unwrap(),
            "{}",
            422,
            "does not implement",
        ),
        (
            "forbidden import",
            std::fs::read(plugin("forbidden-import")).unwrap(),
            "{}",
            422,
            "imports `",
        ),
        (
            "oversized",
            vec![0u8; 5 * 1024 * 1024],
            "{}",
            413,
            "over the limit",
        ),
        (
            "params refused by init",
            stamp.clone(),
            r#"{"bogus":1}"#,
            422,
            "refused the params",
        ),
        ("params not JSON", stamp.clone(), "{", 422, "not valid JSON"),
    ];
    for (case, bytes, params, want, says) in cases {
        let (status, message) = refused_status(client.deploy(bytes, params, true).await);
        assert_eq!(status, want, "{case}: {message}");
        assert!(message.contains(says), "{case}: {message}");
    }
    let (status, message) = refused_status(client.activate(&"0".repeat(64), "{}").await);
    assert_eq!(status, 404, "{message}");
    let (status, message) = refused_status(client.rollback().await);
    assert_eq!(status, 409, "{message}");

    // Nothing was stored or activated by any of it.
    let versions = client.versions().await.unwrap();
    assert_eq!(versions.history.len(), 1, "{versions:?}");
    let stored = db.scalar("SELECT COUNT(*) FROM sluice_modules").await;
    assert_eq!(stored, Some(1));

    // The right token and a good module: stored, not active until asked.
    let deployed = client.deploy(stamp.clone(), "{}", false).await.unwrap();
    assert_eq!(deployed.module_digest, stamp_digest);
    assert!(deployed.activated.is_none());
    let listed = cli_ok(&url, &["versions"]);
    assert!(listed.contains("(active)"), "{listed}");

    // Params are versioned like modules: two params of one module are two
    // versions, and rollback goes back to the previous params.
    let a = cli_ok(
        &url,
        &["activate", &stamp_digest, "--params", r#"{"tag":"a:"}"#],
    );
    assert!(a.contains("activated version 2"), "{a}");
    let b = cli_ok(
        &url,
        &["activate", &stamp_digest, "--params", r#"{"tag":"b:"}"#],
    );
    assert!(b.contains("activated version 3"), "{b}");
    let back = cli_ok(&url, &["rollback"]);
    assert!(
        back.contains("version 4") && back.contains(r#"{"tag":"a:"}"#),
        "{back}"
    );
    let listed = cli_ok(&url, &["versions"]);
    assert_eq!(
        listed.lines().count(),
        3,
        "identity, stamp a:, stamp b:\n{listed}"
    );
    let openapi = http_get(&url, "/v1/openapi.json");
    for path in [
        "/v1/modules",
        "/v1/activate",
        "/v1/rollback",
        "/v1/versions",
        "/v1/status",
    ] {
        assert!(
            openapi.contains(&format!("\"{path}\"")),
            "{path} missing from the OpenAPI"
        );
    }
    host.stop();
}

/// A plain HTTP/1.0 GET of `base` + `path` (the whole answer), without an
/// HTTP client crate.
fn http_get(base: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let address = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(address).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out
}

/// Two hosts of one pipeline with different limits. A version host A
/// accepts (its `init` needs 100 MiB) cannot run on host B (64 MiB cap): B
/// keeps the version it runs and says so on its status; restarted, B serves
/// its control API and waits instead of dying; `rollback` through B's API
/// works, and B runs again.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_one_host_cannot_run_leaves_both_running_and_rollback_works() {
    let topic = "modules-limits";
    let pipeline = "limits";
    create_topic(shared_broker(), topic, PARTITIONS);
    let db = SinkDb::fresh_postgres("sluice_modules_limits").await;
    let dir = TempDir::new("limits");
    let echo_target = Target::new("echo")
        .column("offset", "integer")
        .column("value", "text");
    let config = |port: u16| {
        db.configure(PipelineToml::identity(
            pipeline,
            shared_broker(),
            topic,
            500,
        ))
        .target(echo_target.clone())
        .control(port, 4 << 20)
    };
    let write = |name: &str, config: PipelineToml| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, config.to_string()).unwrap();
        path
    };
    let (port_a, url_a) = control_port();
    let (port_b, url_b) = control_port();
    let config_a = write("a", config(port_a));
    let config_b = write("b", config(port_b).field("limits", "max_memory_mib", 64));
    let producer = Producer::start(shared_broker(), topic, PARTITIONS);
    let a = Host::start(&config_a, &dir.path().join("a.log"));
    let b = Host::start(&config_b, &dir.path().join("b.log"));
    a.wait_for_api(port_a);
    b.wait_for_api(port_b);
    a.wait_for_metric("sluice_batches_total", 1.0, Duration::from_secs(90));

    deploy_hostile(&url_a, "hungry");
    a.wait_for_metric("sluice_module_swaps_total", 1.0, Duration::from_secs(30));
    b.wait_for_log("cannot run on this host", 1, Duration::from_secs(30));
    let status_b = ControlClient::new(&url_b, None).status().await.unwrap();
    let problem = status_b["running"]["version_problem"]
        .as_str()
        .unwrap_or_default();
    assert!(problem.contains("memory limit of 64 MiB"), "{status_b}");
    assert_eq!(
        status_b["running"]["module_digest"].as_str(),
        Some(digest_of("identity").as_str())
    );

    // Restarted, B cannot start the active version: it serves its API and
    // waits, and the rollback goes through it.
    b.stop();
    let b = Host::start(&config_b, &dir.path().join("b2.log"));
    b.wait_for_api(port_b);
    b.wait_for_log("waiting for another version", 1, Duration::from_secs(60));
    let waiting = ControlClient::new(&url_b, None).status().await.unwrap();
    assert!(
        waiting["running"]["version_problem"].is_string(),
        "{waiting}"
    );
    cli_ok(&url_b, &["rollback"]);
    b.wait_for_log("running module version", 1, Duration::from_secs(30));
    b.wait_for_metric("sluice_batches_total", 1.0, Duration::from_secs(90));
    a.wait_for_metric("sluice_module_swaps_total", 2.0, Duration::from_secs(30));
    let healthy = ControlClient::new(&url_b, None).status().await.unwrap();
    assert!(healthy["running"]["version_problem"].is_null(), "{healthy}");
    producer.stop();
    a.stop();
    b.stop();
}

/// `[state]` moves the module store out of the sink's database: the seed
/// and a deploy land in the state database (Postgres here, under its own
/// prefix), rows and lineage in the sink's (SQLite), which holds no module
/// tables; `verify` finds the versions in the state store.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_store_apart_holds_the_modules_and_the_sink_the_rows_and_lineage() {
    let (pipeline, topic, prefix) = ("state-apart", "modules-state-apart", "it_state_apart_");
    let state = SinkDb::Postgres {
        url: sluice_tests::sinks::postgres_url(),
        schema: "public".into(),
    };
    let pool = state.pool().await;
    for table in ["versions", "modules"] {
        let drop = format!("DROP TABLE IF EXISTS public.{prefix}{table}");
        sqlx::raw_sql(&drop).execute(&pool).await.unwrap();
    }
    create_topic(shared_broker(), topic, 2);
    let dir = TempDir::new(topic);
    let sink = SinkDb::Sqlite(dir.path().join("sink.db"));
    let (port, url) = control_port();
    let config = dir.path().join("sluice.toml");
    let text = pipeline_config(pipeline, topic, &sink, port)
        .field("state", "url", state.url())
        .field("state", "table_prefix", prefix);
    std::fs::write(&config, text.to_string()).unwrap();
    let host = Host::start(&config, &dir.path().join("sluice.log"));
    host.wait_for_api(port);
    let producer = Producer::start(shared_broker(), topic, 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deployed = deploy_stamp_v2(&url);
    assert!(deployed.contains("activated version 2"), "{deployed}");
    host.wait_for_metric("sluice_module_swaps_total", 1.0, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let produced = producer.stop();
    wait_for_rows(&sink, produced, Duration::from_secs(60)).await;
    host.stop();

    let count = |table: &str| {
        format!(
            "SELECT COUNT(*) FROM {}",
            state.table(&format!("{prefix}{table}"))
        )
    };
    let pipeline_versions = format!("{} WHERE pipeline = '{pipeline}'", count("versions"));
    assert_eq!(
        state.scalar(&pipeline_versions).await,
        Some(2),
        "seed and deploy"
    );
    assert_eq!(state.scalar(&count("modules")).await, Some(2));
    assert_eq!(
        sink.scalar("SELECT COUNT(*) FROM sluice_versions").await,
        None
    );
    assert_eq!(
        sink.scalar("SELECT COUNT(*) FROM sluice_modules").await,
        None
    );
    let batches = lineage(&sink, pipeline).await;
    assert!(
        batches
            .iter()
            .any(|b| b.module_digest == digest_of("stamp"))
    );
    let expected = read_committed(shared_broker(), topic, 2);
    assert_rows_follow_lineage(
        &sink.identity_rows().await,
        &expected,
        &batches,
        versioned_value("v2:"),
    );
    let verified = sluice_tests::control::sluice_ok(&["verify", config.to_str().unwrap()]);
    assert!(
        verified.contains(&format!(
            "verified {n} batches: {n} match, 0 differ",
            n = batches.len()
        )),
        "{verified}"
    );
}

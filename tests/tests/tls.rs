//! TLS to every server a pipeline talks to, each a server of the test's
//! own that speaks only TLS with a certificate the test generates (never
//! the machine's shared servers): Postgres
//! (`sslmode=verify-full&sslrootcert=`), MySQL
//! (`ssl-mode=VERIFY_IDENTITY&ssl-ca=`), Redis (`rediss://`, trusting the
//! system roots or `SSL_CERT_FILE`) and Kafka (`security.protocol = "ssl"`
//! in the source's and the sink's properties, the broker behind a TLS
//! proxy). For each: trusting another authority, `sluice run` refuses the
//! server, says why and writes nothing; trusting the right one, the
//! pipeline lands exactly what a recomputation of its input says.

use sluice_tests::redis_server::RedisServer;
use sluice_tests::sinks::SinkDb;
use sluice_tests::tally::{self, Expected};
use sluice_tests::tls::{Authority, TlsBroker, TlsMariadb, TlsPostgres};
use sluice_tests::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PARTITIONS: i32 = 2;

/// Topic `name` with keyed input, and what the tally pipeline must leave.
fn keyed_input(name: &str) -> Expected {
    let brokers = shared_broker();
    create_topic(brokers, name, PARTITIONS);
    produce(
        brokers,
        name,
        &tally::keyed(numbered(name, 3000, PARTITIONS)),
    );
    Expected::of(&read_committed(brokers, name, PARTITIONS), &[])
}

/// Runs `config` expecting a refusal of the server's certificate.
fn assert_refused(config: &Path, what: &str) {
    assert_refused_run(&run_until_caught_up(config, Duration::from_secs(120)), what);
}

/// `out` is a run that refused the server's certificate: it failed, and
/// said so in words an operator can act on.
fn assert_refused_run(out: &std::process::Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: ran trusting another CA");
    assert!(
        stderr.to_lowercase().contains("certificate"),
        "{what}: the error does not name the certificate: {stderr}"
    );
    println!(
        "{what}: refused: {}",
        stderr.trim_end().lines().last().unwrap_or("")
    );
}

/// The tally pipeline of `name` into `db`, its config written under `dir`.
fn tally_into(db: &SinkDb, name: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    db.configure(tally::config(name, shared_broker(), 200))
        .write(dir)
}

/// A refusal trusting the rogue authority, then an exact run trusting the
/// right one, into the SQL server `db_for(ca)` reaches.
async fn refused_then_exact(name: &str, tls: &Authority, db_for: impl Fn(&Path) -> SinkDb) {
    let expected = keyed_input(name);
    let dir = TempDir::new(name);
    let rogue = tally_into(&db_for(&tls.rogue_ca), name, &dir.path().join("rogue"));
    assert_refused(&rogue, name);
    let db = db_for(&tls.ca);
    assert_eq!(
        db.committed_batches().await,
        0,
        "{name}: nothing committed while refused"
    );
    run_ok(&tally_into(&db, name, &dir.path().join("trusted")));
    tally::assert_stored(&db, name, &expected).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_over_tls_verifies_the_server() {
    let name = "tls_pg";
    let tls = Authority::generate(name);
    let server = TlsPostgres::start(name, &tls);
    refused_then_exact(name, &tls, |ca| SinkDb::Postgres {
        url: server.url(ca),
        schema: name.into(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_over_tls_verifies_the_server() {
    let name = "tls_my";
    let tls = Authority::generate(name);
    let server = TlsMariadb::start(name, &tls);
    refused_then_exact(name, &tls, |ca| SinkDb::Mysql {
        url: server.url(ca),
        schema: name.into(),
    })
    .await;
}

/// `rediss://` trusts the system's roots; `SSL_CERT_FILE` names others
/// (what a container sets for a private CA).
#[tokio::test(flavor = "multi_thread")]
async fn redis_over_tls_verifies_the_server() {
    let name = "tls_redis";
    let expected = keyed_input(name);
    let tls = Authority::generate(name);
    let server = RedisServer::start_tls(name, &tls);
    let dir = TempDir::new(name);
    let config = tally::redis_config(tally::config(name, shared_broker(), 200), &server.url())
        .write(dir.path());
    let run = |ca: &Path| {
        let log = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        std::process::Command::new(sluice_bin())
            .args(["run", "--until-caught-up"])
            .arg(&config)
            .env("SLUICE_LOG", log)
            .env("SSL_CERT_FILE", ca)
            .output()
            .expect("run sluice")
    };
    assert_refused_run(&run(&tls.rogue_ca), name);
    assert_eq!(server.committed_batches(name), 0, "nothing committed");
    let trusted = run(&tls.ca);
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    tally::assert_same(
        name,
        &tally::stored_redis(&server, name, PARTITIONS),
        &expected,
    );
}

/// Kafka over TLS, both ways: trusting another authority, the run stops
/// (after the sink's 30 s metadata timeout; librdkafka logs the failed
/// verification) and writes nothing; trusting the right one, the source
/// reads its input and the exactly-once Kafka sink writes rows, lineage
/// and offsets through TLS (`source.properties` and `sink.properties`),
/// every record once.
#[test]
fn kafka_over_tls_reads_and_writes_exactly_once() {
    let name = "tls_kafka";
    let tls = Authority::generate(name);
    let broker = TlsBroker::start(&tls);
    let brokers = broker.brokers.as_str();
    let ca = tls.ca.to_str().unwrap();
    let props = [("security.protocol", "ssl"), ("ssl.ca.location", ca)];
    let out = format!("{name}-out");
    for topic in [
        name.to_string(),
        out.clone(),
        format!("{name}.dead-letters"),
        format!("{name}.lineage"),
    ] {
        create_topic_with(brokers, &topic, PARTITIONS, &props);
    }
    let mut producer = producer_config(brokers, 5);
    for (key, value) in props {
        producer.set(key, value);
    }
    let producer: rdkafka::producer::ThreadedProducer<_> =
        producer.create().expect("a TLS producer");
    for record in numbered(name, 2000, PARTITIONS) {
        send(&producer, name, &record);
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(60)).expect("flush");
    let input = read_committed_with(brokers, name, PARTITIONS, &props);
    assert_eq!(input.len(), 2000);
    let dir = TempDir::new(name);
    let rogue_ca = tls.rogue_ca.to_str().unwrap();
    let mut rogue = kafka_identity_config(name, brokers, name, &out);
    for (key, value) in [("security.protocol", "ssl"), ("ssl.ca.location", rogue_ca)] {
        rogue = rogue.source_property(key, value).sink_property(key, value);
    }
    std::fs::create_dir_all(dir.path().join("rogue")).unwrap();
    let refused = run_until_caught_up(
        &rogue.write(&dir.path().join("rogue")),
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "ran trusting another CA");
    // The error itself says why (librdkafka's reason, kept by the sink's
    // client), not only a log line that races the exit.
    let error = stderr.lines().find(|l| l.starts_with("error:"));
    assert!(
        error.is_some_and(|e| e.contains("certificate verify failed")),
        "the error does not say why: {stderr}"
    );
    assert!(
        sluice_tests::markers::read_committed_by_markers(&broker.plain, &out, PARTITIONS)
            .is_empty(),
        "nothing written while refused"
    );
    let mut config = kafka_identity_config(name, brokers, name, &out);
    for (key, value) in props {
        config = config.source_property(key, value).sink_property(key, value);
    }
    run_ok(&config.write(dir.path()));
    let output = sluice_tests::markers::read_committed_by_markers(&broker.plain, &out, PARTITIONS);
    sluice_tests::kafka_out::assert_output_exactly_once(&input, &output);
}

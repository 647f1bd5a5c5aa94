//! What watching a pipeline costs: the same Kafka -> Wasm (identity) ->
//! SQLite pipeline, exactly-once, with its control listener on, run over
//! the same topic with nobody looking and with a watcher that every second
//! scrapes `/metrics` and loads the status page (`/`, its script,
//! `/v1/status` and `/v1/versions`: twice what an open page asks for).
//! Rounds are interleaved in one run; the rate is the steady state from
//! lineage (first to last commit) and the whole process. Rounds on two
//! cores differ by more than the cost looked for, so the cost is also
//! measured directly: the host's CPU time (`/proc/PID/stat`) for 500
//! watcher rounds against a running host, as a share of one core at one
//! round a second.
//!
//! Run: `scripts/build-plugins.sh && cargo build --release -p sluice --bin sluice \
//!       -p sluice-tests --bin bench-observability && target/release/bench-observability [RECORDS] [ROUNDS]`

use sluice_tests::control::{Host, control_port};
use sluice_tests::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

/// Requests the watcher makes once a second.
const WATCHED: [&str; 5] = ["/metrics", "/", "/ui/page.js", "/v1/status", "/v1/versions"];

struct Measured {
    whole: f64,
    steady: f64,
    requests: usize,
}

/// Requests [`WATCHED`] from the API on `port` every second until `stop`;
/// counts the answers.
fn watch(port: u16, stop: Arc<AtomicBool>, answered: Arc<AtomicUsize>) {
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        for path in WATCHED {
            if get(port, path).is_some() {
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }
        let left = Duration::from_secs(1).saturating_sub(started.elapsed());
        std::thread::sleep(left.max(Duration::from_millis(50)));
    }
}

/// GET `path`: the whole answer if the host answered 200; `None` if it is
/// not up (yet, or any more) or answered otherwise. Tolerant where
/// `raw_request` asserts: the watcher races the host's start and exit.
fn get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.starts_with("HTTP/1.1 200").then_some(answer)
}

async fn run(brokers: &str, topic: &str, name: &str, records: usize, watched: bool) -> Measured {
    let dir = TempDir::new(name);
    let db = dir.path().join("sluice.db");
    let (port, _) = control_port();
    let config = identity_config(name, brokers, topic, &db, 10_000)
        .control(port, 4 << 20)
        .write(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let watcher = watched.then(|| {
        let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
        std::thread::spawn(move || watch(port, stop, answered))
    });
    let started = Instant::now();
    let out = run_until_caught_up(&config, Duration::from_secs(1800));
    let whole = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = watcher {
        w.join().expect("watcher");
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (steady, _) = bench::lineage_rate(&sinks::SinkDb::Sqlite(db)).await;
    Measured {
        whole: records as f64 / whole.as_secs_f64(),
        steady,
        requests: answered.load(Ordering::Relaxed),
    }
}

/// User + system CPU time of process `pid`, in seconds.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name (which may hold spaces), from `state`.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The host CPU one watcher round costs: a host that is caught up on the
/// topic serves 500 rounds; its CPU time before and after.
fn cpu_per_watch(brokers: &str, topic: &str, records: usize) -> f64 {
    let dir = TempDir::new("obs-cpu");
    let (port, _) = control_port();
    let config = identity_config(
        "obs-cpu",
        brokers,
        topic,
        &dir.path().join("sluice.db"),
        10_000,
    )
    .control(port, 4 << 20)
    .write(dir.path());
    let host = Host::start(&config, &dir.path().join("host.log"));
    host.wait_for_api(port);
    let deadline = Instant::now() + Duration::from_secs(600);
    let needle = format!("sluice_records_in_total{{pipeline=\"obs-cpu\"}} {records}");
    loop {
        if get(port, "/metrics").is_some_and(|m| m.contains(&needle)) {
            break;
        }
        assert!(Instant::now() < deadline, "the host did not catch up");
        std::thread::sleep(Duration::from_millis(200));
    }
    let rounds = 500;
    let before = cpu_seconds(host.pid());
    for _ in 0..rounds {
        for path in WATCHED {
            assert!(get(port, path).is_some(), "GET {path}");
        }
    }
    let used = cpu_seconds(host.pid()) - before;
    host.stop();
    used / rounds as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let records: usize = args.next().map_or(300_000, |a| a.parse().expect("RECORDS"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let broker = Broker::start();
    let topic = "bench-observability";
    create_topic(&broker.brokers, topic, PARTITIONS);
    produce(
        &broker.brokers,
        topic,
        &bench::purchase_events(records, PARTITIONS),
    );
    println!("{records} records over {PARTITIONS} partitions, {rounds} interleaved rounds");
    let (mut steady_ratios, mut whole_ratios) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always gets a warmer cache.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut results = [None, None];
        for watched in order {
            let name = format!("obs-{round}-{}", if watched { "watched" } else { "alone" });
            results[watched as usize] =
                Some(run(&broker.brokers, topic, &name, records, watched).await);
        }
        let [Some(alone), Some(watched)] = results else {
            unreachable!("both ran")
        };
        println!(
            "round {round}: alone {:>8.0} rec/s steady, {:>8.0} whole | watched {:>8.0} steady, {:>8.0} whole ({} answers) | watched/alone {:.3} steady, {:.3} whole",
            alone.steady,
            alone.whole,
            watched.steady,
            watched.whole,
            watched.requests,
            watched.steady / alone.steady,
            watched.whole / alone.whole,
        );
        assert!(watched.requests > 0, "the watcher got no answer");
        steady_ratios.push(watched.steady / alone.steady);
        whole_ratios.push(watched.whole / alone.whole);
    }
    println!(
        "median watched/alone: {:.3} steady state, {:.3} whole process",
        median(steady_ratios),
        median(whole_ratios)
    );
    let per_round = cpu_per_watch(&broker.brokers, topic, records);
    println!(
        "host CPU per watcher round ({} requests): {:.0} µs = {:.3}% of one core at one round a second",
        WATCHED.len(),
        per_round * 1e6,
        per_round * 100.0
    );
}

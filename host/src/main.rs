//! The `sluice` command line: the command list, logging set-up and the
//! process (a main thread with a transform-sized stack). Each command
//! lives in `cli/`, which owns its arguments and its output. Only here
//! and in `cli/` is anyhow used.
//!
//! SIGINT and SIGTERM drain the batch in flight, then exit (`cli::stop_on_signal`).
//! It must not hold pipeline logic.

use clap::{Parser, Subcommand};

mod cli;

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
    Run(cli::run::Run),
    /// Validate a config and its module without connecting to anything.
    Check(cli::run::Check),
    /// Upload a module to a running pipeline's control API: validated,
    /// stored by sha256 and, with --activate, made the active version.
    Deploy(cli::control::Deploy),
    /// List the pipeline's versions and activation history.
    Versions(cli::control::Versions),
    /// Activate a stored module (by digest) with params.
    Activate(cli::control::Activate),
    /// Activate the version that ran before the active one.
    Rollback(cli::control::Rollback),
    /// The active version, and what the serving host runs: counters, last
    /// batch, per-partition lag.
    Status(cli::control::Status),
    /// Print the module log lines a running host kept (its newest 10,000):
    /// batch, level, message. Needs the control token (module logs may
    /// carry record data).
    Logs(cli::control::Logs),
    /// Re-read committed batches' offset ranges, run them again with the
    /// version their lineage names, and compare output digests. Exits 1 if
    /// any batch differs (and names it). Reads Kafka and the sink; writes
    /// nothing.
    Verify(cli::replay::Verify),
    /// Run a candidate module over the last committed batches without
    /// writing, and show how its output differs from what was committed.
    Shadow(cli::replay::Shadow),
    /// Make a plugin project in a new directory NAME: a transform that
    /// builds as it is, a sample input and a README.
    New(cli::project::New),
    /// Build the plugin project in DIR (default: here) into a component,
    /// with the language's toolchain: dist/NAME.wasm unless --out says.
    Build(cli::project::Build),
    /// Run a module on sample records (JSON lines) locally, with no broker
    /// and no database, under a pipeline's limits, and print its rows,
    /// rejections, dead letters, logs and output digest. Exits 1 if a row
    /// breaks a target of --target-schema.
    Test(cli::project::Test),
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
    Reset(cli::reset::Reset),
    /// Look at the keyed state a pipeline's sink holds: one key, or a
    /// partition's keys in order (reads only).
    State {
        #[command(subcommand)]
        command: cli::state::StateCommand,
    },
    /// Produce sample records (the `sluice test --input` JSON lines) to a
    /// topic, in order; prints how many went to each partition.
    Produce(cli::topic::Produce),
    /// Print a topic's committed records, from the start of each partition
    /// to its end, as sample lines (`sluice test --input`, `sluice produce`).
    Consume(cli::topic::Consume),
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // `sluice build` of a JavaScript project runs this binary, under
    // another name, as componentize-js's pre-initializer.
    if args
        .first()
        .is_some_and(|argv0| sluice::plugin_build::is_js_pre_init(argv0))
    {
        let status = sluice::plugin_build::js_pre_init_main(&args[1..]);
        return std::process::ExitCode::from(status as u8);
    }
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
        Command::Test(_) => "warn,sluice_runtime=off",
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
            let error: &(dyn std::error::Error + 'static) = e.as_ref();
            eprintln!("error: {}", sluice_core::error::Chain(error));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the command: each lives in `cli/`, by what it works on.
async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => cli::run::run(args).await,
        Command::Check(args) => cli::run::check(args),
        Command::Deploy(args) => cli::control::deploy(args).await,
        Command::Versions(args) => cli::control::versions(args).await,
        Command::Activate(args) => cli::control::activate(args).await,
        Command::Rollback(args) => cli::control::rollback(args).await,
        Command::Status(args) => cli::control::status(args).await,
        Command::Logs(args) => cli::control::logs(args).await,
        Command::Verify(args) => cli::replay::verify(args).await,
        Command::Shadow(args) => cli::replay::shadow(args).await,
        Command::New(args) => cli::project::new(args),
        Command::Build(args) => cli::project::build(args),
        Command::Test(args) => cli::project::test(args),
        Command::DeadLetters { command } => cli::dead_letters::execute(command).await,
        Command::Reset(args) => cli::reset::reset(args).await,
        Command::State { command } => cli::state::execute(command).await,
        Command::Produce(args) => cli::topic::produce(args).await,
        Command::Consume(args) => cli::topic::consume(args),
    }
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

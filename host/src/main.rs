//! The `sluice` command line. The only place anyhow is used.
//!
//! Owns argument parsing, logging set-up and signal handling (SIGINT and
//! SIGTERM drain the batch in flight, then exit). It must not hold pipeline
//! logic.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

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
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    match runtime.block_on(execute(cli)) {
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
            println!(
                "{} batches, {} records, {} rows, {} dead letters",
                stats.batches, stats.records, stats.rows, stats.dead_letters
            );
            Ok(())
        }
        Command::Check { config } => {
            let config = sluice::config::PipelineConfig::load(&config)?;
            sluice::app::load_transform(&config)?;
            println!("config and module OK");
            Ok(())
        }
    }
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

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
        Command::Status { api } => {
            let status = api.client().status().await?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(())
        }
    }
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

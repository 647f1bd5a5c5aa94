//! `sluice run` and `sluice check`: a pipeline run until a signal (or
//! caught up), and a config and its module validated without connecting.
//!
//! It must not hold pipeline logic: that is `sluice::app`.

use super::stop_on_signal;
use anyhow::Context;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

// The arguments of `sluice run` (the help text is on `Command::Run`).
#[derive(clap::Args)]
pub struct Run {
    /// The pipeline's TOML config.
    config: PathBuf,
    /// Exit 0 once every owned partition has committed up to the log end
    /// seen when it was first reached (for tests and backfills).
    #[arg(long)]
    until_caught_up: bool,
}

// The arguments of `sluice check`.
#[derive(clap::Args)]
pub struct Check {
    /// The pipeline's TOML config.
    config: PathBuf,
}

pub async fn run(args: Run) -> anyhow::Result<()> {
    let Run {
        config,
        until_caught_up,
    } = args;
    let config = sluice::backends::load(&config)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let stats = sluice::app::run(&config, until_caught_up, shutdown)
        .await
        .with_context(|| format!("pipeline `{}`", config.pipeline))?;
    let mut summary = format!(
        "{} batches, {} records, {} rows, {} dead letters",
        stats.batches, stats.records, stats.rows, stats.dead_letters
    );
    if stats.fenced > 0 {
        summary += &format!(", {} fenced commits rolled back", stats.fenced);
    }
    let state = stats.state;
    if state.keys_read > 0 || state.keys_written > 0 {
        summary += &format!(
            "\nstate: {} keys read, {:.1}% from the cache ({} read from the sink key by key, \
             {} batches' record keys read at once, {} partitions loaded whole, {:.0} ms reading \
             the sink), {} keys written",
            state.keys_read,
            state.cache_hit_ratio() * 100.0,
            state.sink_key_reads,
            state.record_key_reads,
            state.partitions_loaded,
            state.sink_read_seconds * 1000.0,
            state.keys_written
        );
        if state.keys_expired > 0 {
            summary += &format!(", {} expired keys removed", state.keys_expired);
        }
    }
    // Rows are the stdout sink's output: keep the summary out of it.
    match config.sink.kind()? {
        sluice::sink::SinkKind::Stdout => eprintln!("{summary}"),
        _ => println!("{summary}"),
    }
    Ok(())
}

pub fn check(args: Check) -> anyhow::Result<()> {
    let config = sluice::backends::load(&args.config)?;
    sluice::app::load_transform(&config)?;
    println!("config and module OK");
    Ok(())
}

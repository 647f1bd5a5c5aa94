//! Wiring: turns a validated config into a running pipeline.
//!
//! Owns the start-up order (module first, so a bad module fails before any
//! connection; then sink, then source) and the errors a user sees when a
//! piece is missing. It must not hold batch logic: that is `pipeline`.

use crate::config::PipelineConfig;
use crate::pipeline::Sink;
use crate::pipeline::{Pipeline, PipelineError, RunOptions, RunStats};
use crate::runtime::{Limits, ModuleError, RunError, Runtime, WasmTransform};
use crate::sink::{SinkError, SinkKind, mysql, postgres, sqlite};
use crate::source::{KafkaSource, SourceError};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why a pipeline could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("module {path}: {source}")]
    Module { path: String, source: ModuleError },
    #[error("module {path}: {source}")]
    Params { path: String, source: RunError },
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// Loads and validates the configured module (no network).
pub fn load_transform(config: &PipelineConfig) -> Result<WasmTransform, AppError> {
    let path = config.module.path.display().to_string();
    let runtime =
        Runtime::new(Limits::from_config(&config.limits)).map_err(|source| AppError::Module {
            path: path.clone(),
            source,
        })?;
    let bytes = std::fs::read(&config.module.path).map_err(|source| AppError::Module {
        path: path.clone(),
        source: ModuleError::Read {
            path: config.module.path.clone(),
            source,
        },
    })?;
    let module = runtime
        .load(&bytes, config.module.cache_dir.as_deref())
        .map_err(|source| AppError::Module {
            path: path.clone(),
            source,
        })?;
    WasmTransform::new(Arc::new(runtime), module, config.params_json())
        .map_err(|source| AppError::Params { path, source })
}

/// Runs the pipeline until `shutdown` (or caught up, if asked).
pub async fn run(
    config: &PipelineConfig,
    until_caught_up: bool,
    shutdown: CancellationToken,
) -> Result<RunStats, AppError> {
    let transform = load_transform(config)?;
    match SinkKind::of_url(&config.sink.url)? {
        SinkKind::Sqlite => {
            let sink = sqlite::open(&config.sink).await?;
            run_with(config, transform, sink, until_caught_up, shutdown).await
        }
        SinkKind::Postgres => {
            let sink = postgres::open(&config.sink).await?;
            run_with(config, transform, sink, until_caught_up, shutdown).await
        }
        SinkKind::Mysql => {
            let sink = mysql::open(&config.sink).await?;
            run_with(config, transform, sink, until_caught_up, shutdown).await
        }
    }
}

async fn run_with<S: Sink>(
    config: &PipelineConfig,
    transform: WasmTransform,
    sink: S,
    until_caught_up: bool,
    shutdown: CancellationToken,
) -> Result<RunStats, AppError> {
    let group = config.group_id();
    let source_config = config.source.clone();
    let source = tokio::task::spawn_blocking(move || KafkaSource::connect(&source_config, &group))
        .await
        .expect("source connect task")?;
    let options = RunOptions {
        pipeline: config.pipeline.clone(),
        batch_interval: Duration::from_millis(config.source.batch_interval_ms),
        on_trap: config.limits.on_trap,
        until_caught_up,
    };
    Ok(Pipeline::new(options, source, sink, transform)
        .run(shutdown)
        .await?)
}

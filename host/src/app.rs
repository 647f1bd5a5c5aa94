//! Wiring: turns a validated config into a running pipeline.
//!
//! Owns the start-up order (the configured module first, so a bad module
//! fails before any connection; then sink, module store, control plane, the
//! active version — waited for while this host cannot run it — and the
//! source) and the errors a user sees when a piece is missing. Which
//! backend a sink kind opens is `backends`'. It must not hold batch logic:
//! that is `pipeline`.

use crate::backends::WithSink;
use crate::config::PipelineConfig;
use crate::control::{self, ControlState, ServeLimits};
use crate::kafka_source::{KafkaSource, SourceError};
use crate::pipeline::{Pipeline, PipelineError, RunOptions, RunStats, StatusBoard};
use crate::runtime::{Limits, ModuleError, RunError, Runtime, StoreVersions, WasmTransform};
use crate::sink::{Sink, SinkError, SinkKind};
use sluice_core::contract::OutputContract;
use sluice_core::error::Chain;
use sluice_core::store::{StoreError, Version};
use sluice_core::transform::Transform;
use sluice_core::versions::VersionError;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why a pipeline could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("module {path}")]
    Module { path: String, source: ModuleError },
    #[error("module {path}")]
    Params { path: String, source: RunError },
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("control plane on {listen}")]
    Control {
        listen: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// The configured module, read and validated (no network).
struct ConfiguredModule {
    runtime: Arc<Runtime>,
    component: Vec<u8>,
    transform: WasmTransform,
}

fn load_configured(config: &PipelineConfig) -> Result<ConfiguredModule, AppError> {
    load_module(
        &config.module.path,
        Limits::from_config(&config.limits).with_event_time(&config.event_time),
        config.params_json(),
        config.module.cache_dir.as_deref(),
    )
}

/// Reads, validates and compiles the module at `path` (or takes it from
/// `cache_dir`) in a runtime of its own under `limits`, and checks `init`
/// accepts `params`. No network: `run`, `check` and `sluice test` load
/// modules here.
fn load_module(
    path: &std::path::Path,
    limits: Limits,
    params: String,
    cache_dir: Option<&std::path::Path>,
) -> Result<ConfiguredModule, AppError> {
    let shown = path.display().to_string();
    let module_err = |source| AppError::Module {
        path: shown.clone(),
        source,
    };
    let runtime = Arc::new(Runtime::new(limits).map_err(module_err)?);
    let component = std::fs::read(path).map_err(|source| {
        module_err(ModuleError::Read {
            path: path.to_path_buf(),
            source,
        })
    })?;
    let module = runtime.load(&component, cache_dir).map_err(module_err)?;
    let transform = WasmTransform::new(Arc::clone(&runtime), module, params).map_err(|source| {
        AppError::Params {
            path: shown.clone(),
            source,
        }
    })?;
    Ok(ConfiguredModule {
        runtime,
        component,
        transform,
    })
}

/// Loads and validates the module at `path` under `limits` with `params`
/// (no network): the transform a sample run (`sluice test`) uses.
pub fn load_module_transform(
    path: &std::path::Path,
    limits: Limits,
    params: String,
    cache_dir: &std::path::Path,
) -> Result<WasmTransform, AppError> {
    Ok(load_module(path, limits, params, Some(cache_dir))?.transform)
}

/// Loads and validates the configured module (no network).
pub fn load_transform(config: &PipelineConfig) -> Result<WasmTransform, AppError> {
    Ok(load_configured(config)?.transform)
}

/// Runs the pipeline until `shutdown` (or caught up, if asked).
pub async fn run(
    config: &PipelineConfig,
    until_caught_up: bool,
    shutdown: CancellationToken,
) -> Result<RunStats, AppError> {
    let module = load_configured(config)?;
    let running = Running {
        config,
        module,
        until_caught_up,
        shutdown,
    };
    crate::backends::with_sink(config, running).await?
}

/// A pipeline run, handed the sink it commits into.
struct Running<'a> {
    config: &'a PipelineConfig,
    module: ConfiguredModule,
    until_caught_up: bool,
    shutdown: CancellationToken,
}

impl WithSink for Running<'_> {
    type Output = Result<RunStats, AppError>;
    async fn with<S: Sink>(self, sink: S) -> Self::Output {
        let Running {
            config,
            module,
            until_caught_up,
            shutdown,
        } = self;
        run_with(config, module, sink, until_caught_up, shutdown).await
    }
}

async fn run_with<S: Sink>(
    config: &PipelineConfig,
    module: ConfiguredModule,
    sink: S,
    until_caught_up: bool,
    shutdown: CancellationToken,
) -> Result<RunStats, AppError> {
    let store = crate::backends::module_store(config).await?;
    let versions = StoreVersions::new(
        Arc::clone(&store),
        Arc::clone(&module.runtime),
        config.module.cache_dir.clone(),
        config.pipeline.clone(),
    );
    let active = versions
        .active_or_seed(&module.component, &config.params_json())
        .await?;
    let status = StatusBoard::for_pipeline(&config.pipeline);
    // The control plane comes up before the active version is loaded, so
    // a version this host cannot run can always be rolled back through it.
    let control_stop = shutdown.child_token();
    let control = match &config.control {
        Some(c) => {
            let state = ControlState {
                pipeline: config.pipeline.clone(),
                store,
                runtime: Arc::clone(&module.runtime),
                cache_dir: config.module.cache_dir.clone(),
                token: c.effective_token(),
                max_module_bytes: c.max_module_bytes,
                status: status.clone(),
                validations: tokio::sync::Semaphore::new(control::server::MAX_PARALLEL_VALIDATIONS),
                liveness_ms: liveness_ms(config),
                started_ms: sluice_core::batch::now_ms(),
            };
            let limits = ServeLimits {
                request_timeout: Duration::from_millis(c.request_timeout_ms.get()),
                max_connections: c.max_connections.get() as usize,
            };
            Some(spawn_control(&c.listen, state, limits, control_stop.clone()).await?)
        }
        None => None,
    };
    let run = async {
        let Some(transform) =
            first_runnable(&versions, active, module.transform, &status, &shutdown).await?
        else {
            return Ok(RunStats::default());
        };
        let group = config.group_id();
        let source_config = config.effective_source();
        let source =
            tokio::task::spawn_blocking(move || KafkaSource::connect(&source_config, &group))
                .await
                .expect("source connect task")?;
        let options = RunOptions {
            pipeline: config.pipeline.clone(),
            batch_interval: Duration::from_millis(config.source.batch_interval_ms),
            on_poison: config.limits.on_poison,
            until_caught_up,
            contract: output_contract(config),
        };
        let pipeline = Pipeline::new(options, source, sink, versions, transform, status.clone());
        Ok(pipeline.run(shutdown.clone()).await?)
    };
    let result = run.await;
    control_stop.cancel();
    if let Some(server) = control {
        let _ = server.await;
    }
    result
}

/// The targets every run's output must fit before its batch commits (so a
/// record whose rows break them is isolated as a `contract` poison): the
/// sink's, except on stdout, which prints any rows.
/// How long the batch loop may go without coming round before `/healthz`
/// calls it wedged: a minute, or longer where one step may legitimately
/// take longer (three batch timeouts: a run, its retry and a bisection's
/// share; two lock timeouts: one sink call that waits on a lock).
fn liveness_ms(config: &PipelineConfig) -> i64 {
    let batch = 3 * config.limits.batch_timeout_ms;
    let lock = 2 * config.sink.lock_timeout_ms.get();
    60_000.max(batch).max(lock) as i64
}

pub fn output_contract(config: &PipelineConfig) -> OutputContract {
    match config.sink.kind() {
        Ok(SinkKind::Stdout) => OutputContract::any(),
        _ => OutputContract::of(&config.sink.targets),
    }
}

/// How often a host that cannot run the active version asks again.
const UNRUNNABLE_RECHECK: Duration = Duration::from_secs(1);

/// The transform of the active version: the configured one if it is that
/// version, else loaded from the store. While the active version cannot
/// run on this host, waits (saying so on the status board and in the log)
/// until another version is activated; `None` if shut down meanwhile.
async fn first_runnable(
    versions: &StoreVersions,
    mut active: Version,
    configured: WasmTransform,
    status: &StatusBoard,
    shutdown: &CancellationToken,
) -> Result<Option<WasmTransform>, AppError> {
    let mut configured = Some(configured);
    loop {
        let is_configured = configured.as_ref().is_some_and(|c| {
            active.module_digest == c.module_digest() && active.params == c.params()
        });
        let loaded = match is_configured {
            true => Ok(configured.take().expect("checked above")),
            false => {
                tracing::warn!(
                    version = active.version,
                    module = %active.module_digest,
                    "the module store's active version differs from module.path/params in the \
                     config; running the store's (deploy with `sluice deploy --activate` to change it)"
                );
                versions.load(&active).await
            }
        };
        match loaded {
            Ok(transform) => {
                status.update(|s| s.version_problem = None);
                tracing::info!(
                    version = active.version,
                    module = %active.module_digest,
                    params = %active.params,
                    "running module version"
                );
                return Ok(Some(transform));
            }
            Err(e @ VersionError::Unusable { .. }) => {
                let problem = Chain(&e).to_string();
                tracing::error!(
                    "{problem}; waiting for another version to be activated (roll back, or give \
                     this host the limits it needs)"
                );
                status.update(|s| s.version_problem = Some(problem));
            }
            Err(e) => tracing::warn!("{}; trying again", Chain(&e)),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(UNRUNNABLE_RECHECK) => {}
        }
        loop {
            match versions.active().await {
                Ok(Some(newer)) if newer.version != active.version => {
                    active = newer;
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("{}; trying again", Chain(&e)),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(UNRUNNABLE_RECHECK) => {}
            }
        }
    }
}

/// Binds the control API (so a taken port fails the start) and serves it
/// in the background until `stop`.
async fn spawn_control(
    listen: &str,
    state: ControlState,
    limits: ServeLimits,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, AppError> {
    let control_err = |source| AppError::Control {
        listen: listen.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(control_err)?;
    let bound = listener.local_addr().map_err(control_err)?;
    if state.token.is_none() {
        tracing::warn!(
            "control API: no token configured (SLUICE_CONTROL_TOKEN); writes are refused"
        );
    }
    tracing::info!(address = %bound, "control API listening");
    Ok(tokio::spawn(control::serve(
        listener,
        Arc::new(state),
        limits,
        stop,
    )))
}

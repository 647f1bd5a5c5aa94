//! Replaying committed batches: `verify` re-reads a batch's offset ranges,
//! runs them again with the module and params its lineage row names, and
//! compares the output digest with the recorded one; `shadow` runs a
//! candidate version over the same batches and diffs its output against the
//! recorded version's. Both start a batch from the keyed state its
//! original runs read, as lineage recorded it (`state`).
//!
//! It must not write anything: no rows, no offsets, no lineage, no versions.
//! It relies on the three conditions of exactly-once the other way round: a
//! range reads back the same records and a module is deterministic, so a
//! replay that differs names a batch whose recorded result cannot be
//! reproduced.

mod diff;
mod state;

pub use diff::{TargetDiff, diff_outputs};
pub use sluice_core::store::{CommittedBatch, Selection};

use crate::batch::{Plan, sha256_hex};
use crate::config::PipelineConfig;
use crate::kafka_source::{RangeReader, SourceError};
use crate::pipeline::{Batch, PipelineError, Preparer};
use crate::runtime::{ENGINE, Limits, ModuleError, ReplaySettings, Runtime, WasmTransform};
use crate::sink::SinkError;
use sluice_core::error::Cause;
use sluice_core::store::{LineageStore, ModuleStore, StoreError};
use std::collections::HashMap;
use std::sync::Arc;

/// Why a replay could not be done (as opposed to a mismatch, which is a
/// result).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("module {module}")]
    Module {
        module: String,
        #[source]
        cause: Cause,
    },
    /// The lineage does not say how to replay the batch.
    #[error("batch {batch_id}: {message}")]
    Batch { batch_id: String, message: String },
    /// The batch could not be transformed again.
    #[error("batch {batch_id}")]
    Transform {
        batch_id: String,
        #[source]
        cause: PipelineError,
    },
}

/// The outcome of verifying one batch.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub batch: CommittedBatch,
    pub replayed_digest: String,
    /// How many records the replay read.
    pub records: usize,
    /// Set when the replay could not run exactly as the batch did: no
    /// settings recorded, or another engine; says what was used instead.
    pub caveat: Option<String>,
}

impl Verdict {
    pub fn matches(&self) -> bool {
        self.replayed_digest == self.batch.output_digest
    }
}

/// A module version to replay with: its bytes and params, each hashed
/// once (a Python or JavaScript component is tens of MiB).
pub struct ModuleVersion {
    component: Vec<u8>,
    module_digest: String,
    params: String,
    params_digest: String,
}

impl ModuleVersion {
    pub fn new(component: Vec<u8>, params: String) -> ModuleVersion {
        ModuleVersion {
            module_digest: sha256_hex(&component),
            params_digest: sha256_hex(params.as_bytes()),
            component,
            params,
        }
    }
}

/// Replays one pipeline's committed batches.
pub struct Replayer {
    config: PipelineConfig,
    lineage: Arc<dyn LineageStore>,
    store: Arc<dyn ModuleStore>,
    reader: RangeReader,
    /// This config's limits: the deadline and compile budget of every
    /// replay, and the rest for batches that recorded no settings.
    limits: Limits,
    /// A runtime per set of recorded limits (a CLI replay may need several).
    runtimes: HashMap<ReplaySettings, Arc<Runtime>>,
    /// Loaded versions by (module digest, params digest, settings).
    preparers: HashMap<(String, String, ReplaySettings), Arc<Preparer<WasmTransform>>>,
    /// Recorded versions by (module digest, params digest), read from the
    /// module store once.
    recorded: HashMap<(String, String), Arc<ModuleVersion>>,
}

impl Replayer {
    pub async fn open(config: &PipelineConfig) -> Result<Replayer, ReplayError> {
        let lineage = crate::backends::lineage(config).await?;
        let store = crate::backends::module_store(config).await?;
        let source = config.source.clone();
        let pipeline = config.pipeline.clone();
        let reader = tokio::task::spawn_blocking(move || RangeReader::connect(&source, &pipeline))
            .await
            .expect("connect task")?;
        Ok(Replayer {
            config: config.clone(),
            lineage,
            store,
            reader,
            limits: Limits::from_config(&config.limits),
            runtimes: HashMap::new(),
            preparers: HashMap::new(),
            recorded: HashMap::new(),
        })
    }

    /// The committed batches `selection` names that can be replayed, in
    /// commit order, and how many redrive batches it also named (their
    /// records were dead letters, which they removed: nothing to re-read).
    pub async fn select(
        &self,
        selection: &Selection,
    ) -> Result<(Vec<CommittedBatch>, usize), ReplayError> {
        let every = Selection {
            last: None,
            ..selection.clone()
        };
        let mut batches = self.lineage.batches(&self.config.pipeline, &every).await?;
        let before = batches.len();
        batches.retain(|b| !b.is_redrive());
        let redrives = before - batches.len();
        // The newest replayable ones: redrives do not count.
        selection.keep_last(&mut batches);
        Ok((batches, redrives))
    }

    /// Runs `batch` again with the version its lineage row names and
    /// compares output digests.
    pub async fn verify(&mut self, batch: &CommittedBatch) -> Result<Verdict, ReplayError> {
        let replayed = self.rerun_recorded(batch).await?;
        // Batches recorded without settings predate the canonical digest.
        let replayed_digest = match batch.settings.is_empty() {
            true => replayed.output.legacy_digest(),
            false => replayed.output_digest,
        };
        Ok(Verdict {
            batch: batch.clone(),
            replayed_digest,
            records: replayed.records.len(),
            caveat: self.caveat(batch),
        })
    }

    /// The settings `batch` is replayed under: those it recorded, or this
    /// config's for a batch that recorded none.
    pub fn settings_for(&self, batch: &CommittedBatch) -> ReplaySettings {
        ReplaySettings::from_json(&batch.settings)
            .unwrap_or_else(|| self.limits.replay_settings(self.config.limits.on_poison))
    }

    fn caveat(&self, batch: &CommittedBatch) -> Option<String> {
        match ReplaySettings::from_json(&batch.settings) {
            None => Some(
                "no settings recorded (committed by an older sluice): replayed under this config's limits"
                    .into(),
            ),
            Some(s) if s.engine != ENGINE => Some(format!(
                "recorded under {}, replayed under {ENGINE}",
                s.engine
            )),
            Some(_) => None,
        }
    }

    /// The recorded version's output of `batch`, replayed: the module and
    /// params its lineage row names, from the module store.
    pub async fn rerun_recorded(&mut self, batch: &CommittedBatch) -> Result<Batch, ReplayError> {
        let version = self.recorded_version(batch).await?;
        self.rerun(batch, &version).await
    }

    /// The module and params `batch`'s lineage row names.
    async fn recorded_version(
        &mut self,
        batch: &CommittedBatch,
    ) -> Result<Arc<ModuleVersion>, ReplayError> {
        let key = (batch.module_digest.clone(), batch.params_digest.clone());
        if let Some(version) = self.recorded.get(&key) {
            return Ok(Arc::clone(version));
        }
        let params = self
            .store
            .params_for(&self.config.pipeline, &batch.params_digest)
            .await?
            .ok_or_else(|| ReplayError::Batch {
                batch_id: batch.batch_id.clone(),
                message: format!(
                    "params {} are not in the version history",
                    batch.params_digest
                ),
            })?;
        let component = self.store.get(&batch.module_digest).await?;
        let version = Arc::new(ModuleVersion::new(component, params));
        self.recorded.insert(key, Arc::clone(&version));
        Ok(version)
    }

    /// Runs the records of `batch`'s ranges through `version`, under the
    /// batch's own plan (id, time, seed).
    pub async fn rerun(
        &mut self,
        batch: &CommittedBatch,
        version: &ModuleVersion,
    ) -> Result<Batch, ReplayError> {
        let settings = self.settings_for(batch);
        let preparer = self.preparer(version, settings)?;
        let plan = Plan::new(
            &self.config.pipeline,
            batch.ranges.clone(),
            &version.module_digest,
            preparer.params_digest(),
            batch.batch_time_ms,
        );
        if plan.batch_id != batch.batch_id {
            return Err(ReplayError::Batch {
                batch_id: batch.batch_id.clone(),
                message: format!(
                    "its lineage ranges give batch id {}: the lineage rows are inconsistent",
                    plan.batch_id
                ),
            });
        }
        let reader = &mut self.reader;
        let reading = std::time::Instant::now();
        let records = tokio::task::block_in_place(|| reader.read(&plan.ranges))?;
        let read_ms = reading.elapsed().as_millis() as u64;
        let transforming = std::time::Instant::now();
        let state = state::ReplayState::new(
            Arc::clone(&self.lineage),
            &self.config.pipeline,
            &batch.batch_id,
        );
        let replayed =
            tokio::task::block_in_place(|| preparer.transform_planned(plan, records, 0, state))
                .map_err(|cause| ReplayError::Transform {
                    batch_id: batch.batch_id.clone(),
                    cause,
                })?;
        tracing::debug!(
            batch = %batch.batch_id,
            read_ms,
            transform_ms = transforming.elapsed().as_millis() as u64,
            "batch replayed"
        );
        Ok(replayed)
    }

    fn preparer(
        &mut self,
        version: &ModuleVersion,
        settings: ReplaySettings,
    ) -> Result<Arc<Preparer<WasmTransform>>, ReplayError> {
        let key = (
            version.module_digest.clone(),
            version.params_digest.clone(),
            settings.clone(),
        );
        if let Some(p) = self.preparers.get(&key) {
            return Ok(Arc::clone(p));
        }
        let module_err = |cause: Cause| ReplayError::Module {
            module: key.0.clone(),
            cause,
        };
        let runtime = self.runtime(&settings).map_err(|e| module_err(e.into()))?;
        let module = tokio::task::block_in_place(|| {
            runtime.load(&version.component, self.config.module.cache_dir.as_deref())
        })
        .map_err(|e| module_err(e.into()))?;
        let transform = WasmTransform::new(runtime, module, version.params.clone())
            .map_err(|e| module_err(e.into()))?;
        let preparer = Arc::new(
            Preparer::new(self.config.pipeline.clone(), settings.on_poison, transform)
                .with_contract(crate::app::output_contract(&self.config)),
        );
        self.preparers.insert(key, Arc::clone(&preparer));
        Ok(preparer)
    }

    /// The runtime for `settings`' limits, made on first use.
    fn runtime(&mut self, settings: &ReplaySettings) -> Result<Arc<Runtime>, ModuleError> {
        if let Some(r) = self.runtimes.get(settings) {
            return Ok(Arc::clone(r));
        }
        let runtime = Arc::new(Runtime::new(settings.limits(&self.limits))?);
        self.runtimes.insert(settings.clone(), Arc::clone(&runtime));
        Ok(runtime)
    }
}

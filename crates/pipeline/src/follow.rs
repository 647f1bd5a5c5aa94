//! Following the active version: asking the version store (at most every
//! quarter batch interval), the one policy for what its answer means, and
//! the switch at a batch boundary, so every batch runs on the version
//! active when it commits.
//!
//! It must not commit or read the source: a batch prepared with an older
//! version is prepared again from the same ranges by the preparer.

use crate::{Batch, Parts, Pipeline, PipelineError, Preparer};
use sluice_core::error::Chain;
use sluice_core::sink::Sink;
use sluice_core::source::{PollSignals, Source};
use sluice_core::transform::Transform;
use sluice_core::versions::{Swap, VersionError, Versions};
use std::sync::Arc;
use std::time::Instant;

/// What asking for the active version gave.
pub(crate) enum Asked<T> {
    /// Another version is active; it is loaded.
    Newer(Swap<T>),
    /// The running version is still the active one.
    Same,
    /// The store could not say, or the active version cannot run here:
    /// the running version is kept (said once, on the status).
    Failed,
}

impl<S: Sink, V: Versions> Parts<S, V> {
    /// True once the active version was last asked for a quarter batch
    /// interval ago.
    pub(crate) fn version_due(&self) -> bool {
        self.version_checked.get().elapsed() >= self.options.batch_interval / 4
    }

    /// Asks for the active version, applying the one policy: a newer one is
    /// loaded; the same one means a problem reported before is over; an
    /// unavailable store keeps the running version; an active version that
    /// cannot run here keeps it too, reported on the status once.
    pub(crate) async fn ask_versions(&self) -> Asked<V::Transform> {
        self.version_checked.set(Instant::now());
        match self.versions.newer(self.preparer.transform()).await {
            Ok(Some(swap)) => Asked::Newer(swap),
            Ok(None) => {
                self.report_version_problem(None);
                Asked::Same
            }
            Err(e @ VersionError::Unavailable(_)) => {
                tracing::warn!("{}; keeping the running version", Chain(&e));
                Asked::Failed
            }
            Err(e) => {
                self.report_version_problem(Some(Chain(&e).to_string()));
                Asked::Failed
            }
        }
    }

    /// While the source works beside: asks for the active version every
    /// quarter batch interval (once the last ask is that old) until the
    /// work is `done`; a newer version interrupts the work's poll, and so
    /// does shutdown.
    pub(crate) async fn watch_versions(
        &self,
        mut done: tokio::sync::oneshot::Receiver<()>,
        signals: &PollSignals,
    ) -> Option<Swap<V::Transform>> {
        let every = self.options.batch_interval / 4;
        loop {
            let next = self.version_checked.get() + every;
            let stopping = signals.interrupted();
            tokio::select! {
                _ = &mut done => return None,
                _ = self.shutdown.cancelled(), if !stopping => {
                    signals.interrupt();
                    continue;
                }
                _ = tokio::time::sleep_until(next.into()), if !stopping => {}
            }
            match self.ask_versions().await {
                Asked::Newer(swap) => {
                    signals.interrupt();
                    return Some(swap);
                }
                Asked::Same => {}
                Asked::Failed => return None,
            }
        }
    }

    /// Logs (once per change) and publishes that the active version cannot
    /// run here, or that it can again (`None`).
    pub(crate) fn report_version_problem(&self, problem: Option<String>) {
        let changed = self.status.snapshot().version_problem != problem;
        if !changed {
            return;
        }
        match &problem {
            Some(p) => tracing::error!(
                module = %self.preparer.transform().module_digest(),
                "{p}; keeping the running version (roll back, or give this host the limits it needs)"
            ),
            None => tracing::info!("the active version runs on this host again"),
        }
        self.status.update(|s| s.version_problem = problem);
    }

    /// Puts the version batches are now prepared with on the status board.
    pub(crate) fn publish_version(&self) {
        let transform = self.preparer.transform();
        let (module, params) = (
            transform.module_digest().to_string(),
            sluice_core::batch::sha256_hex(transform.params().as_bytes()),
        );
        self.status.metrics().active_module(&module, &params);
        let pipeline = self.options.pipeline.clone();
        self.status.update(|s| {
            s.pipeline = pipeline;
            s.module_digest = module;
            s.params_digest = params;
        });
    }
}

impl<Src: Source, S: Sink, V: Versions> Pipeline<Src, S, V> {
    /// At a batch boundary: switches to `found` (a version found while the
    /// source read), or, if none and an ask is due, asks for the active
    /// version and switches if another one was activated. A batch already
    /// prepared with the old version is prepared again from the same
    /// ranges.
    pub(crate) async fn follow_active_version(
        &mut self,
        found: Option<Swap<V::Transform>>,
        prepared: Option<Batch>,
    ) -> Result<Option<Batch>, PipelineError> {
        let swap = match found {
            Some(swap) => swap,
            None if !self.parts.version_due() => return Ok(prepared),
            None => match self.parts.ask_versions().await {
                Asked::Newer(swap) => swap,
                Asked::Same | Asked::Failed => return Ok(prepared),
            },
        };
        self.switch_to(swap);
        let Some(stale) = prepared else {
            return Ok(None);
        };
        let parts = &self.parts;
        let state = parts.state.base();
        let batch = tokio::task::block_in_place(|| {
            parts
                .preparer
                .prepare(&self.source, stale.plan.ranges, state)
        });
        self.settle_prepared(batch.map(Some))
    }

    /// Prepares batches with `swap`'s version from now on.
    fn switch_to(&mut self, swap: Swap<V::Transform>) {
        let parts = &mut self.parts;
        parts.report_version_problem(None);
        tracing::info!(
            version = swap.version,
            module = %swap.transform.module_digest(),
            "switching to module version at this batch boundary"
        );
        let preparer = Preparer::new(
            parts.options.pipeline.clone(),
            parts.options.on_poison,
            swap.transform,
        )
        .with_contract(parts.options.contract.clone());
        parts.preparer = Arc::new(preparer);
        parts.current.send_replace(Arc::clone(&parts.preparer));
        if parts.shutdown.is_cancelled() {
            parts.preparer.interrupt();
        }
        parts.status.metrics().swapped();
        parts.publish_version();
        self.unstall();
    }
}

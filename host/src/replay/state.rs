//! The keyed state a replayed batch starts from: what its original runs
//! read, as its lineage recorded it, fetched the first time the module
//! makes a state call (a stateless batch never asks).
//!
//! It must not read the sink's current state: a replay that asks for a key
//! the original runs never read fails, saying so, instead of guessing.

use sluice_core::batch::TopicPartition;
use sluice_core::state::{Recorded, StateBase, StateError, StateValue};
use sluice_core::store::LineageStore;
use std::sync::{Arc, OnceLock};

pub struct ReplayState {
    lineage: Arc<dyn LineageStore>,
    pipeline: String,
    batch_id: String,
    handle: tokio::runtime::Handle,
    recorded: OnceLock<Result<Recorded, StateError>>,
}

impl ReplayState {
    /// The recorded start state of `batch_id`; made inside the runtime the
    /// lineage store uses.
    pub fn new(lineage: Arc<dyn LineageStore>, pipeline: &str, batch_id: &str) -> Arc<Self> {
        Arc::new(ReplayState {
            lineage,
            pipeline: pipeline.to_string(),
            batch_id: batch_id.to_string(),
            handle: tokio::runtime::Handle::current(),
            recorded: OnceLock::new(),
        })
    }

    fn recorded(&self) -> Result<&Recorded, StateError> {
        let loaded = self.recorded.get_or_init(|| {
            let reads = self
                .handle
                .block_on(self.lineage.state_reads(&self.pipeline, &self.batch_id));
            reads
                .map(Recorded)
                .map_err(|e| StateError::Unavailable(format!("{e:#}")))
        });
        loaded.as_ref().map_err(Clone::clone)
    }
}

impl StateBase for ReplayState {
    fn get(&self, tp: &TopicPartition, key: &[u8]) -> Result<Option<StateValue>, StateError> {
        self.recorded()?.get(tp, key)
    }
}

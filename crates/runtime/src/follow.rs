//! Following the active version: what the pipeline asks between batches
//! ("is another version active now?"), answered from the module store, with
//! the new version's transform loaded (compiled or taken from the host's own
//! artifact cache) and its params checked.
//!
//! It must not decide when to ask, nor touch a batch: the pipeline swaps at
//! a batch boundary, so no batch mixes versions.

use crate::{Runtime, WasmTransform};
use sluice_core::store::{ModuleStore, StoreError, Version};
use sluice_core::transform::Transform;
use sluice_core::versions::{Swap, VersionError, Versions};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The versions of one pipeline, as its module store holds them.
pub struct StoreVersions {
    store: Arc<dyn ModuleStore>,
    runtime: Arc<Runtime>,
    cache_dir: Option<PathBuf>,
    pipeline: String,
    /// The last active version that could not be loaded here (module
    /// digest, params digest) and why: not compiled again on every ask.
    refused: Mutex<Option<(String, String, VersionError)>>,
}

impl StoreVersions {
    pub fn new(
        store: Arc<dyn ModuleStore>,
        runtime: Arc<Runtime>,
        cache_dir: Option<PathBuf>,
        pipeline: String,
    ) -> Self {
        StoreVersions {
            store,
            runtime,
            cache_dir,
            pipeline,
            refused: Mutex::new(None),
        }
    }

    /// The active version, after activating (`component`, `params`) as
    /// version 1 if the pipeline never had one (its first start).
    pub async fn active_or_seed(
        &self,
        component: &[u8],
        params: &str,
    ) -> Result<Version, StoreError> {
        if let Some(active) = self.store.active(&self.pipeline).await? {
            return Ok(active);
        }
        let digest = self.store.put(component).await?;
        self.store.seed(&self.pipeline, &digest, params).await
    }

    /// The active version, re-read from the store.
    pub async fn active(&self) -> Result<Option<Version>, VersionError> {
        self.store
            .active(&self.pipeline)
            .await
            .map_err(|e| VersionError::Unavailable(Arc::new(e)))
    }

    /// Loads `version`'s module from the store and binds its params. A
    /// version that cannot run here is remembered, and refused again
    /// without compiling it again.
    pub async fn load(&self, version: &Version) -> Result<WasmTransform, VersionError> {
        let key = (version.module_digest.clone(), version.params_digest.clone());
        if let Some((digest, params, error)) = &*self.refused.lock().expect("not poisoned")
            && (digest, params) == (&key.0, &key.1)
        {
            return Err(error.clone());
        }
        let loaded = self.load_uncached(version).await;
        if let Err(e @ VersionError::Unusable { .. }) = &loaded {
            *self.refused.lock().expect("not poisoned") = Some((key.0, key.1, e.clone()));
        }
        loaded
    }

    async fn load_uncached(&self, version: &Version) -> Result<WasmTransform, VersionError> {
        let unusable = |cause: Arc<dyn std::error::Error + Send + Sync>| VersionError::Unusable {
            version: version.version,
            cause,
        };
        let component = self.store.get(&version.module_digest).await.map_err(|e| {
            if e.is_retryable() {
                VersionError::Unavailable(Arc::new(e))
            } else {
                unusable(Arc::new(e))
            }
        })?;
        // Compiling is CPU-bound (seconds for a large module).
        tokio::task::block_in_place(|| {
            let module = self
                .runtime
                .load(&component, self.cache_dir.as_deref())
                .map_err(|e| unusable(Arc::new(e)))?;
            WasmTransform::new(Arc::clone(&self.runtime), module, version.params.clone())
                .map_err(|e| unusable(Arc::new(e)))
        })
    }
}

impl Versions for StoreVersions {
    type Transform = WasmTransform;

    async fn newer(
        &self,
        running: &WasmTransform,
    ) -> Result<Option<Swap<WasmTransform>>, VersionError> {
        let Some(active) = self.active().await? else {
            return Ok(None);
        };
        let params_digest = crate::batch::sha256_hex(running.params().as_bytes());
        if active.module_digest == running.module_digest() && active.params_digest == params_digest
        {
            return Ok(None);
        }
        let transform = self.load(&active).await?;
        Ok(Some(Swap {
            version: active.version,
            transform,
        }))
    }
}

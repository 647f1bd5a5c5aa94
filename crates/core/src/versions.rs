//! Module versions as the batch loop follows them: the `Versions` trait
//! (asked between batches whether another version is active) and what a
//! swap carries. Implemented by the runtime over the module store.
//!
//! It must not decide when to ask: the loop does, at batch boundaries, so
//! no batch mixes versions.

use crate::store::StoreError;
use crate::transform::Transform;
use std::sync::Arc;

/// Which module version a pipeline runs; asked between batches, so a swap
/// reaches every instance without restart and no batch mixes versions.
#[allow(async_fn_in_trait)]
pub trait Versions {
    type Transform: Transform;
    /// The active version's transform, if it is not `running`'s (module
    /// digest and params).
    async fn newer(
        &self,
        running: &Self::Transform,
    ) -> Result<Option<Swap<Self::Transform>>, VersionError>;
}

/// A version to switch to.
pub struct Swap<T> {
    pub version: i64,
    pub transform: T,
}

/// Why the active version could not be followed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VersionError {
    /// The state store did not answer: keep the running version, ask again.
    #[error("reading the active module version")]
    Unavailable(#[source] Arc<StoreError>),
    /// The active version cannot run on this host (its module does not
    /// load, or `init` fails under this host's limits): the host keeps the
    /// version it runs and says so on its status. Shared (`Arc`): a refusal
    /// is remembered and given again without loading the module again.
    #[error("module version {version} cannot run on this host")]
    Unusable {
        version: i64,
        #[source]
        cause: Arc<dyn std::error::Error + Send + Sync>,
    },
}

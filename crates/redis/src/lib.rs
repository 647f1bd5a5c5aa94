//! `sluice-redis`: the Redis sink and the state it keeps in Redis, next to
//! the data, under the sink's prefix (`table_prefix`, default `sluice_`):
//!
//! - `sink`: commits a batch by one script (exactly-once) or pipelined
//!   idempotent commands then a script (at-least-once); the delivery
//!   guarantee is stated there.
//! - `render`: rows to commands, through the targets' templates.
//! - `store`: the module store (components, activations).
//! - `lineage`: committed batches, for `verify` and `shadow`.
//! - `connect`: connections, error kinds, sluice's key names.
//!
//! It must not import another sink backend, and must never send a user's
//! key or value as anything but an argument (no script text is built
//! from data).

mod connect;
mod lineage;
mod render;
mod sink;
mod store;

pub use connect::StateKeys;
pub use lineage::RedisLineage;
pub use sink::{DEFAULT_LINEAGE_KEEP, MAX_SCRIPT_ARGUMENTS, RedisSink, open};
pub use store::RedisModuleStore;

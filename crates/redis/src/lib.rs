//! `sluice-redis`: the Redis sink and the state it keeps in Redis, next to
//! the data, under the sink's prefix (`table_prefix`, default `sluice_`):
//!
//! - `sink`: commits a batch by one script (exactly-once) or pipelined
//!   idempotent commands then a script (at-least-once); the delivery
//!   guarantee is stated there.
//! - `section`: the sink's own config fields (`lineage_keep`,
//!   `dead_letters_keep`, the targets' commands); `template`: the
//!   `{column}` templates they use.
//! - `render`: rows to commands, through the targets' templates; it
//!   compiles a target's commands and checks their rules, once.
//! - `store`: the module store (components, activations).
//! - `lineage`: committed batches, for `verify` and `shadow`.
//! - `dead_letters`: the stored dead letters, for `dead-letters list|show`;
//!   `redrive`: their redrive, committed by the commit script.
//! - `reset`: `sluice reset`, the checkpoints moved by one script.
//! - `state`: keyed state (a hash per partition), read back for the cache.
//! - `connect`: connections, error kinds, sluice's key names.
//!
//! It must not import another sink backend, and must never send a user's
//! key or value as anything but an argument (no script text is built
//! from data).

mod connect;
mod dead_letters;
mod lineage;
mod redrive;
mod render;
pub mod reset;
pub mod section;
mod sink;
mod state;
mod store;
mod template;

pub use connect::StateKeys;
pub use dead_letters::RedisDeadLetters;
pub use lineage::RedisLineage;
pub use section::{DEFAULT_LINEAGE_KEEP, RedisSection};
pub use sink::{MAX_SCRIPT_ARGUMENTS, RedisSink, open, open_with};
pub use state::RedisStateStore;
pub use store::RedisModuleStore;

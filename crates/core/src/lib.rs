//! `sluice-core`: the types and traits every other sluice crate shares, and
//! nothing that talks to the outside world.
//!
//! - [`config`]: the pipeline TOML, parsed and validated (no I/O beyond the
//!   file); each sink kind's own fields are read by its crate through
//!   [`config::KindSection`].
//! - [`backoff`]: the one retry policy (waits, and when to give up).
//! - [`batch`]: plans, offset ranges and the columnar record batch.
//! - [`output`]: a batch's output rows, contract checks, the output digest.
//! - [`contract`]: the output contract every sink kind checks rows against.
//! - [`error`]: causes kept as sources, and errors written with them.
//! - [`limits`]: the sandbox limits and the settings a result depends on.
//! - [`cursor`]: where each owned partition stands, and the ranges cut from it.
//! - [`source`], [`transform`], [`sink`], [`versions`]: the traits the batch
//!   loop consumes and the errors it acts on.
//! - [`state`]: keyed state: a batch's writes and reads, a run's view.
//! - [`event_time`]: watermarks, timers and late records, kept as state.
//! - [`store`]: the state store traits (module store, lineage reader).
//! - [`dead_letters`]: stored dead letters, listing and redriving them.
//! - [`reset`]: what `sluice reset` moves and reports, whatever the sink.
//!
//! It must not depend on wasmtime, rdkafka, sqlx or axum: the backends
//! depend on it, never the other way round.

pub mod backoff;
pub mod batch;
pub mod config;
pub mod contract;
pub mod cursor;
pub mod dead_letters;
pub mod error;
pub mod event_time;
pub mod limits;
pub mod output;
mod read_buffer;
pub mod reset;
pub mod sink;
pub mod source;
pub mod state;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transform;
pub mod versions;

//! sluice: exactly-once Kafka stream processing with sandboxed, deterministic
//! WebAssembly transforms.
//!
//! A pipeline reads planned offset ranges from Kafka, runs each batch through
//! a fresh instance of the user's Wasm component, and commits the outputs
//! together with the offset move into the sink. `docs/ARCHITECTURE.md`
//! explains the three conditions of exactly-once, the batch lifecycle and
//! the crates.
//!
//! This crate is where the backends meet: the `sluice` binary and the
//! library the integration tests drive. It re-exports the workspace's crates
//! under one name each and owns what needs several of them:
//!
//! - [`app`]: wiring a config into a running pipeline (used by the CLI).
//! - [`backends`]: the one place a sink kind picks its backends (sink,
//!   state store, module store, lineage and dead-letter readers).
//! - [`replay`]: `verify` and `shadow`, re-running committed batches
//!   (lineage, Kafka and the runtime), read-only.
//! - [`plugin_build`]: `sluice new` and `sluice build`, plugin projects
//!   in each guest language.
//! - [`plugin_test`]: `sluice test`, a module run on sample records with
//!   no broker and no sink.
//! - [`redrive`]: listing dead letters and redriving them through the
//!   active version, exactly once.
//! - [`reset`]: reprocessing on purpose: moving checkpoints to an offset,
//!   time, log start or end.
//! - [`state_view`]: keyed state shown to a user (`sluice test`, `sluice
//!   state`).
//! - [`sample`]: the JSON-lines record format of samples, `sluice
//!   produce`/`consume` and `dead-letters show --sample`.
//! - [`topic_io`]: `sluice produce` and `sluice consume`, samples into a
//!   topic and back.
//!
//! Re-exported: [`batch`], [`config`], [`output`], [`limits`], [`store`]
//! (`sluice-core`); [`pipeline`] (`sluice-pipeline`, the batch loop);
//! [`runtime`] (`sluice-runtime`); [`kafka_source`] (`sluice-kafka-source`); [`sink`]
//! (the core's sink contract, the SQL backends of `sluice-sql`, the
//! Redis one of `sluice-redis`, the stdout one of `sluice-stdout` and the
//! Kafka one of `sluice-kafka-sink`);
//! [`control`] (`sluice-control`).

pub mod app;
pub mod backends;
#[cfg(test)]
mod config_reference;
pub mod plugin_build;
pub mod plugin_test;
pub mod redrive;
pub mod replay;
pub mod reset;
pub mod sample;
pub mod state_view;
pub mod topic_io;

pub use sluice_control as control;
pub use sluice_core::{batch, config, limits, output, state, store, transform};
pub use sluice_kafka_source as kafka_source;
pub use sluice_pipeline as pipeline;
pub use sluice_runtime as runtime;

/// The sink contract (`sluice-core`) and the backends (`sluice-sql`,
/// `sluice-redis`, `sluice-stdout`, `sluice-kafka-sink`).
pub mod sink {
    pub use sluice_core::sink::*;
    pub use sluice_kafka_sink as kafka;
    pub use sluice_redis as redis;
    pub use sluice_sql as sql;
    pub use sluice_sql::{mysql, postgres, sqlite};
    pub use sluice_stdout as stdout;
}

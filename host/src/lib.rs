//! sluice: exactly-once Kafka stream processing with sandboxed, deterministic
//! WebAssembly transforms.
//!
//! A pipeline reads planned offset ranges from Kafka, runs each batch through
//! a fresh instance of the user's Wasm component, and commits the outputs
//! together with the offset move into the sink. `docs/ARCHITECTURE.md`
//! explains the three conditions of exactly-once and the batch lifecycle.
//!
//! # Layout
//!
//! - [`config`]: the pipeline TOML, parsed and validated (no I/O beyond the file).
//! - [`batch`]: plans, offset ranges and the columnar record batch.
//! - [`output`]: a batch's output rows, contract checks, the output digest.
//! - [`source`]: the Kafka source: group (or static) ownership, seeking to checkpoints,
//!   reading and cutting ranges by consumer position.
//! - [`runtime`]: the wasmtime engine, module loading/validation/cache, the
//!   per-batch sandbox (fuel, deadline, memory cap).
//! - [`sink`]: commit requests and errors shared by backends, the sink kind a
//!   URL names. `sink::sql` holds what the SQL backends share (the batch
//!   transaction with the offset compare-and-set, sluice's own tables,
//!   dialects, target checks); `sink::sqlite` (the embedded default),
//!   `sink::postgres` and `sink::mysql` hold one dialect's connections, error
//!   kinds and bulk row path each.
//! - [`pipeline`]: the batch loop (plan, read, transform, commit; the next
//!   batch prepared while one commits), the `Sink`, `Transform` and
//!   `Versions` traits it consumes, retries, bisection, the status board.
//! - [`modules`]: modules over time: the module store (components by
//!   sha256, activations per pipeline) in the sink's database, upload
//!   validation, following the active version between batches.
//! - [`control`]: the control plane's HTTP API (axum, bearer token on
//!   writes, OpenAPI) and the client the CLI uses.
//! - [`replay`]: re-running committed batches from their lineage: `verify`
//!   (recorded version, output digests compared) and `shadow` (a candidate
//!   version, output diffed), read-only.
//! - [`reset`]: reprocessing on purpose: moving a pipeline's checkpoints to
//!   an offset, time, log start or end (`sink::sql::reset` moves them, with
//!   the lineage the move makes stale).
//! - [`app`]: wiring a config into a running pipeline (used by the CLI).

pub mod app;
pub mod batch;
pub mod config;
pub mod control;
pub mod modules;
pub mod output;
pub mod pipeline;
pub mod replay;
pub mod reset;
pub mod runtime;
pub mod sink;
pub mod source;

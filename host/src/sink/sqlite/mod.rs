//! The SQLite sink, sluice's embedded default.
//!
//! # Delivery guarantee
//!
//! Exactly-once. Each batch is one SQLite transaction (`BEGIN IMMEDIATE`)
//! holding the target rows, the dead letters, the lineage rows and the offset
//! move `from -> until` per partition, done as a compare-and-set on the
//! checkpoint row. Zero rows moved means another owner committed first: the
//! transaction is rolled back and the pipeline re-plans. This depends on
//! (1) the source replaying the same records for the same range (Kafka,
//! `read_committed`), (2) the module being deterministic, and (3) SQLite's
//! atomic commit with `synchronous=FULL` in WAL mode.

mod config;
mod sink;
#[cfg(test)]
mod tests;

pub use config::SqliteConfig;
pub use sink::SqliteSink;

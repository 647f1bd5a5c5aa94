//! The SQLite sink, sluice's embedded default.
//!
//! # Delivery guarantee
//!
//! Exactly-once, by the shared SQL batch transaction (see the crate root, `lib.rs`),
//! here one `BEGIN IMMEDIATE` transaction per batch. It depends on (1) the
//! source replaying the same records for the same range (Kafka,
//! `read_committed`), (2) the module being deterministic, and (3) SQLite's
//! atomic commit with `synchronous=FULL` in WAL mode.

mod config;
mod sink;
#[cfg(test)]
mod tests;

pub use config::SqliteConfig;
pub use sink::{SqliteBackend, SqliteSink, open, open_with};

//! The MySQL / MariaDB sink.
//!
//! # Delivery guarantee
//!
//! Exactly-once, by the shared SQL batch transaction (see the crate root, `lib.rs`): one
//! InnoDB transaction per batch holds the rows, the dead letters, the
//! lineage and the offset compare-and-set (`UPDATE ... WHERE next_offset =
//! from` is a locking read, so two owners serialize on the checkpoint row
//! and the second is fenced). A lost reply to `COMMIT` is resolved by
//! reading the checkpoint back. It depends on (1) the source replaying the
//! same records for the same range (Kafka, `read_committed`), (2) the module
//! being deterministic, and (3) InnoDB's durable commit
//! (`innodb_flush_log_at_trx_commit = 1`, the default). Target tables must be
//! InnoDB: a MyISAM table would keep rows of a rolled-back batch.

mod config;
mod sink;
#[cfg(test)]
mod tests;

pub use sink::{MysqlBackend, MysqlSink, open, open_with};

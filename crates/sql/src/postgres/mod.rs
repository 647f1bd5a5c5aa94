//! The Postgres sink.
//!
//! # Delivery guarantee
//!
//! Exactly-once, by the shared SQL batch transaction (see the crate root, `lib.rs`): one
//! transaction per batch holds the rows, the dead letters, the lineage and
//! the offset compare-and-set. Two owners of one partition serialize on the
//! checkpoint row's lock; the second finds the offset moved and is fenced.
//! A frozen owner's transaction ends after `sink.lock_timeout_ms`: idle in
//! it, by the server's timeout; inside a COPY, by the owner it blocks
//! (`stalled.rs`); either way it rolls back and its batch is re-planned.
//! A lost reply to `COMMIT` is resolved by reading the checkpoint back. It
//! depends on (1) the source replaying the same records for the same range
//! (Kafka, `read_committed`), (2) the module being deterministic, and (3)
//! Postgres's durable commit (`synchronous_commit` on, the default).

mod config;
mod sink;
mod stalled;
#[cfg(test)]
mod tests;

pub use sink::{PostgresBackend, PostgresSink, open, open_with};

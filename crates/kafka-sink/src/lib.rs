//! `sluice-kafka-sink`: the Kafka sink. Each batch's records (routed to
//! their targets' topics), dead letters (to a dead-letter topic), lineage
//! entry (to a lineage topic) and input offsets (in the pipeline's consumer
//! group) are one producer transaction; see [`sink`] for the guarantee and
//! how owners are fenced. A stateful module's keyed state goes in the same
//! transaction to a changelog topic ([`changelog`]) and is restored from
//! there ([`state`]). Lineage is read back from its topic by
//! [`lineage`], for `verify` and `shadow`, dead letters from theirs by
//! `dead_letters`, for `sluice dead-letters list|show`, and redriven by
//! `redrive` (a position in the dead-letter topic moved in the redrive's
//! transaction); modules and activations live in
//! the pipeline's `[state]` store, like the stdout sink's. [`reset`] moves
//! the group's committed offsets on purpose, fenced like a batch. Under
//! `guarantee = "at-least-once"`, [`at_least_once`] sends records without a
//! transaction and commits offsets and lineage in `[state]` afterwards.
//!
//! It must not depend on another sink or on the Kafka source: the source
//! never commits group offsets; this sink is the one place that does.

mod at_least_once;
mod broker_errors;
mod changelog;
mod client;
mod dead_letters;
mod lineage;
mod records;
mod redrive;
pub mod reset;
pub mod section;
mod sink;
mod state;
pub mod to_end;

pub use at_least_once::{KafkaAtLeastOnce, KafkaProducer};
pub use client::brokers_of;
pub use dead_letters::KafkaDeadLetters;
pub use lineage::KafkaLineage;
pub use section::KafkaSection;
pub use sink::KafkaSink;
pub use state::KafkaStateStore;

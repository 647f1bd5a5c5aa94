//! `sluice-kafka-sink`: the Kafka sink. Each batch's records (routed to
//! their targets' topics), dead letters (to a dead-letter topic), lineage
//! entry (to a lineage topic) and input offsets (in the pipeline's consumer
//! group) are one producer transaction; see [`sink`] for the guarantee and
//! how owners are fenced. Lineage is read back from its topic by
//! [`lineage`], for `verify` and `shadow`; modules and activations live in
//! the pipeline's `[state]` store, like the stdout sink's.
//!
//! It must not depend on another sink or on the Kafka source: the source
//! never commits group offsets; this sink is the one place that does.

mod lineage;
mod records;
mod sink;

pub use lineage::KafkaLineage;
pub use records::OutRecord;
pub use sink::{KafkaSink, brokers_of};

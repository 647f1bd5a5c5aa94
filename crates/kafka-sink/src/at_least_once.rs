//! The Kafka sink without transactions (`guarantee = "at-least-once"`):
//! records first, then offsets in the state store.
//!
//! # Delivery guarantee
//!
//! At-least-once. A batch's records and dead letters are sent by an
//! idempotent producer (no duplicates from its own retries, order per
//! partition kept) and flushed: every one acknowledged by all in-sync
//! replicas. Only then do the batch's offsets, lineage and dead letters
//! commit in the state store (`[state]`, with the same compare-and-set as
//! every sink, so a second instance is fenced from moving them). A crash
//! or failed delivery between the two sends that batch again: readers may
//! see a batch's records twice, never miss one. Readers see records at
//! once, with no transaction to wait for, which is what this mode trades
//! the guarantee for (and what the exactly-once sink is measured against).
//! A stateful module's keyed state commits in the state store with the
//! offsets, so state is exactly once even though records are not: a batch
//! sent again was run again from the same state.
//!
//! It must not read input or decide ranges, and it never imports another
//! sink: the state store comes in as a trait.

use crate::broker_errors::BrokerErrors;
use crate::client::{BROKER_TIMEOUT, Cluster, check_topics, send, wait_delivered};
use crate::records::BatchLayout;
use crate::section::KafkaSection;
use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};
use sluice_core::batch::TopicPartition;
use sluice_core::config::{KindSection, PipelineConfig};
use sluice_core::sink::{Commit, CommitOutcome, Sink, SinkError, commit_all_but_rows};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Remembers the first delivery that failed since it was last asked, and
/// librdkafka's last error.
#[derive(Default)]
pub struct Deliveries {
    failed: Mutex<Option<KafkaError>>,
    errors: BrokerErrors,
}

impl Deliveries {
    fn take_failure(&self) -> Option<KafkaError> {
        self.failed.lock().expect("deliveries lock").take()
    }
}

impl ClientContext for Deliveries {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.errors.log(level, facility, message)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.error(error, reason)
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed
                .lock()
                .expect("deliveries lock")
                .get_or_insert_with(|| e.clone());
        }
    }
}

/// The sending half of an at-least-once Kafka sink: an idempotent producer
/// and the batch layout, checked against the brokers.
pub struct KafkaProducer {
    cluster: Cluster,
    layout: BatchLayout,
    producer: ThreadedProducer<Deliveries>,
    /// One batch at a time owns the producer's delivery report.
    sending: Mutex<()>,
}

impl KafkaProducer {
    /// Connects to the brokers of `config.sink.url` and checks every topic
    /// it writes (targets and dead letters) exists.
    pub fn open(config: &PipelineConfig) -> Result<KafkaProducer, SinkError> {
        let cluster = Cluster::of(config)?;
        let producer: ThreadedProducer<Deliveries> = cluster
            .producer()
            .set("enable.idempotence", "true")
            .create_with_context(Deliveries::default())
            .map_err(|e| SinkError::Config(format!("Kafka producer: {e}")))?;
        let sink = KafkaProducer {
            cluster,
            layout: BatchLayout::new(
                &config.sink.targets,
                KafkaSection::sink(&config.sink)?.dead_letter_topic(&config.pipeline),
            )?,
            producer,
            sending: Mutex::new(()),
        };
        // The producer's own thread serves the queue librdkafka reports
        // errors on: waiting is all it takes.
        let serve = || std::thread::sleep(Duration::from_millis(50));
        let errors = &sink.producer.context().errors;
        check_topics(
            sink.producer.client(),
            &sink.cluster.brokers,
            &sink.layout.topics(),
            None,
            |e| errors.unavailable(&sink.cluster.brokers, e, serve),
        )?;
        Ok(sink)
    }

    /// The sink that keeps its checkpoints and lineage in `state`.
    pub fn over<S: Sink>(self, state: S) -> KafkaAtLeastOnce<S> {
        KafkaAtLeastOnce {
            producer: self,
            state,
        }
    }

    /// Sends the batch's records and dead letters and waits until every
    /// one is acknowledged (or one failed: the batch is then sent again).
    fn deliver(&self, c: &Commit<'_>) -> Result<(), SinkError> {
        let records = self.layout.records(c, None)?;
        let _only_batch = self.sending.lock().expect("sending lock");
        // A failure left over from a batch that was given up on.
        self.producer.context().take_failure();
        records.send_each(|r| {
            send(&self.producer, r).map_err(|e| self.failed(format!("producing to {}", r.topic), e))
        })?;
        wait_delivered(&self.producer, BROKER_TIMEOUT).map_err(|e| {
            self.failed(
                "waiting for the batch's records to be acknowledged".into(),
                e,
            )
        })?;
        match self.producer.context().take_failure() {
            Some(e) => Err(self.failed("delivering the batch's records".into(), e)),
            None => Ok(()),
        }
    }

    /// A failed send: fatal if the producer says it can produce no more
    /// (the pipeline stops with its cause), else retriable (the batch is
    /// sent again, so its records may appear twice).
    fn failed(&self, what: String, e: KafkaError) -> SinkError {
        match self.producer.client().fatal_error() {
            Some((code, reason)) => SinkError::database(
                format!("{what}: the producer failed fatally ({code:?}: {reason})"),
                e,
            ),
            None => SinkError::unavailable(what, e),
        }
    }
}

/// Sends each batch's records, then commits its offsets, lineage and dead
/// letters in the state store `S`.
pub struct KafkaAtLeastOnce<S> {
    producer: KafkaProducer,
    state: S,
}

impl<S: Sink> Sink for KafkaAtLeastOnce<S> {
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        self.state.checkpoints(pipeline, partitions).await
    }

    async fn commit(&self, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        tokio::task::block_in_place(|| self.producer.deliver(c))?;
        commit_all_but_rows(&self.state, c).await
    }

    /// Keyed state lives in the state store, committed there with the
    /// offsets (records are sent before, at least once).
    fn state_store(&self) -> Option<std::sync::Arc<dyn sluice_core::state::StateStore>> {
        self.state.state_store()
    }
}

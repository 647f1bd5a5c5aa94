//! Partition ownership through the consumer-group protocol.
//!
//! Owns the rebalance callbacks: it records assignments and revocations for
//! the source to act on, and pauses newly assigned partitions so nothing is
//! fetched until the pipeline has read their checkpoint and seeked. It must
//! not block: callbacks run inside librdkafka's poll.

use crate::batch::TopicPartition;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnershipEvent {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

#[derive(Default)]
pub struct OwnershipContext {
    events: Mutex<Vec<OwnershipEvent>>,
}

impl OwnershipContext {
    pub fn take_events(&self) -> Vec<OwnershipEvent> {
        std::mem::take(&mut *self.events.lock().expect("not poisoned"))
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| TopicPartition {
            topic: e.topic().to_string(),
            partition: e.partition(),
        })
        .collect()
}

/// Takes `assign` (topic -> partitions) without the group, like a group
/// assignment: paused at the log start until the checkpoint is known.
pub fn assign_statically(
    consumer: &BaseConsumer<OwnershipContext>,
    assign: &std::collections::BTreeMap<String, Vec<i32>>,
) -> rdkafka::error::KafkaResult<()> {
    let mut tpl = TopicPartitionList::new();
    for (topic, partitions) in assign {
        for &p in partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl)?;
    tracing::info!(partitions = ?partitions(&tpl), "static assignment (no consumer group)");
    consumer
        .context()
        .post_rebalance(consumer, &Rebalance::Assign(&tpl));
    Ok(())
}

impl ClientContext for OwnershipContext {}

impl ConsumerContext for OwnershipContext {
    /// The default strategy, except that assigned partitions start at a
    /// concrete position (the log start) instead of the group's committed
    /// offset: sluice never commits group offsets, and with
    /// `auto.offset.reset=error` a missing one would be an error. Nothing is
    /// read from there: the partitions are paused right away and seeked to
    /// the sink's checkpoint before they resume.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                if let Err(e) = tpl.set_all_offsets(Offset::Beginning) {
                    tracing::warn!("cannot set start offsets: {e}");
                }
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = result {
                    tracing::error!("cannot take assigned partitions: {e}");
                }
                self.post_rebalance(consumer, &Rebalance::Assign(tpl));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.pre_rebalance(consumer, &Rebalance::Revoke(tpl));
                let result = if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
                if let Err(e) = result {
                    tracing::error!("cannot release revoked partitions: {e}");
                }
            }
            other => tracing::warn!("rebalance error: {other:?}"),
        }
    }

    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let lost = partitions(tpl);
            tracing::info!(partitions = ?lost, "partitions revoked");
            self.events
                .lock()
                .expect("not poisoned")
                .push(OwnershipEvent::Revoked(lost));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                // Hold fetching until the checkpoint is known and we seek.
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!("cannot pause newly assigned partitions: {e}");
                }
                let got = partitions(tpl);
                tracing::info!(partitions = ?got, "partitions assigned");
                self.events
                    .lock()
                    .expect("not poisoned")
                    .push(OwnershipEvent::Assigned(got));
            }
            Rebalance::Error(e) => tracing::warn!("rebalance error: {e}"),
            Rebalance::Revoke(_) => {}
        }
    }
}

//! How a stopping instance departs the consumer group.
//!
//! Owns the consumer's end: closed (LeaveGroup, the others take its
//! partitions at once) or destroyed without a close (the broker notices
//! after the session timeout, as for a crash; or, statically assigned,
//! with no membership to end). It must not decide which: the config does
//! (`source.leave_group_on_shutdown`, `source.assign`).

use crate::ownership::OwnershipContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::mem::ManuallyDrop;
use std::ops::Deref;

/// What the consumer does to the group when the source is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Close: leave the group (a dynamic member sends LeaveGroup).
    Leave,
    /// Destroy without a close: no LeaveGroup; the member expires after
    /// `session.timeout.ms`.
    Expire,
    /// Statically assigned (`source.assign`): no member to leave, so
    /// destroyed without a close (a close waits out a poll for an answer
    /// no group sends).
    NoMember,
}

/// The source's consumer, departing the group as it was told when dropped.
pub struct GroupConsumer {
    consumer: ManuallyDrop<BaseConsumer<OwnershipContext>>,
    departure: Departure,
}

impl GroupConsumer {
    pub fn new(consumer: BaseConsumer<OwnershipContext>, departure: Departure) -> GroupConsumer {
        GroupConsumer {
            consumer: ManuallyDrop::new(consumer),
            departure,
        }
    }
}

impl Deref for GroupConsumer {
    type Target = BaseConsumer<OwnershipContext>;

    fn deref(&self) -> &Self::Target {
        &self.consumer
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        match self.departure {
            // SAFETY: dropped once, here, and never used again.
            Departure::Leave => unsafe { ManuallyDrop::drop(&mut self.consumer) },
            Departure::Expire | Departure::NoMember => {
                if self.departure == Departure::Expire {
                    tracing::info!(
                        "leaving the consumer group to expire this member (no LeaveGroup)"
                    );
                }
                // SAFETY: the handle is valid (owned by the consumer, not
                // destroyed yet) and this is not a librdkafka callback.
                // librdkafka frees it here, so the Rust wrapper (its
                // context, queue and client, a few hundred bytes) is
                // leaked, never dropped: nothing touches the handle again.
                unsafe {
                    rdkafka::bindings::rd_kafka_destroy_flags(
                        self.consumer.client().native_ptr(),
                        rdkafka::bindings::RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE,
                    );
                }
            }
        }
    }
}

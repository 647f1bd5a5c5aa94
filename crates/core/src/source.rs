//! The source contract as the batch loop sees it: the `Source` trait
//! (implemented by the Kafka source), its errors and the progress it
//! reports. The offsets a source has read are kept in its [`Cursors`].
//!
//! A source owns partitions, reads them from the offsets the loop says (the
//! sink's checkpoints) and cuts ranges `[from, until)` out of what it has
//! read. It must never decide a starting offset itself, and a range must
//! always name the same records (condition 1 of exactly-once).

use crate::batch::{OffsetRange, Records, TopicPartition};
use crate::cursor::Cursors;
use crate::error::{Cause, prefixed};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// What the batch loop reads from. Methods that wait run on a blocking
/// thread, hence `Send + 'static`; none of them is async.
///
/// A source reads and follows ownership; what it has read, and the ranges
/// cut from it, are kept in its [`Cursors`], so the offset bookkeeping the
/// loop relies on is the same for every source.
pub trait Source: Send + 'static {
    /// Reads for up to `wait`, buffering what it reads and following
    /// ownership changes. It ends sooner once `signals.interrupt` is set,
    /// and, once `signals.cut_at_end` is set, as soon as something waits to
    /// be batched and every started partition has been read to its log
    /// end; at once if the loop stops when caught up and it is, or if an
    /// owned partition waits to be started (`start_partitions`).
    fn poll(&mut self, wait: Duration, signals: &PollSignals) -> Result<(), SourceError>;
    /// Keeps ownership alive until `done` fires (or its sender is gone)
    /// while the loop waits on the sink; errors met meanwhile are reported
    /// by the next `poll`.
    fn hold(&mut self, done: &Receiver<()>);
    /// Starts reading each partition at its checkpoint (`None`: never
    /// committed, start as configured).
    fn start_partitions(
        &mut self,
        starts: &[(TopicPartition, Option<i64>)],
    ) -> Result<(), SourceError>;
    /// Where each owned partition stands.
    fn progress(&self) -> Vec<PartitionProgress>;
    /// The owned partitions' cursors.
    fn cursors(&self) -> &Cursors;
    fn cursors_mut(&mut self) -> &mut Cursors;

    /// True once ownership was settled at least once (possibly to nothing).
    fn assigned_once(&self) -> bool {
        self.cursors().assigned_once()
    }
    /// Owned partitions that have not been told where to start.
    fn unstarted(&self) -> Vec<TopicPartition> {
        self.cursors().unstarted()
    }
    /// The ranges of the next batch: for every started partition with
    /// something read, `[next, position)` (capped).
    fn plan_ranges(&self) -> Vec<OffsetRange> {
        self.cursors().plan_ranges()
    }
    /// The records of `ranges`, from what was read.
    fn records(&self, ranges: &[OffsetRange]) -> Records {
        self.cursors().records(ranges)
    }
    /// The ranges are committed (or about to be): the next ones start at
    /// their `until`, and their records leave the buffers.
    fn committed(&mut self, ranges: &[OffsetRange]) {
        self.cursors_mut().committed(ranges)
    }
    /// True once every owned partition has been planned up to the log end
    /// seen when it was first reached.
    fn caught_up(&self) -> bool {
        self.cursors().caught_up()
    }
}

/// What may end a [`Source::poll`] before its wait is up. The loop sets
/// them from another thread while the poll runs.
#[derive(Debug, Default)]
pub struct PollSignals {
    /// End the poll now: another version became active.
    interrupt: AtomicBool,
    /// Nothing else holds the next batch back (no commit is in flight), so
    /// a batch whose partitions are all read to their log end is cut at
    /// once: waiting out the interval could only add latency, never
    /// records.
    cut_at_end: AtomicBool,
    /// The loop stops once caught up (`--until-caught-up`): a caught-up
    /// source has nothing to wait for.
    until_caught_up: bool,
}

impl PollSignals {
    pub fn new(until_caught_up: bool) -> PollSignals {
        PollSignals {
            until_caught_up,
            ..PollSignals::default()
        }
    }

    pub fn interrupt(&self) {
        self.interrupt.store(true, Ordering::Relaxed);
    }

    pub fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }

    /// From now on a batch read to the log end need not wait.
    pub fn cut_at_end(&self) {
        self.cut_at_end.store(true, Ordering::Relaxed);
    }

    pub fn cuts_at_end(&self) -> bool {
        self.cut_at_end.load(Ordering::Relaxed)
    }

    pub fn until_caught_up(&self) -> bool {
        self.until_caught_up
    }
}

/// Why the source failed. Callers act on the variant.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The brokers could not be reached (at start, or for too long).
    #[error("cannot reach Kafka brokers at {brokers}")]
    Unreachable {
        brokers: String,
        #[source]
        cause: Cause,
    },
    /// A configured topic does not exist.
    #[error("topic `{0}` does not exist")]
    UnknownTopic(String),
    /// A planned offset is not in the log any more (retention, DeleteRecords)
    /// or not yet/any more (topic deleted and re-created). Fatal: sluice never
    /// skips or shrinks a batch silently.
    #[error(
        "partition {partition}: checkpoint offset {from} is {what} (log holds offsets {low}..{high}); \
         records were deleted or the topic was re-created, refusing to skip"
    )]
    OutOfRange {
        partition: String,
        from: i64,
        low: i64,
        high: i64,
        what: &'static str,
    },
    /// Any other Kafka error.
    #[error("kafka{}", prefixed(.context))]
    Kafka {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl SourceError {
    /// The brokers at `brokers` could not be reached, because of `cause`.
    pub fn unreachable(brokers: impl Into<String>, cause: impl Into<Cause>) -> Self {
        SourceError::Unreachable {
            brokers: brokers.into(),
            cause: cause.into(),
        }
    }

    /// Kafka failed `what` (may be empty), because of `cause`.
    pub fn kafka(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        SourceError::Kafka {
            context: what.into(),
            cause: Some(cause.into()),
        }
    }

    /// Kafka failed, as sluice itself says.
    pub fn kafka_says(message: impl Into<String>) -> Self {
        SourceError::Kafka {
            context: message.into(),
            cause: None,
        }
    }
}

/// Where an owned partition stands (for status and lag).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionProgress {
    pub topic: String,
    pub partition: i32,
    /// Start of the next range (the committed checkpoint); `None` until the
    /// partition has started.
    pub next_offset: Option<i64>,
    /// The log end as last fetched.
    pub log_end: Option<i64>,
}

//! The Kafka source (`sluice-kafka-source`): owns partitions through the consumer group, reads them
//! from the offsets the pipeline says (the sink's checkpoints), and cuts
//! offset ranges `[from, until)` out of what it has read.
//!
//! Owns the librdkafka consumer and its rebalance callbacks: the librdkafka
//! work only. What it reads goes into the core's partition cursors
//! (`sluice_core::cursor`), which keep the offsets and cut the ranges. It
//! must never commit consumer-group offsets and never decide a starting
//! offset itself: `from` always comes from the caller.
//!
//! `until` never passes the last stable offset, because a `read_committed`
//! consumer never does, and a range ends by consumer position (markers and
//! aborted records included).

mod departure;
mod ownership;
mod positions;
mod replay;

pub use positions::{LogPositions, ResetTo};
pub use replay::RangeReader;

use sluice_core::{batch, config};

use crate::batch::{Records, TopicPartition};
use crate::config::{SourceConfig, StartPosition};
use departure::{Departure, GroupConsumer};
use ownership::{OwnershipContext, OwnershipEvent};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_core::cursor::{Caps, Cursors, Read};
pub use sluice_core::source::{PartitionProgress, PollSignals, Source, SourceError};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a broker may take to answer metadata, seek and watermark calls.
const BROKER_TIMEOUT: Duration = Duration::from_secs(15);
/// Partitions whose log bounds a start asks the broker for side by side
/// (a thread each, for the round trip).
const WATERMARK_QUERIES_AT_ONCE: usize = 16;

/// Messages taken from librdkafka's queue between two looks at the clock.
const DRAIN_PER_CLOCK_CHECK: usize = 256;

/// How long a checkpoint must stay beyond the cached log end before it is
/// an error. The cache is only refreshed by fetch responses, so for a
/// partition that comes back to this instance it may still hold the log end
/// of when it was last fetched here; fetches (long polls of at most
/// `fetch.wait.max.ms`, at most 100 ms by default) refresh it well within
/// this.
const BEYOND_END_CONFIRM: Duration = Duration::from_secs(3);

/// How long [`KafkaSource::hold`] waits before pausing the partitions (a
/// commit usually ends well before), and how long each of its polls takes.
const HOLD_AFTER: Duration = Duration::from_secs(1);
const HOLD_POLL: Duration = Duration::from_millis(100);

pub struct KafkaSource {
    consumer: GroupConsumer,
    brokers: String,
    start: StartPosition,
    /// Where each owned partition stands.
    cursors: Cursors,
    /// Since when the cached log end has been below a waiting partition's
    /// checkpoint (see [`BEYOND_END_CONFIRM`]).
    beyond_end_since: BTreeMap<TopicPartition, Instant>,
    /// An error met while holding (see [`KafkaSource::hold`]), reported by
    /// the next poll.
    held_error: Option<SourceError>,
    /// The partition of the message read last: a run of one partition's
    /// messages (what a fetch hands over) is buffered without building
    /// its name again for every message.
    last_read: Option<TopicPartition>,
}

impl KafkaSource {
    /// Connects, checks the topics exist and joins the consumer group.
    pub fn connect(config: &SourceConfig, group_id: &str) -> Result<KafkaSource, SourceError> {
        let client = client_config(config, group_id);
        let consumer: BaseConsumer<OwnershipContext> = client
            .create_with_context(OwnershipContext::default())
            .map_err(|e| SourceError::kafka("", e))?;
        let unreachable = |e: KafkaError| SourceError::unreachable(config.brokers.clone(), e);
        let metadata = consumer
            .fetch_metadata(None, BROKER_TIMEOUT)
            .map_err(unreachable)?;
        for topic in &config.topics {
            let known = metadata.topics().iter().find(|t| t.name() == topic);
            if known.is_none_or(|t| t.partitions().is_empty()) {
                return Err(SourceError::UnknownTopic(topic.clone()));
            }
        }
        match &config.assign {
            Some(assign) => ownership::assign_statically(&consumer, assign)
                .map_err(|e| SourceError::kafka("", e))?,
            None => {
                let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
                consumer
                    .subscribe(&topics)
                    .map_err(|e| SourceError::kafka("", e))?;
            }
        }
        let departure = match (&config.assign, config.leave_group_on_shutdown) {
            (Some(_), _) => Departure::NoMember,
            (None, true) => Departure::Leave,
            (None, false) => Departure::Expire,
        };
        Ok(KafkaSource {
            consumer: GroupConsumer::new(consumer, departure),
            brokers: config.brokers.clone(),
            start: config.start,
            cursors: Cursors::new(Caps {
                per_partition: config.max_records_per_partition.get() as i64,
                per_batch: config.max_records_per_batch.map(|cap| cap.get() as i64),
            }),
            beyond_end_since: BTreeMap::new(),
            held_error: None,
            last_read: None,
        })
    }

    /// The partitions that have started (been seeked to a checkpoint).
    fn started_list(&self) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for (tp, _) in self.cursors.started() {
            list.add_partition(&tp.topic, tp.partition);
        }
        list
    }

    /// Applies assignments and revocations from the rebalance callbacks;
    /// true if there were any.
    fn apply_ownership_events(&mut self) -> bool {
        let events = self.consumer.context().take_events();
        for event in &events {
            match event {
                OwnershipEvent::Assigned(tps) => self.cursors.assign(tps.iter().cloned()),
                OwnershipEvent::Revoked(tps) => self.cursors.revoke(tps),
            }
        }
        !events.is_empty()
    }

    fn on_error(&self, e: KafkaError) -> Result<(), SourceError> {
        if let KafkaError::MessageConsumption(code) | KafkaError::MessageConsumptionFatal(code) = &e
            && *code == rdkafka::types::RDKafkaErrorCode::AutoOffsetReset
        {
            return Err(self.out_of_range_error(&e));
        }
        if let KafkaError::MessageConsumptionFatal(_) = e {
            return Err(SourceError::kafka("", e));
        }
        tracing::warn!("kafka consumer: {e}");
        Ok(())
    }

    /// Names the partition(s) whose planned offset the broker refused.
    fn out_of_range_error(&self, e: &KafkaError) -> SourceError {
        for (tp, cursor) in self.cursors.started() {
            let from = cursor.next().expect("started");
            if let Some(err) = self.range_violation(tp, from) {
                return err;
            }
        }
        SourceError::kafka("broker refused a planned offset", e.clone())
    }

    /// Checks `from` against the log's bounds; `Some` if it lies outside.
    fn range_violation(&self, tp: &TopicPartition, from: i64) -> Option<SourceError> {
        let (low, high) = self.watermarks(tp)?;
        let what = if from < low {
            "below the log start"
        } else if from > high {
            "beyond the log end"
        } else {
            return None;
        };
        Some(SourceError::OutOfRange {
            partition: tp.to_string(),
            from,
            low,
            high,
            what,
        })
    }

    /// The log start and end as the last fetch response reported them (right
    /// on every broker), or, before any fetch, as ListOffsets reports them.
    fn watermarks(&self, tp: &TopicPartition) -> Option<(i64, i64)> {
        if let Some(w) = cached_watermarks(&*self.consumer, tp) {
            return Some(w);
        }
        self.consumer
            .fetch_watermarks(&tp.topic, tp.partition, BROKER_TIMEOUT)
            .ok()
    }

    /// True if something waits to be batched and every started partition
    /// has been read up to the log end its last fetch reported: waiting
    /// longer could not add a record to the batch, only latency. A
    /// partition with an open transaction stops short of the log end (at
    /// the last stable offset), so it waits out the interval as before.
    fn read_to_end(&mut self) -> Result<bool, SourceError> {
        if !self.cursors.started().any(|(_, c)| c.has_buffered()) {
            return Ok(false);
        }
        // Moves the positions past transaction markers at the end.
        self.refresh_positions()?;
        Ok(self.cursors.started().all(|(tp, c)| {
            cached_watermarks(&*self.consumer, tp).is_some_and(|(_, high)| c.position() >= high)
        }))
    }

    /// Folds in the consumer's position, which also moves past transaction
    /// markers and aborted records that never reach us as messages.
    fn refresh_positions(&mut self) -> Result<(), SourceError> {
        let active: Vec<TopicPartition> =
            self.cursors.started().map(|(tp, _)| tp.clone()).collect();
        if active.is_empty() {
            return Ok(());
        }
        let positions = self
            .consumer
            .position()
            .map_err(|e| SourceError::kafka("", e))?;
        for tp in &active {
            let reported = positions
                .find_partition(&tp.topic, tp.partition)
                .and_then(|e| e.offset().to_raw())
                .filter(|&o| o >= 0);
            if let Some(p) = reported {
                self.cursors.advance(tp, p);
            }
            let Some((low, high)) = cached_watermarks(&*self.consumer, tp) else {
                continue;
            };
            let idle_at = self.cursors.get(tp).and_then(|c| c.idle_at());
            // A stale cache can only understate the log start, so below it
            // is certain; beyond the end must hold for a while.
            let beyond = idle_at.is_some_and(|from| from > high);
            let confirmed_beyond = match beyond {
                true => {
                    let since = self.beyond_end_since.entry(tp.clone());
                    since.or_insert_with(Instant::now).elapsed() >= BEYOND_END_CONFIRM
                }
                false => {
                    self.beyond_end_since.remove(tp);
                    false
                }
            };
            if let Some(from) = idle_at
                && (from < low || confirmed_beyond)
            {
                return Err(self.range_violation(tp, from).expect("outside the bounds"));
            }
            // Not caught up while beyond the end is unconfirmed: it is
            // either an error or a stale log end.
            if !beyond {
                self.cursors.reached(tp, high);
            }
        }
        Ok(())
    }

    /// [`KafkaSource::start_offset`] of each of `starts`, asked of the
    /// broker [`WATERMARK_QUERIES_AT_ONCE`] at a time (a round trip each:
    /// one after another, four partitions' took most of a start-up).
    fn start_offsets(
        &self,
        starts: &[&(TopicPartition, Option<i64>)],
    ) -> Vec<Result<i64, SourceError>> {
        let mut offsets = Vec::with_capacity(starts.len());
        for some in starts.chunks(WATERMARK_QUERIES_AT_ONCE) {
            std::thread::scope(|scope| {
                let asked: Vec<_> = (some.iter())
                    .map(|(tp, checkpoint)| scope.spawn(move || self.start_offset(tp, *checkpoint)))
                    .collect();
                offsets.extend(
                    (asked.into_iter()).map(|a| a.join().expect("a watermark query panicked")),
                );
            });
        }
        offsets
    }

    /// The offset a partition starts at, refusing one below the log start.
    /// (The log end is checked on the fetch path instead: ListOffsets(latest)
    /// is wrong on some brokers, the fetch response's high watermark is not.)
    fn start_offset(
        &self,
        tp: &TopicPartition,
        checkpoint: Option<i64>,
    ) -> Result<i64, SourceError> {
        let (low, high) = self
            .consumer
            .fetch_watermarks(&tp.topic, tp.partition, BROKER_TIMEOUT)
            .map_err(|e| SourceError::unreachable(self.brokers.clone(), e))?;
        let from = match (checkpoint, self.start) {
            (Some(offset), _) => offset,
            (None, StartPosition::Earliest) => low,
            (None, StartPosition::Latest) => high,
        };
        if from < low.max(0) {
            let partition = tp.to_string();
            return Err(SourceError::OutOfRange {
                partition,
                from,
                low,
                high,
                what: "below the log start",
            });
        }
        Ok(from)
    }
}

/// How the batch loop reads Kafka (the core's `Source` trait).
impl Source for KafkaSource {
    /// Reads for up to `wait`: nothing if a partition waits to be started,
    /// less once some partition has a full batch, ownership changed,
    /// within ~50 ms of `signals.interrupt`, or (with
    /// `signals.cut_at_end`) once what waits is read to the log end (see
    /// [`KafkaSource::read_to_end`]), or, if the loop stops when caught up,
    /// once it is. Newly assigned partitions stay paused
    /// until [`KafkaSource::start_partitions`] gives their checkpoint; see
    /// [`KafkaSource::unstarted`].
    fn poll(&mut self, wait: Duration, signals: &PollSignals) -> Result<(), SourceError> {
        if let Some(e) = self.held_error.take() {
            return Err(e);
        }
        // A partition assigned since the last poll (a static assignment
        // before the first) is started before anything is waited for: a
        // wait would only read its paused partition's nothing.
        if self.apply_ownership_events() || self.cursors.any_unstarted() {
            return self.refresh_positions();
        }
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut wait = left.min(Duration::from_millis(50));
            let mut drained = false;
            // Drain what is queued without reading the clock per message.
            for _ in 0..DRAIN_PER_CLOCK_CHECK {
                match self.consumer.poll(wait) {
                    Some(Ok(m)) => buffer(&mut self.cursors, &mut self.last_read, &m),
                    Some(Err(e)) => self.on_error(e)?,
                    None => {
                        drained = true;
                        break;
                    }
                }
                wait = Duration::ZERO;
            }
            let ownership_changed = self.apply_ownership_events();
            if Instant::now() >= deadline
                || self.cursors.some_batch_full()
                || ownership_changed
                || signals.interrupted()
                || (drained && signals.cuts_at_end() && self.read_to_end()?)
                || (signals.until_caught_up() && self.caught_up())
            {
                break;
            }
        }
        self.refresh_positions()
    }

    /// Keeps this instance in the consumer group until `done` is set, while
    /// the pipeline takes no records (a commit retrying through a sink
    /// outage): librdkafka leaves the group when the consumer is not
    /// polled for `max.poll.interval.ms`. After [`HOLD_AFTER`] the started
    /// partitions are paused, so nothing more is fetched (the buffers stay
    /// bounded), and polled; they resume when `done` is set. Assignments and
    /// revocations are recorded as in [`KafkaSource::poll`]; an error is
    /// reported by the next poll.
    fn hold(&mut self, done: &std::sync::mpsc::Receiver<()>) {
        if done.recv_timeout(HOLD_AFTER) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let held = self.started_list();
        if let Err(e) = self.consumer.pause(&held) {
            tracing::warn!("cannot pause partitions while the sink is retrying: {e}");
        }
        tracing::debug!("holding the consumer group membership while the commit retries");
        while done.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
            match self.consumer.poll(HOLD_POLL) {
                Some(Ok(m)) => buffer(&mut self.cursors, &mut self.last_read, &m),
                Some(Err(e)) => {
                    if let Err(e) = self.on_error(e) {
                        self.held_error.get_or_insert(e);
                    }
                }
                None => {}
            }
            self.apply_ownership_events();
        }
        // The started partitions still owned: one revoked and assigned again
        // meanwhile is new, paused until its checkpoint is read.
        let still_started = self.started_list();
        match self.consumer.resume(&still_started) {
            Ok(()) => wake_fetcher(&*self.consumer, &still_started),
            Err(e) => {
                self.held_error
                    .get_or_insert(SourceError::kafka("resume after the commit", e));
            }
        }
    }

    /// Per owned partition: where the next range starts (`None` until
    /// started) and the log end the last fetch reported (`None` before any).
    fn progress(&self) -> Vec<PartitionProgress> {
        self.cursors
            .progress(|tp| cached_watermarks(&*self.consumer, tp).map(|(_, high)| high))
    }

    fn cursors(&self) -> &Cursors {
        &self.cursors
    }

    fn cursors_mut(&mut self) -> &mut Cursors {
        &mut self.cursors
    }

    /// Starts (or restarts) reading each partition at its checkpoint, or
    /// where the config says if it has none; drops anything buffered for
    /// them. Partitions revoked meanwhile are skipped.
    fn start_partitions(
        &mut self,
        starts: &[(TopicPartition, Option<i64>)],
    ) -> Result<(), SourceError> {
        let starts: Vec<_> = starts
            .iter()
            .filter(|(tp, _)| self.cursors.owns(tp))
            .collect();
        if starts.is_empty() {
            return Ok(());
        }
        let kafka = |e: KafkaError| SourceError::kafka("", e);
        let mut all = TopicPartitionList::new();
        for (tp, _) in &starts {
            all.add_partition(&tp.topic, tp.partition);
        }
        // Paused partitions have no fetch in flight, so the watermark queries
        // below are not queued behind long-polling fetches on the connection.
        self.consumer.pause(&all).map_err(kafka)?;
        let mut seeks = TopicPartitionList::new();
        let mut froms = Vec::new();
        for ((tp, _), from) in starts.iter().zip(self.start_offsets(&starts)) {
            let from = from?;
            seeks
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(from))
                .map_err(kafka)?;
            froms.push((tp, from));
        }
        self.consumer
            .seek_partitions(seeks, BROKER_TIMEOUT)
            .map_err(|e| SourceError::kafka("seek to the checkpoints", e))?;
        self.consumer.resume(&all).map_err(kafka)?;
        wake_fetcher(&*self.consumer, &all);
        for (tp, from) in froms {
            self.cursors.start(tp, from);
            self.beyond_end_since.remove(tp);
            tracing::info!(partition = %tp, from, "reading partition");
        }
        Ok(())
    }
}

/// The consumer settings sluice reads with: `read_committed`, no offset
/// commits, no automatic reset, plus the user's properties.
fn client_config(config: &SourceConfig, group_id: &str) -> ClientConfig {
    let mut client = ClientConfig::new();
    // Defaults a user may override: a crashed instance's partitions move
    // to the others after 10 s instead of librdkafka's 45 s. Fetching:
    // up to 8 MiB per partition per fetch instead of 1 MiB, since a batch
    // takes up to `max_records_per_partition` at once; and when the local
    // queue is over its threshold (which one 8 MiB fetch of small records
    // is), retry the fetch after 10 ms instead of librdkafka's 1 s, which
    // stalled a busy pipeline for up to a second per partition chunk
    // (measured: 0.23 -> 0.62 of a raw consume, BENCHMARKS.md). And a
    // fetch that finds nothing new waits at most `fetch_wait_ms`.
    client
        .set(
            "fetch.wait.max.ms",
            fetch_wait_ms(config.batch_interval_ms).to_string(),
        )
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("max.partition.fetch.bytes", "8388608")
        .set("fetch.queue.backoff.ms", "10");
    for (k, v) in &config.properties {
        client.set(k, v);
    }
    if let Some(id) = config.effective_instance_id() {
        client.set("group.instance.id", id);
    }
    client
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        // Never jump to another offset on our own: an offset that is not in
        // the log is an error the pipeline must see.
        .set("auto.offset.reset", "error")
        .set("enable.partition.eof", "false");
    client
}

/// How long the broker may hold a fetch that finds nothing new: the batch
/// interval, within 10..=100 ms (librdkafka's default is 500).
///
/// Apache Kafka answers a held fetch as soon as a record arrives, so there
/// this only sets how often an idle consumer asks again. A broker that
/// instead polls its log while it holds a fetch (Tansu looks at once, then
/// sleeps half the time left, again and again) answers late by up to half
/// of it, and that lands on every record's latency: with the default 500 ms
/// a plain consumer's p99 was 289 ms at 5,000 records/s, with 50 ms 69 ms
/// (BENCHMARKS.md). Waiting longer than a batch interval gains a batch
/// nothing.
fn fetch_wait_ms(batch_interval_ms: u64) -> u64 {
    batch_interval_ms.clamp(10, 100)
}

/// Hands a fetched record to its partition's cursor (ignored for
/// partitions not owned or not started; after a seek librdkafka drops
/// messages fetched before it, and the cursor keeps the buffer in offset
/// order).
fn buffer(
    cursors: &mut Cursors,
    last_read: &mut Option<TopicPartition>,
    m: &rdkafka::message::BorrowedMessage<'_>,
) {
    let (topic, partition) = (m.topic(), m.partition());
    let tp = match last_read {
        Some(tp) if tp.partition == partition && tp.topic == topic => tp,
        _ => last_read.insert(TopicPartition {
            topic: topic.to_string(),
            partition,
        }),
    };
    if cursors.read(tp, m.offset(), |records| copy(m, records)) == Read::FirstSinceCheckpoint {
        tracing::debug!(partition = %tp, offset = m.offset(), "first record since the checkpoint");
    }
}

/// Copies a fetched record out of librdkafka's buffer into `records`.
fn copy(m: &rdkafka::message::BorrowedMessage<'_>, records: &mut Records) {
    let headers = m.headers().into_iter().flat_map(|hs| hs.iter());
    records.push_record(
        m.offset(),
        m.timestamp().to_millis().unwrap_or(-1),
        m.key(),
        m.payload(),
        headers.map(|h| (h.key, h.value)),
    );
}

/// A fetched record, copied out of librdkafka's buffer (the replay
/// reader keeps its records this way).
fn owned(m: &rdkafka::message::BorrowedMessage<'_>) -> batch::OwnedRecord {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    batch::OwnedRecord {
        offset: m.offset(),
        timestamp: m.timestamp().to_millis().unwrap_or(-1),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// Makes librdkafka fetch the partitions just resumed now rather than up
/// to a second later. A resume does not wake the broker thread, which
/// sleeps up to 1 s when it has nothing to fetch: every start paid 1.03 s
/// between the seek to the checkpoints and the first record (measured on
/// Tansu, every run). A request to the leader goes through that thread and
/// wakes it; a ListOffsets is the cheapest one (its answer is not used:
/// some brokers get the log end wrong). With several brokers, the others
/// wake on their own within the second.
fn wake_fetcher<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    resumed: &TopicPartitionList,
) {
    if let Some(first) = resumed.elements().first() {
        let _ = consumer.fetch_watermarks(first.topic(), first.partition(), BROKER_TIMEOUT);
    }
}

/// librdkafka's cached watermarks from the last fetch response (not wrapped
/// by the rdkafka crate). Unlike ListOffsets they are right on every broker.
fn cached_watermarks<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tp: &TopicPartition,
) -> Option<(i64, i64)> {
    let topic = std::ffi::CString::new(tp.topic.as_str()).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid for the consumer's lifetime, the
    // topic is a NUL-terminated string that outlives the call, and the out
    // pointers are valid i64s; librdkafka only reads its own cache here.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            tp.partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        && low >= 0
        && high >= 0)
        .then_some((low, high))
}

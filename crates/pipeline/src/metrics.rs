//! The pipeline's Prometheus metrics: what the batch loop counts and times,
//! in the conventional names and units (`_total` counters, `_seconds`
//! histograms), labelled with the pipeline's name. The loop records into
//! them; the control plane's `GET /metrics` encodes them.
//!
//! It must not be read by the batch loop, nor do any I/O: encoding is
//! text in memory, serving it is the control plane's.

use crate::{Batch, PartitionStatus};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::HashMap;

/// Histogram buckets for batch phases, in seconds: 1 ms to 2 min.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

/// Histogram buckets for fuel per batch (wasmtime fuel units, about one
/// per Wasm instruction): 100 thousand to 100 billion.
const FUEL_BUCKETS: &[f64] = &[1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11];

/// Every metric of one pipeline instance, in one registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    records_in: IntCounter,
    rows_out: IntCounterVec,
    dead_letters: IntCounterVec,
    batches: IntCounter,
    batch_seconds: Histogram,
    read_seconds: Histogram,
    transform_seconds: Histogram,
    commit_seconds: Histogram,
    fuel_used: Histogram,
    fenced: IntCounter,
    commit_retries: IntCounter,
    swaps: IntCounter,
    lag: IntGaugeVec,
    checkpoint: IntGaugeVec,
    log_end: IntGaugeVec,
    assigned: IntGauge,
    module: IntGaugeVec,
    stalled: IntGauge,
    state_keys_read: IntCounter,
    state_keys_written: IntCounter,
    state_keys_expired: IntCounter,
    timers_set: IntCounter,
    timers_done: IntCounter,
    watermark: IntGaugeVec,
    state_sink_reads: IntCounterVec,
    state_sink_read_seconds: HistogramVec,
    state_cache_bytes: IntGauge,
    state_partition_keys: IntGaugeVec,
    state_partition_bytes: IntGaugeVec,
}

/// What one read of keyed state from the sink fetched.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SinkRead {
    /// A partition's whole state, into the cache.
    Partition,
    /// One key a module read that the cache did not hold.
    Key,
    /// The keys of a batch's records the cache did not hold, read ahead.
    RecordKeys,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new("")
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn seconds(name: &str, help: &str) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(SECONDS_BUCKETS.to_vec()))
        .expect("valid histogram")
}

impl Metrics {
    /// The metrics of pipeline `pipeline` (its `pipeline` label).
    pub fn new(pipeline: &str) -> Self {
        let labels = HashMap::from([("pipeline".to_string(), pipeline.to_string())]);
        let registry = Registry::new_custom(None, Some(labels)).expect("valid registry");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid counter");
        let partition_gauge = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["topic", "partition"]).expect("valid gauge")
        };
        let metrics = Metrics {
            records_in: counter(
                "sluice_records_in_total",
                "Input records in committed batches.",
            ),
            rows_out: IntCounterVec::new(
                Opts::new(
                    "sluice_rows_out_total",
                    "Rows committed to the sink, per target.",
                ),
                &["target"],
            )
            .expect("valid counter"),
            dead_letters: IntCounterVec::new(
                Opts::new(
                    "sluice_dead_letters_total",
                    "Dead letters committed, per kind (rejected, trap, fuel, memory, deadline, non-finite, output, contract).",
                ),
                &["kind"],
            )
            .expect("valid counter"),
            batches: counter("sluice_batches_total", "Batches committed."),
            batch_seconds: seconds(
                "sluice_batch_duration_seconds",
                "Time from reading a batch to its commit: read, transform and commit.",
            ),
            read_seconds: seconds(
                "sluice_read_duration_seconds",
                "Time taking a batch's records from the source's buffers.",
            ),
            transform_seconds: seconds(
                "sluice_transform_duration_seconds",
                "Time in the module per batch, retries and bisection included.",
            ),
            commit_seconds: seconds(
                "sluice_commit_duration_seconds",
                "Time committing a batch to the sink, retries included.",
            ),
            fuel_used: Histogram::with_opts(
                HistogramOpts::new(
                    "sluice_fuel_used_per_batch",
                    "Fuel a batch's module runs used, retries and bisection included (about one unit per Wasm instruction; the limit is limits.fuel_per_batch).",
                )
                .buckets(FUEL_BUCKETS.to_vec()),
            )
            .expect("valid histogram"),
            fenced: counter(
                "sluice_fenced_commits_total",
                "Commits refused because another owner moved the offsets first.",
            ),
            commit_retries: counter(
                "sluice_commit_retries_total",
                "Commit attempts retried after a retriable sink error or an unknown outcome.",
            ),
            swaps: counter(
                "sluice_module_swaps_total",
                "Switches to another module version at a batch boundary.",
            ),
            lag: partition_gauge(
                "sluice_partition_lag",
                "Offsets between the checkpoint and the log end, per owned partition.",
            ),
            checkpoint: partition_gauge(
                "sluice_partition_checkpoint",
                "The next offset to process (the committed checkpoint), per owned partition.",
            ),
            log_end: partition_gauge(
                "sluice_partition_log_end",
                "The log end offset last seen, per owned partition.",
            ),
            assigned: IntGauge::new(
                "sluice_assigned_partitions",
                "Partitions this instance owns.",
            )
            .expect("valid gauge"),
            module: IntGaugeVec::new(
                Opts::new(
                    "sluice_active_module",
                    "1 for the module version batches are prepared with now.",
                ),
                &["module_digest", "params_digest"],
            )
            .expect("valid gauge"),
            stalled: IntGauge::new(
                "sluice_stalled",
                "1 while the pipeline stalls: the running version failed too many records of a batch (limits.max_poison_share, limits.isolation_budget); it waits for another version.",
            )
            .expect("valid gauge"),
            state_keys_read: counter(
                "sluice_state_keys_read_total",
                "Keys of their start state that committed batches read (each key once per batch).",
            ),
            state_keys_written: counter(
                "sluice_state_keys_written_total",
                "Keys committed batches' modules changed (set or deleted; each key once per batch).",
            ),
            timers_set: counter(
                "sluice_timers_set_total",
                "Event-time timers committed batches set.",
            ),
            timers_done: counter(
                "sluice_timers_done_total",
                "Event-time timers committed batches removed: fired (handed to the module once) or deleted by it.",
            ),
            watermark: partition_gauge(
                "sluice_watermark_ms",
                "A partition's event-time watermark (ms since the Unix epoch) as its last committed batch moved it, for modules that use event time.",
            ),
            state_keys_expired: counter(
                "sluice_state_keys_expired_total",
                "Expired keys committed batches removed from the stored state (besides their modules' changes).",
            ),
            state_sink_reads: IntCounterVec::new(
                Opts::new(
                    "sluice_state_sink_reads_total",
                    "Reads of keyed state from the sink, by what they fetched: `partition` (a partition's whole state into the cache), `record_keys` (the keys of a batch's records the cache did not hold, read ahead in one round trip, for a partition larger than the cache) or `key` (one key the module read that the cache did not hold). Every other read was a cache hit.",
                ),
                &["kind"],
            )
            .expect("valid counter"),
            state_sink_read_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "sluice_state_sink_read_seconds",
                    "How long each keyed-state read from the sink took, by kind (as sluice_state_sink_reads_total); a batch waits for these while its module runs.",
                )
                .buckets(SECONDS_BUCKETS.to_vec()),
                &["kind"],
            )
            .expect("valid histogram"),
            state_partition_keys: partition_gauge(
                "sluice_state_partition_keys",
                "Keys with a value in a partition's keyed state, per owned partition whose state the cache holds whole.",
            ),
            state_partition_bytes: partition_gauge(
                "sluice_state_partition_bytes",
                "Bytes of the keys and values of a partition's keyed state, per owned partition whose state the cache holds whole.",
            ),
            state_cache_bytes: IntGauge::new(
                "sluice_state_cache_bytes",
                "Bytes the keyed-state cache holds (bounded by limits.state_cache_mib).",
            )
            .expect("valid gauge"),
            registry,
        };
        metrics.register_all();
        metrics
    }

    fn register_all(&self) {
        let collectors: [Box<dyn prometheus::core::Collector>; 29] = [
            Box::new(self.records_in.clone()),
            Box::new(self.rows_out.clone()),
            Box::new(self.dead_letters.clone()),
            Box::new(self.batches.clone()),
            Box::new(self.batch_seconds.clone()),
            Box::new(self.read_seconds.clone()),
            Box::new(self.transform_seconds.clone()),
            Box::new(self.commit_seconds.clone()),
            Box::new(self.fuel_used.clone()),
            Box::new(self.fenced.clone()),
            Box::new(self.commit_retries.clone()),
            Box::new(self.swaps.clone()),
            Box::new(self.lag.clone()),
            Box::new(self.checkpoint.clone()),
            Box::new(self.log_end.clone()),
            Box::new(self.assigned.clone()),
            Box::new(self.module.clone()),
            Box::new(self.stalled.clone()),
            Box::new(self.state_keys_read.clone()),
            Box::new(self.state_keys_written.clone()),
            Box::new(self.state_keys_expired.clone()),
            Box::new(self.timers_set.clone()),
            Box::new(self.timers_done.clone()),
            Box::new(self.watermark.clone()),
            Box::new(self.state_sink_reads.clone()),
            Box::new(self.state_sink_read_seconds.clone()),
            Box::new(self.state_cache_bytes.clone()),
            Box::new(self.state_partition_keys.clone()),
            Box::new(self.state_partition_bytes.clone()),
        ];
        for collector in collectors {
            self.registry
                .register(collector)
                .expect("metric names are unique");
        }
    }

    /// A committed batch: its records, rows per target, dead letters per
    /// kind, how long its phases took (`commit_ms`: the commit's) and the
    /// fuel it used.
    pub(crate) fn committed(&self, batch: &Batch, commit_ms: u64) {
        self.batches.inc();
        if let Some(fuel) = batch.usage.fuel {
            self.fuel_used.observe(fuel as f64);
        }
        self.records_in.inc_by(batch.records.len() as u64);
        self.state_keys_read.inc_by(batch.state_reads.len() as u64);
        let expired = batch.state_expired as u64;
        self.state_keys_written
            .inc_by(batch.output.state.len() as u64 - expired);
        self.state_keys_expired.inc_by(expired);
        self.event_time(&batch.output.state);
        for target in &batch.output.targets {
            self.rows_out
                .with_label_values(&[target.target.as_str()])
                .inc_by(u64::from(target.rows));
        }
        for dead in &batch.dead_letters {
            self.dead_letters
                .with_label_values(&[dead.kind.as_str()])
                .inc();
        }
        let s = |ms: u64| ms as f64 / 1000.0;
        let (read_ms, transform_ms) = (batch.read_ms, batch.transform_ms);
        self.read_seconds.observe(s(read_ms));
        self.transform_seconds.observe(s(transform_ms));
        self.commit_seconds.observe(s(commit_ms));
        self.batch_seconds
            .observe(s(read_ms + transform_ms + commit_ms));
    }

    /// The timers and watermarks among a committed batch's state changes.
    fn event_time(&self, state: &sluice_core::state::StateMap) {
        use sluice_core::event_time::{Timer, WATERMARK_KEY, decode_watermark};
        for (tp, keys) in &state.0 {
            for (key, value) in keys {
                if key == WATERMARK_KEY
                    && let Some(Ok(watermark)) = value.as_ref().map(|v| decode_watermark(&v.value))
                {
                    let partition = tp.partition.to_string();
                    self.watermark
                        .with_label_values(&[tp.topic.as_str(), partition.as_str()])
                        .set(watermark);
                } else if Timer::time_of_state_key(key).is_some() {
                    match value {
                        Some(_) => self.timers_set.inc(),
                        None => self.timers_done.inc(),
                    }
                }
            }
        }
    }

    /// The state cache read a partition whole (`whole`) or one key from
    /// the sink, in `took`.
    pub(crate) fn state_sink_read(&self, read: SinkRead, took: std::time::Duration) {
        let kind = match read {
            SinkRead::Partition => "partition",
            SinkRead::Key => "key",
            SinkRead::RecordKeys => "record_keys",
        };
        self.state_sink_reads.with_label_values(&[kind]).inc();
        self.state_sink_read_seconds
            .with_label_values(&[kind])
            .observe(took.as_secs_f64());
    }

    /// The keyed-state counters so far.
    pub(crate) fn state_stats(&self) -> crate::StateStats {
        let reads = |kind: &str| self.state_sink_reads.with_label_values(&[kind]).get();
        let seconds = |kind: &str| {
            self.state_sink_read_seconds
                .with_label_values(&[kind])
                .get_sample_sum()
        };
        crate::StateStats {
            keys_read: self.state_keys_read.get(),
            keys_written: self.state_keys_written.get(),
            keys_expired: self.state_keys_expired.get(),
            sink_key_reads: reads("key"),
            partitions_loaded: reads("partition"),
            record_key_reads: reads("record_keys"),
            sink_read_seconds: seconds("key") + seconds("partition") + seconds("record_keys"),
        }
    }

    /// Bytes the state cache holds now.
    pub(crate) fn state_cache_bytes(&self, bytes: usize) {
        self.state_cache_bytes.set(bytes as i64);
    }

    pub(crate) fn fenced(&self) {
        self.fenced.inc();
    }

    pub(crate) fn commit_retried(&self) {
        self.commit_retries.inc();
    }

    /// Whether the pipeline stalls on a version at fault.
    pub(crate) fn stalled(&self, stalled: bool) {
        self.stalled.set(i64::from(stalled));
    }

    pub(crate) fn swapped(&self) {
        self.swaps.inc();
    }

    /// The version batches are prepared with now (the only series of
    /// `sluice_active_module` at 1).
    pub(crate) fn active_module(&self, module_digest: &str, params_digest: &str) {
        self.module.reset();
        self.module
            .with_label_values(&[module_digest, params_digest])
            .set(1);
    }

    /// The stored size of each partition whose state the cache holds
    /// whole; the others have no series.
    pub(crate) fn state_partitions(
        &self,
        partitions: &[(
            &sluice_core::batch::TopicPartition,
            sluice_core::state::StateSize,
        )],
    ) {
        self.state_partition_keys.reset();
        self.state_partition_bytes.reset();
        for (tp, size) in partitions {
            let partition = tp.partition.to_string();
            let labels = [tp.topic.as_str(), partition.as_str()];
            self.state_partition_keys
                .with_label_values(&labels)
                .set(size.keys as i64);
            self.state_partition_bytes
                .with_label_values(&labels)
                .set(size.bytes as i64);
        }
    }

    /// Where each owned partition stands (its lag as the status board
    /// computes it); partitions no longer owned disappear.
    pub(crate) fn partitions(&self, partitions: &[PartitionStatus]) {
        self.lag.reset();
        self.checkpoint.reset();
        self.log_end.reset();
        self.assigned.set(partitions.len() as i64);
        for p in partitions {
            let partition = p.progress.partition.to_string();
            let labels = [p.progress.topic.as_str(), partition.as_str()];
            if let Some(next) = p.progress.next_offset {
                self.checkpoint.with_label_values(&labels).set(next);
            }
            if let Some(end) = p.progress.log_end {
                self.log_end.with_label_values(&labels).set(end);
            }
            if let Some(lag) = p.lag {
                self.lag.with_label_values(&labels).set(lag);
            }
        }
    }

    /// Every metric in the Prometheus text format (version 0.0.4).
    pub fn encode(&self) -> String {
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("text encoding into memory");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

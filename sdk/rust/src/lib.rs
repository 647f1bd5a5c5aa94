//! The Rust SDK for sluice transforms.
//!
//! Owns the guest side of the `sluice:plugin` world: it hides the columnar
//! batch layout behind [`Batch::records`] and the columnar output layout
//! behind [`Output::row`], so a transform is a few lines:
//!
//! ```ignore
//! struct Upper;
//! impl sluice_plugin::Transform for Upper {
//!     fn init(_params: &sluice_plugin::Params) -> Result<Self, String> { Ok(Upper) }
//!     fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
//!         let t = out.target("upper", &[("value", Kind::Text)]);
//!         for r in batch.records() {
//!             out.row(t).text(&String::from_utf8_lossy(r.value.unwrap_or_default()).to_uppercase());
//!         }
//!         Ok(())
//!     }
//! }
//! sluice_plugin::export!(Upper);
//! ```
//!
//! It must not import anything outside the world (no WASI): the host rejects
//! such modules at load time.

use std::any::Any;
use std::cell::RefCell;

pub mod window;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        // The crate's own copy (a link to the repository's wit/ here), so it
        // builds the same outside this repository and when published.
        path: "wit",
        world: "transform",
        pub_export_macro: true,
        export_macro_name: "__export_transform",
        default_bindings_module: "sluice_plugin::bindings",
    });
}

use bindings::sluice::plugin::types as wit;

/// The transform's parameters: the JSON document from the pipeline config.
pub struct Params(String);

impl Params {
    /// The parameters as JSON text (`{}` when the pipeline sets none).
    pub fn json(&self) -> &str {
        &self.0
    }
}

/// A failure of the whole batch, declared by the transform.
#[derive(Debug, Clone)]
pub struct BatchError {
    pub message: String,
    /// True if the same batch may succeed when run again.
    pub retryable: bool,
}

impl BatchError {
    pub fn fatal(message: impl Into<String>) -> Self {
        BatchError {
            message: message.into(),
            retryable: false,
        }
    }
}

/// What a transform implements. One value is created per batch by `init`.
pub trait Transform: Sized + 'static {
    fn init(params: &Params) -> Result<Self, String>;
    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError>;
}

/// Deterministic logging, buffered by the host per batch.
pub mod log {
    use super::bindings::sluice::plugin::log::{Level, write};
    pub fn debug(message: &str) {
        write(Level::Debug, message)
    }
    pub fn info(message: &str) {
        write(Level::Info, message)
    }
    pub fn warn(message: &str) {
        write(Level::Warn, message)
    }
    pub fn error(message: &str) {
        write(Level::Error, message)
    }
}

/// Where and when the batch runs (all from the plan, identical on replay).
pub struct Context {
    pub pipeline: String,
    pub batch_id: String,
    pub batch_time_ms: i64,
    pub seed: u64,
}

/// One whole batch of records.
pub struct Batch {
    pub context: Context,
    raw: wit::RecordBatch,
}

/// One record, borrowed from the batch.
pub struct Record<'a> {
    /// Position of the record in the batch (used for rejections).
    pub index: u32,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    headers: HeaderCursor<'a>,
}

#[derive(Clone, Copy)]
struct HeaderCursor<'a> {
    batch: &'a wit::RecordBatch,
    first: usize,
    count: usize,
    name_start: usize,
    value_start: usize,
}

impl<'a> Record<'a> {
    /// The record's headers in order, as (name, value) pairs.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, Option<&'a [u8]>)> + 'a {
        let c = self.headers;
        let (mut name_at, mut value_at) = (c.name_start, c.value_start);
        (c.first..c.first + c.count).map(move |h| {
            let name_len = c.batch.header_name_lengths[h] as usize;
            let name = std::str::from_utf8(&c.batch.header_names[name_at..name_at + name_len])
                .unwrap_or("");
            name_at += name_len;
            let value = take(
                &c.batch.header_values,
                &mut value_at,
                c.batch.header_value_lengths[h],
            );
            (name, value)
        })
    }

    /// The keyed state of the partition this record came from.
    pub fn state(&self) -> State {
        State { index: self.index }
    }

    /// Event time of the partition this record came from: its watermark
    /// and timers.
    pub fn time(&self) -> Time {
        Time { index: self.index }
    }
}

/// Event time of one input partition, as a record (or a fired timer)
/// names it. A partition's watermark is the highest event time of its
/// records so far minus `event_time.allowed_lateness_ms`, kept in its
/// state by the host; a timer comes due once the watermark reaches its
/// time, in the batch that moved it there ([`due_timers`]).
#[derive(Debug, Clone, Copy)]
pub struct Time {
    index: u32,
}

impl Time {
    /// The partition's watermark just before this record (ms since the
    /// Unix epoch): as the batch started, moved by the partition's records
    /// before it; `None` before its first record. A record whose window
    /// ended at or before it is late, wherever batches begin and end.
    pub fn watermark(&self) -> Option<i64> {
        bindings::sluice::plugin::time::watermark(self.index)
    }

    /// Sets this record's event time (default: its Kafka timestamp). Call
    /// it (or [`Time::clear_event_time`]) in record order, before
    /// [`Time::watermark`] of later records and before [`due_timers`].
    pub fn set_event_time(&self, time_ms: i64) {
        bindings::sluice::plugin::time::set_record_time(self.index, Some(time_ms))
    }

    /// Leaves this record out of the watermark: it has no event time (a
    /// record no window takes: no key, not parseable).
    pub fn clear_event_time(&self) {
        bindings::sluice::plugin::time::set_record_time(self.index, None)
    }

    /// Sets the timer (`key`, `at_ms`) on the partition (`key` at most 245
    /// bytes); setting it again is one timer (and empties its value).
    pub fn set_timer(&self, key: &[u8], at_ms: i64) {
        bindings::sluice::plugin::time::set_timer(self.index, key, at_ms)
    }

    /// Sets the timer (`key`, `at_ms`) keeping `value` with it (bounded
    /// like a state value), handed back in [`FiredTimer::value`] when it
    /// fires: state that lives as long as the timer, one stored entry
    /// where a state key and a timer would take two. Setting it again
    /// replaces the value.
    pub fn set_timer_value(&self, key: &[u8], at_ms: i64, value: &[u8]) {
        bindings::sluice::plugin::time::set_timer_value(self.index, key, at_ms, value)
    }

    /// The value kept with the timer (`key`, `at_ms`): `None` if there is
    /// no such timer (never set, deleted, fired), empty if it was set by
    /// [`Time::set_timer`].
    pub fn timer_value(&self, key: &[u8], at_ms: i64) -> Option<Vec<u8>> {
        bindings::sluice::plugin::time::timer_value(self.index, key, at_ms)
    }

    /// Removes the timer (`key`, `at_ms`) of the partition.
    pub fn delete_timer(&self, key: &[u8], at_ms: i64) {
        bindings::sluice::plugin::time::delete_timer(self.index, key, at_ms)
    }

    /// Makes the record a dead letter of kind `late` with `reason`.
    pub fn late(&self, reason: &str) {
        bindings::sluice::plugin::time::late(self.index, reason)
    }
}

/// A timer that came due.
#[derive(Debug, Clone)]
pub struct FiredTimer {
    /// Names the timer's partition (see [`FiredTimer::state`]).
    pub index: u32,
    pub key: Vec<u8>,
    pub at_ms: i64,
    /// The value [`Time::set_timer_value`] kept with it (empty for
    /// [`Time::set_timer`]).
    pub value: Vec<u8>,
}

impl FiredTimer {
    /// The keyed state of the timer's partition.
    pub fn state(&self) -> State {
        State { index: self.index }
    }

    /// Event time of the timer's partition.
    pub fn time(&self) -> Time {
        Time { index: self.index }
    }
}

/// Moves each partition's watermark past the batch's records and returns
/// the timers that came due by it, oldest first, each once (they are
/// removed as they are returned). What the module writes and emits for
/// them commits with this batch.
pub fn due_timers() -> Vec<FiredTimer> {
    bindings::sluice::plugin::time::due_timers_with_values()
        .into_iter()
        .map(|t| FiredTimer {
            index: t.index,
            key: t.key,
            at_ms: t.at_ms,
            value: t.value,
        })
        .collect()
}

/// Keyed state of one input partition, as a record sees it: the state as
/// the batch started plus the batch's own earlier writes. The host commits
/// what the batch writes with its rows and offsets, exactly once, and
/// replays it in `sluice verify`. Keys are at most 255 bytes; values at
/// most `limits.max_state_value_kib`.
///
/// The typed helpers store integers as their decimal text and strings as
/// UTF-8, the same bytes in every SDK.
#[derive(Debug, Clone, Copy)]
pub struct State {
    index: u32,
}

impl State {
    /// The value under `key`, if present and not expired.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        bindings::sluice::plugin::state::get(self.index, key)
    }

    /// Stores `value` under `key`.
    pub fn set(&self, key: &[u8], value: &[u8]) {
        bindings::sluice::plugin::state::set(self.index, key, value, None)
    }

    /// Stores `value` under `key` until `expires_at_ms` (ms since the Unix
    /// epoch): batches whose batch time is at or past it read it as absent.
    /// Expiry follows batch time (`Context::batch_time_ms`), or whatever
    /// time the module computes it from (a record's timestamp), never the
    /// host's clock.
    pub fn set_expiring(&self, key: &[u8], value: &[u8], expires_at_ms: i64) {
        bindings::sluice::plugin::state::set(self.index, key, value, Some(expires_at_ms))
    }

    /// Removes `key`.
    pub fn delete(&self, key: &[u8]) {
        bindings::sluice::plugin::state::delete(self.index, key)
    }

    /// The integer under `key` (stored as decimal text: an optional `-`
    /// then digits, in i64's range); `None` if absent or anything else.
    pub fn get_i64(&self, key: &[u8]) -> Option<i64> {
        let value = self.get(key)?;
        let digits = value.strip_prefix(b"-").unwrap_or(&value);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(&value).ok()?.parse().ok()
    }

    /// Stores `value` under `key` as decimal text.
    pub fn set_i64(&self, key: &[u8], value: i64) {
        self.set(key, value.to_string().as_bytes())
    }

    /// The text under `key`; `None` if absent or not UTF-8.
    pub fn get_str(&self, key: &[u8]) -> Option<String> {
        String::from_utf8(self.get(key)?).ok()
    }

    /// Stores `value` under `key` as UTF-8.
    pub fn set_str(&self, key: &[u8], value: &str) {
        self.set(key, value.as_bytes())
    }
}

fn take<'a>(buf: &'a [u8], at: &mut usize, len: i32) -> Option<&'a [u8]> {
    if len < 0 {
        return None;
    }
    let start = *at;
    *at += len as usize;
    Some(&buf[start..*at])
}

impl Batch {
    /// Number of records in the batch.
    pub fn len(&self) -> usize {
        self.raw.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.offsets.is_empty()
    }

    /// The topic and partition of record `index` (or of a fired timer's
    /// `index`).
    pub fn partition_of(&self, index: u32) -> Option<(&str, i32)> {
        let slice = self
            .raw
            .slices
            .iter()
            .find(|s| s.first <= index && index < s.first + s.count)?;
        Some((slice.topic.as_str(), slice.partition))
    }

    /// All records, in partition order then offset order.
    pub fn records(&self) -> Records<'_> {
        Records {
            batch: &self.raw,
            slice: 0,
            index: 0,
            key_at: 0,
            value_at: 0,
            header_at: 0,
            name_at: 0,
            hvalue_at: 0,
        }
    }
}

/// Iterator over a batch's records (a plain loop over the columns: this is
/// the hot path of every transform).
pub struct Records<'a> {
    batch: &'a wit::RecordBatch,
    slice: usize,
    index: usize,
    key_at: usize,
    value_at: usize,
    header_at: usize,
    name_at: usize,
    hvalue_at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Record<'a>;

    #[inline]
    fn next(&mut self) -> Option<Record<'a>> {
        let raw = self.batch;
        let slice = loop {
            let slice = raw.slices.get(self.slice)?;
            if self.index < (slice.first + slice.count) as usize {
                break slice;
            }
            self.slice += 1;
        };
        let i = self.index.max(slice.first as usize);
        self.index = i + 1;
        let key = take(&raw.keys, &mut self.key_at, raw.key_lengths[i]);
        let value = take(&raw.values, &mut self.value_at, raw.value_lengths[i]);
        let count = raw.header_counts.get(i).copied().unwrap_or(0) as usize;
        let headers = HeaderCursor {
            batch: raw,
            first: self.header_at,
            count,
            name_start: self.name_at,
            value_start: self.hvalue_at,
        };
        for h in self.header_at..self.header_at + count {
            self.name_at += raw.header_name_lengths[h] as usize;
            self.hvalue_at += raw.header_value_lengths[h].max(0) as usize;
        }
        self.header_at += count;
        Some(Record {
            index: i as u32,
            topic: &slice.topic,
            partition: slice.partition,
            offset: raw.offsets[i],
            timestamp: raw.timestamps[i],
            key,
            value,
            headers,
        })
    }
}

/// The type of an output column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int64,
    Float64,
    Text,
    Bytes,
    Bool,
}

enum ColumnData {
    Int64(Vec<i64>),
    Float64(Vec<f64>),
    Text(Vec<u32>, Vec<u8>),
    Bytes(Vec<u32>, Vec<u8>),
    Bool(Vec<u8>),
}

struct ColumnBuf {
    name: String,
    /// Empty until the first null: most columns never hold one, and a byte
    /// per cell would cost a push per value for nothing.
    nulls: Vec<u8>,
    data: ColumnData,
}

impl ColumnBuf {
    fn mark(&mut self, row: usize, is_null: bool) {
        if is_null {
            self.nulls.resize(row, 0);
            self.nulls.push(1);
        } else if !self.nulls.is_empty() {
            self.nulls.push(0);
        }
    }
}

struct TargetBuf {
    name: String,
    rows: u32,
    columns: Vec<ColumnBuf>,
}

/// Handle to a declared output target.
#[derive(Clone, Copy, Debug)]
pub struct TargetId(usize);

/// Everything a batch produces: rows per target and rejected records.
#[derive(Default)]
pub struct Output {
    targets: Vec<TargetBuf>,
    rejections: Vec<wit::Rejection>,
    /// Rows to reserve per column (the batch size): one row per record is
    /// the common case, and growing vectors in Wasm costs copies.
    rows_hint: usize,
}

impl Output {
    /// Declares (or finds, by name) a target and its columns. Rows pushed with
    /// [`Output::row`] give one value per column, in this order.
    pub fn target(&mut self, name: &str, columns: &[(&str, Kind)]) -> TargetId {
        if let Some(i) = self.targets.iter().position(|t| t.name == name) {
            return TargetId(i);
        }
        let columns = columns
            .iter()
            .map(|(name, kind)| {
                let n = self.rows_hint;
                ColumnBuf {
                    name: (*name).to_string(),
                    nulls: Vec::new(),
                    data: match kind {
                        Kind::Int64 => ColumnData::Int64(Vec::with_capacity(n)),
                        Kind::Float64 => ColumnData::Float64(Vec::with_capacity(n)),
                        Kind::Text => ColumnData::Text(Vec::with_capacity(n), Vec::new()),
                        Kind::Bytes => ColumnData::Bytes(Vec::with_capacity(n), Vec::new()),
                        Kind::Bool => ColumnData::Bool(Vec::with_capacity(n)),
                    },
                }
            })
            .collect();
        self.targets.push(TargetBuf {
            name: name.to_string(),
            rows: 0,
            columns,
        });
        TargetId(self.targets.len() - 1)
    }

    /// Starts a row for `target`; give every column a value, in declaration
    /// order. The row is complete when the builder is dropped.
    pub fn row(&mut self, target: TargetId) -> Row<'_> {
        Row {
            target: &mut self.targets[target.0],
            column: 0,
        }
    }

    /// Turns a record into a dead letter with `reason`.
    pub fn reject(&mut self, record: &Record<'_>, reason: impl Into<String>) {
        self.rejections.push(wit::Rejection {
            index: record.index,
            reason: reason.into(),
        });
    }

    fn into_wit(self) -> wit::Output {
        let targets = self
            .targets
            .into_iter()
            .map(|t| wit::TargetRows {
                target: t.name,
                rows: t.rows,
                columns: t
                    .columns
                    .into_iter()
                    .map(|c| wit::Column {
                        name: c.name,
                        nulls: c.nulls,
                        data: match c.data {
                            ColumnData::Int64(v) => wit::ColumnData::Int64(v),
                            ColumnData::Float64(v) => wit::ColumnData::Float64(v),
                            ColumnData::Text(lengths, data) => {
                                wit::ColumnData::Text(wit::VarColumn { lengths, data })
                            }
                            ColumnData::Bytes(lengths, data) => {
                                wit::ColumnData::Bytes(wit::VarColumn { lengths, data })
                            }
                            ColumnData::Bool(v) => wit::ColumnData::Boolean(v),
                        },
                    })
                    .collect(),
            })
            .collect();
        wit::Output {
            targets,
            rejections: self.rejections,
        }
    }
}

/// Builds one row, column by column.
pub struct Row<'a> {
    target: &'a mut TargetBuf,
    column: usize,
}

impl Row<'_> {
    fn next(&mut self, is_null: bool) -> &mut ColumnBuf {
        let target_name = &self.target.name;
        let count = self.target.columns.len();
        let column = self.target.columns.get_mut(self.column).unwrap_or_else(|| {
            panic!("row for target `{target_name}` has more than {count} values")
        });
        self.column += 1;
        column.mark(self.target.rows as usize, is_null);
        column
    }

    fn mismatch(column: &ColumnBuf, given: &str) -> ! {
        panic!("column `{}` does not take a {given} value", column.name)
    }

    pub fn int(mut self, value: i64) -> Self {
        let c = self.next(false);
        match &mut c.data {
            ColumnData::Int64(v) => v.push(value),
            ColumnData::Float64(v) => v.push(value as f64),
            _ => Self::mismatch(c, "integer"),
        }
        self
    }

    pub fn float(mut self, value: f64) -> Self {
        let c = self.next(false);
        match &mut c.data {
            ColumnData::Float64(v) => v.push(value),
            _ => Self::mismatch(c, "float"),
        }
        self
    }

    pub fn text(mut self, value: &str) -> Self {
        let c = self.next(false);
        match &mut c.data {
            ColumnData::Text(lengths, data) => {
                lengths.push(value.len() as u32);
                data.extend_from_slice(value.as_bytes());
            }
            _ => Self::mismatch(c, "text"),
        }
        self
    }

    pub fn bytes(mut self, value: &[u8]) -> Self {
        let c = self.next(false);
        match &mut c.data {
            ColumnData::Bytes(lengths, data) | ColumnData::Text(lengths, data) => {
                lengths.push(value.len() as u32);
                data.extend_from_slice(value);
            }
            _ => Self::mismatch(c, "bytes"),
        }
        self
    }

    pub fn bool(mut self, value: bool) -> Self {
        let c = self.next(false);
        match &mut c.data {
            ColumnData::Bool(v) => v.push(value as u8),
            _ => Self::mismatch(c, "boolean"),
        }
        self
    }

    /// A null in the next column.
    pub fn null(mut self) -> Self {
        let c = self.next(true);
        match &mut c.data {
            ColumnData::Int64(v) => v.push(0),
            ColumnData::Float64(v) => v.push(0.0),
            ColumnData::Text(lengths, _) | ColumnData::Bytes(lengths, _) => lengths.push(0),
            ColumnData::Bool(v) => v.push(0),
        }
        self
    }
}

impl Drop for Row<'_> {
    fn drop(&mut self) {
        if self.column != self.target.columns.len() {
            panic!(
                "row for target `{}` has {} of {} values",
                self.target.name,
                self.column,
                self.target.columns.len()
            );
        }
        self.target.rows += 1;
    }
}

thread_local! {
    static STATE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

#[doc(hidden)]
pub fn __init<T: Transform>(params: String) -> Result<(), String> {
    // A panic aborts the instance with a bare trap; say why first, through
    // the log import, so the host can put the message in the dead letter.
    std::panic::set_hook(Box::new(|info| log::error(&format!("panic: {info}"))));
    let transform = T::init(&Params(params))?;
    STATE.with(|s| *s.borrow_mut() = Some(Box::new(transform)));
    Ok(())
}

#[doc(hidden)]
pub fn __process<T: Transform>(
    ctx: wit::BatchContext,
    raw: wit::RecordBatch,
) -> Result<wit::Output, wit::BatchError> {
    let batch = Batch {
        context: Context {
            pipeline: ctx.pipeline,
            batch_id: ctx.batch_id,
            batch_time_ms: ctx.batch_time_ms,
            seed: ctx.seed,
        },
        raw,
    };
    let mut out = Output {
        rows_hint: batch.len(),
        ..Output::default()
    };
    STATE
        .with(|s| {
            let state = s.borrow();
            let transform = state
                .as_ref()
                .and_then(|b| b.downcast_ref::<T>())
                .expect("the host calls init before process");
            transform.process(&batch, &mut out)
        })
        .map_err(|e| wit::BatchError {
            message: e.message,
            retryable: e.retryable,
        })?;
    Ok(out.into_wit())
}

/// Exports a [`Transform`] implementation as the component's world.
#[macro_export]
macro_rules! export {
    ($t:ty) => {
        struct __SluiceGuest;
        impl $crate::bindings::Guest for __SluiceGuest {
            fn init(params: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                $crate::__init::<$t>(params)
            }
            fn process(
                ctx: $crate::bindings::sluice::plugin::types::BatchContext,
                batch: $crate::bindings::sluice::plugin::types::RecordBatch,
            ) -> ::std::result::Result<
                $crate::bindings::sluice::plugin::types::Output,
                $crate::bindings::sluice::plugin::types::BatchError,
            > {
                $crate::__process::<$t>(ctx, batch)
            }
        }
        $crate::bindings::__export_transform!(__SluiceGuest with_types_in $crate::bindings);
    };
}

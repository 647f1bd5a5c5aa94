//! Event-time windows on keyed state and timers: tumbling, hopping and
//! session windows per user key, each with a user aggregate, emitted once
//! when the partition's watermark passes their end (and, optionally, early
//! on every batch that changes them). A record whose windows have all
//! closed is a dead letter of kind `late`, never dropped.
//!
//! It owns the window layout in state, which every SDK keeps alike (so one
//! windowed transform gives one digest in any language; docs/event-time.md):
//!
//! - tumbling and hopping: the aggregate of window `[start, end)` of `key`
//!   under `sluice/w/` + end (8 bytes, big-endian, sign bit flipped) +
//!   `key`; a timer (`key`, `end - 1`) closes it;
//! - sessions: every open session of `key` under `sluice/s/` + `key`, per
//!   session its start and end (8 bytes each, big-endian) and its
//!   aggregate's length (4 bytes, big-endian) and bytes, in start order; a
//!   timer (`key`, `end - 1`) per session closes it.
//!
//! A window `[start, end)` closes when the watermark reaches `end - 1` (its
//! last millisecond), judged per record (the watermark just before it);
//! a record is late when every window it falls in has closed (for
//! sessions: the session it would make, merged with the open ones it
//! touches). Closed windows are handed out at the end of the batch that
//! closed them. So what each window holds and which records are late do
//! not depend on where batches begin and end.
//!
//! It must not read the host's clock or keep anything between batches
//! outside state.

use crate::{Batch, FiredTimer, Output, Record, State};

const WINDOW_PREFIX: &[u8] = b"sluice/w/";
const SESSION_PREFIX: &[u8] = b"sluice/s/";

/// How records are grouped in time.
#[derive(Debug, Clone, Copy)]
pub enum Windows {
    /// Back-to-back windows of `size_ms`, aligned to the Unix epoch.
    Tumbling { size_ms: i64 },
    /// Windows of `size_ms` starting every `hop_ms` (a record is in
    /// `size_ms / hop_ms` of them), aligned to the Unix epoch.
    Hopping { size_ms: i64, hop_ms: i64 },
    /// Records of a key less than `gap_ms` apart, together: a session ends
    /// `gap_ms` after its last record.
    Session { gap_ms: i64 },
}

/// An aggregate's running value, as state keeps it.
pub trait Accumulator: Sized {
    fn to_bytes(&self) -> Vec<u8>;
    fn from_bytes(bytes: &[u8]) -> Option<Self>;
}

/// 8 bytes, big-endian.
impl Accumulator for i64 {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(i64::from_be_bytes(bytes.try_into().ok()?))
    }
}

/// The bits, 8 bytes, big-endian.
impl Accumulator for f64 {
    fn to_bytes(&self) -> Vec<u8> {
        self.to_bits().to_be_bytes().to_vec()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(f64::from_bits(u64::from_be_bytes(bytes.try_into().ok()?)))
    }
}

/// The bytes as they are.
impl Accumulator for Vec<u8> {
    fn to_bytes(&self) -> Vec<u8> {
        self.clone()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

/// What a window computes over its records.
pub trait Aggregate {
    type Acc: Accumulator;
    /// What a record brings to its windows, taken from it once
    /// ([`Taken::Event`]), so a record is parsed once however many
    /// windows it falls in.
    type Input;
    /// The value of a window without records.
    fn init(&self) -> Self::Acc;
    /// Takes a record's `input` into `acc`.
    fn add(&self, acc: &mut Self::Acc, input: &Self::Input);
    /// Joins two sessions' values into `acc` (sessions only).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
}

/// What the function given to [`Windowed::run`] makes of a record.
pub enum Taken<I> {
    /// The record goes into the windows of `key` at `time_ms` (`None`: its
    /// Kafka timestamp), bringing `input` to their aggregates.
    Event {
        key: Vec<u8>,
        time_ms: Option<i64>,
        input: I,
    },
    /// The record is in no window and does not move the watermark.
    Ignored,
    /// The record is in no window, does not move the watermark, and is a
    /// `rejected` dead letter with this reason.
    Rejected(String),
}

/// Why a window's value is handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// The batch changed the window, which is still open (with
    /// [`Windowed::early`]).
    Early,
    /// The watermark passed the window's end: its value is final, and it
    /// is handed out once.
    Final,
}

/// A window's value, handed to the emit function.
pub struct WindowValue<'a, A> {
    /// The window's input partition.
    pub topic: &'a str,
    pub partition: i32,
    pub key: &'a [u8],
    pub start_ms: i64,
    pub end_ms: i64,
    pub acc: &'a A,
    pub emit: Emit,
    /// The window's partition (to key more state by it).
    pub state: State,
}

/// Windows of one kind with one aggregate.
pub struct Windowed<G: Aggregate> {
    windows: Windows,
    aggregate: G,
    early: bool,
}

/// `at` as 8 bytes that sort as the numbers do.
fn ordered(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

fn window_key(end_ms: i64, key: &[u8]) -> Vec<u8> {
    [WINDOW_PREFIX, &ordered(end_ms), key].concat()
}

fn session_key(key: &[u8]) -> Vec<u8> {
    [SESSION_PREFIX, key].concat()
}

/// One open session of a key.
struct Session {
    start_ms: i64,
    end_ms: i64,
    acc: Vec<u8>,
}

fn read_sessions(state: &State, key: &[u8]) -> Vec<Session> {
    let bytes = state.get(&session_key(key)).unwrap_or_default();
    let mut sessions = Vec::new();
    let mut at = 0;
    while at + 20 <= bytes.len() {
        let int = |from: usize| i64::from_be_bytes(bytes[from..from + 8].try_into().unwrap());
        let len = u32::from_be_bytes(bytes[at + 16..at + 20].try_into().unwrap()) as usize;
        sessions.push(Session {
            start_ms: int(at),
            end_ms: int(at + 8),
            acc: bytes[at + 20..at + 20 + len].to_vec(),
        });
        at += 20 + len;
    }
    sessions
}

fn write_sessions(state: &State, key: &[u8], sessions: &[Session]) {
    if sessions.is_empty() {
        return state.delete(&session_key(key));
    }
    let mut bytes = Vec::new();
    for s in sessions {
        bytes.extend_from_slice(&s.start_ms.to_be_bytes());
        bytes.extend_from_slice(&s.end_ms.to_be_bytes());
        bytes.extend_from_slice(&(s.acc.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&s.acc);
    }
    state.set(&session_key(key), &bytes)
}

/// A window this batch changed: emitted early unless it closes too.
struct Touched {
    index: u32,
    partition: (String, i32),
    key: Vec<u8>,
    end_ms: i64,
}

impl Touched {
    fn of<I>(event: &Event<'_, '_, I>, end_ms: i64) -> Touched {
        Touched {
            index: event.record.index,
            partition: (event.record.topic.to_string(), event.record.partition),
            key: event.key.to_vec(),
            end_ms,
        }
    }
}

/// A record on its way into its windows.
struct Event<'r, 'a, I> {
    record: &'a Record<'r>,
    key: &'a [u8],
    /// Its event time.
    time: i64,
    input: &'a I,
    /// The watermark just before it.
    watermark: Option<i64>,
}

impl<G: Aggregate> Windowed<G> {
    pub fn new(windows: Windows, aggregate: G) -> Self {
        Windowed {
            windows,
            aggregate,
            early: false,
        }
    }

    /// Also hands out every open window a batch changed, as
    /// [`Emit::Early`], before its final value.
    pub fn early(mut self, early: bool) -> Self {
        self.early = early;
        self
    }

    /// Runs a batch: `take` says once per record what it brings (its key,
    /// event time and aggregate input), or that it is in no window
    /// (ignored or rejected: either way it does not move the watermark, so
    /// a malformed record's Kafka timestamp cannot close windows). Each
    /// event goes into its windows, or becomes a `late` dead letter; then
    /// every window the watermark passed is handed to `emit` once, as
    /// final (and, with [`Windowed::early`], every other window the batch
    /// changed as early).
    pub fn run(
        &self,
        batch: &Batch,
        out: &mut Output,
        mut take: impl FnMut(&Record<'_>) -> Taken<G::Input>,
        mut emit: impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        let mut touched = self.early.then(Vec::new);
        for record in batch.records() {
            let (key, time_ms, input) = match take(&record) {
                Taken::Event {
                    key,
                    time_ms,
                    input,
                } => (key, time_ms, input),
                Taken::Ignored => {
                    record.time().clear_event_time();
                    continue;
                }
                Taken::Rejected(reason) => {
                    record.time().clear_event_time();
                    out.reject(&record, &reason);
                    continue;
                }
            };
            let time = match time_ms {
                Some(t) => {
                    record.time().set_event_time(t);
                    t
                }
                None => record.timestamp,
            };
            let event = Event {
                record: &record,
                key: &key,
                time,
                input: &input,
                watermark: record.time().watermark(),
            };
            let added = match self.windows {
                Windows::Session { gap_ms } => self.add_to_session(&event, gap_ms, &mut touched),
                _ => self.add_to_windows(&event, &mut touched),
            };
            if !added {
                record.time().late(&format!(
                    "event time {time} is behind the watermark {:?}: its window has closed",
                    event.watermark
                ));
            }
        }
        let fired = crate::due_timers();
        for timer in &fired {
            self.close(batch, timer, out, &mut emit);
        }
        if let Some(touched) = touched {
            self.emit_early(batch, touched, out, &mut emit);
        }
    }

    /// The windows `time` falls in, as (start, end).
    fn windows_of(&self, time: i64) -> Vec<(i64, i64)> {
        let (size, hop) = match self.windows {
            Windows::Tumbling { size_ms } => (size_ms, size_ms),
            Windows::Hopping { size_ms, hop_ms } => (size_ms, hop_ms),
            Windows::Session { .. } => unreachable!("sessions are not aligned"),
        };
        let last_start = time - time.rem_euclid(hop);
        let mut windows = Vec::new();
        let mut start = last_start;
        while start > time - size {
            windows.push((start, start + size));
            start -= hop;
        }
        windows.reverse();
        windows
    }

    /// Adds `event` to each open window of its time; false if all closed.
    fn add_to_windows(
        &self,
        event: &Event<'_, '_, G::Input>,
        touched: &mut Option<Vec<Touched>>,
    ) -> bool {
        let record = event.record;
        let state = record.state();
        let mut added = false;
        for (_, end) in self.windows_of(event.time) {
            if event.watermark.is_some_and(|w| end - 1 <= w) {
                continue;
            }
            let at = window_key(end, event.key);
            let mut acc = match state.get(&at) {
                Some(bytes) => G::Acc::from_bytes(&bytes).unwrap_or_else(|| self.aggregate.init()),
                None => {
                    record.time().set_timer(event.key, end - 1);
                    self.aggregate.init()
                }
            };
            self.aggregate.add(&mut acc, event.input);
            state.set(&at, &acc.to_bytes());
            if let Some(touched) = touched {
                touched.push(Touched::of(event, end));
            }
            added = true;
        }
        added
    }

    /// Adds `event` to a session of its key: a new one, merged with the
    /// open sessions it touches; false if the merged session has closed.
    fn add_to_session(
        &self,
        event: &Event<'_, '_, G::Input>,
        gap_ms: i64,
        touched: &mut Option<Vec<Touched>>,
    ) -> bool {
        let (record, key, time, watermark) = (event.record, event.key, event.time, event.watermark);
        let state = record.state();
        let sessions = read_sessions(&state, key);
        let (mut start, mut end) = (time, time + gap_ms);
        // A session the watermark has passed is closed, though its timer
        // fires only at the batch's end: nothing joins it.
        let open = |s: &Session| watermark.is_none_or(|w| s.end_ms - 1 > w);
        let (meets, apart): (Vec<Session>, Vec<Session>) = sessions
            .into_iter()
            .partition(|s| open(s) && s.start_ms < time + gap_ms && time < s.end_ms);
        for s in &meets {
            start = start.min(s.start_ms);
            end = end.max(s.end_ms);
        }
        if watermark.is_some_and(|w| end - 1 <= w) {
            return false;
        }
        let mut acc = self.aggregate.init();
        self.aggregate.add(&mut acc, event.input);
        for s in meets {
            if s.end_ms != end {
                record.time().delete_timer(key, s.end_ms - 1);
            }
            if let Some(other) = G::Acc::from_bytes(&s.acc) {
                self.aggregate.merge(&mut acc, other);
            }
        }
        record.time().set_timer(key, end - 1);
        let mut sessions = apart;
        sessions.push(Session {
            start_ms: start,
            end_ms: end,
            acc: acc.to_bytes(),
        });
        sessions.sort_by_key(|s| s.start_ms);
        write_sessions(&state, key, &sessions);
        if let Some(touched) = touched {
            touched.push(Touched::of(event, end));
        }
        true
    }

    /// Hands out the window `timer` closes, as final, and forgets it.
    fn close(
        &self,
        batch: &Batch,
        timer: &FiredTimer,
        out: &mut Output,
        emit: &mut impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        let state = timer.state();
        let end = timer.at_ms + 1;
        let closed = match self.windows {
            Windows::Session { .. } => {
                let mut sessions = read_sessions(&state, &timer.key);
                let Some(at) = sessions.iter().position(|s| s.end_ms == end) else {
                    return;
                };
                let session = sessions.remove(at);
                write_sessions(&state, &timer.key, &sessions);
                (session.start_ms, session.acc)
            }
            Windows::Tumbling { size_ms } | Windows::Hopping { size_ms, .. } => {
                let at = window_key(end, &timer.key);
                let Some(bytes) = state.get(&at) else { return };
                state.delete(&at);
                (end - size_ms, bytes)
            }
        };
        let Some(acc) = G::Acc::from_bytes(&closed.1) else {
            return;
        };
        let (topic, partition) = batch.partition_of(timer.index).unwrap_or_default();
        emit(
            out,
            WindowValue {
                topic,
                partition,
                key: &timer.key,
                start_ms: closed.0,
                end_ms: end,
                acc: &acc,
                emit: Emit::Final,
                state,
            },
        );
    }

    /// Hands out, as early, each window the batch changed that is still
    /// open (a closed one's value is gone), once, in the order first
    /// changed.
    fn emit_early(
        &self,
        batch: &Batch,
        touched: Vec<Touched>,
        out: &mut Output,
        emit: &mut impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        let mut seen = std::collections::HashSet::new();
        for t in touched {
            let state = State { index: t.index };
            if !seen.insert((t.partition, t.key.clone(), t.end_ms)) {
                continue;
            }
            let (start, bytes) = match self.windows {
                Windows::Session { .. } => {
                    let sessions = read_sessions(&state, &t.key);
                    let Some(s) = sessions.into_iter().find(|s| s.end_ms == t.end_ms) else {
                        continue;
                    };
                    (s.start_ms, s.acc)
                }
                Windows::Tumbling { size_ms } | Windows::Hopping { size_ms, .. } => {
                    let Some(bytes) = state.get(&window_key(t.end_ms, &t.key)) else {
                        continue;
                    };
                    (t.end_ms - size_ms, bytes)
                }
            };
            let Some(acc) = G::Acc::from_bytes(&bytes) else {
                continue;
            };
            let (topic, partition) = batch.partition_of(t.index).unwrap_or_default();
            emit(
                out,
                WindowValue {
                    topic,
                    partition,
                    key: &t.key,
                    start_ms: start,
                    end_ms: t.end_ms,
                    acc: &acc,
                    emit: Emit::Early,
                    state,
                },
            );
        }
    }
}

//! Event-time windows on keyed state and timers: tumbling, hopping and
//! session windows per user key, each with a user aggregate, emitted once
//! when the partition's watermark passes their end (and, optionally, early
//! on every batch that changes them). A record whose windows have all
//! closed is a dead letter of kind `late`, never dropped, or, with a
//! retention, updates a window that closed less than the retention ago.
//!
//! It owns the window layout in state, which every SDK keeps alike (so one
//! windowed transform gives one digest in any language; docs/event-time.md):
//!
//! - tumbling and hopping: the timer (`key`, `end - 1`) closes window
//!   `[start, end)` of `key` and keeps its aggregate as its value, after a
//!   tag byte 1 (one stored entry a window). A timer whose value is empty
//!   holds no window (a retention's, below) or one opened before timer
//!   values, whose aggregate is under `sluice/w/` + end (8 bytes,
//!   big-endian, sign bit flipped) + `key`: read from there, and moved
//!   into the timer on its next change;
//! - sessions: every open session of `key` under `sluice/s/` + `key`, per
//!   session its start and end (8 bytes each, big-endian) and its
//!   aggregate's length (4 bytes, big-endian) and bytes, in start order; a
//!   timer (`key`, `end - 1`) per session closes it;
//! - with a retention `R`: a closed window's aggregate under `sluice/r/` +
//!   end + `key`, a closed session under `sluice/t/` + `key` (the layout of
//!   open ones); a timer (`key`, `end - 1 + R`) forgets it (set without a
//!   value, unless that timer exists already: it may hold a window).
//!
//! A window `[start, end)` closes when the watermark reaches `end - 1` (its
//! last millisecond), judged per record (the watermark just before it);
//! a record is late when every window it falls in has closed (for
//! sessions: the session it would make, merged with the open ones it
//! touches). Closed windows are handed out at the end of the batch that
//! closed them. So what each window holds and which records are late do
//! not depend on where batches begin and end. With a retention, a late
//! record updates each of its windows whose end - 1 + R is past the
//! watermark (a session: the closed one whose span, first record to last,
//! holds its time, so a closed session's bounds never move); a window a
//! late record reaches before its timer fired is closed right then, with
//! the value it had, so its final value does not depend on batches either.
//!
//! What it costs a record: a host call for its event time; the host's
//! watermark only when one of its windows may have closed (`ceiling`); a
//! tumbling or hopping window is read from its timer and written back
//! once a batch (`held`), whatever the number of its records.
//!
//! It must not read the host's clock or keep anything between batches
//! outside state.

mod ceiling;
mod held;

use crate::{Batch, FiredTimer, Output, Record, State, Time};
use ceiling::{Ceilings, Watermark};
use held::HeldWindows;

const WINDOW_PREFIX: &[u8] = b"sluice/w/";
const SESSION_PREFIX: &[u8] = b"sluice/s/";
const RETAINED_PREFIX: &[u8] = b"sluice/r/";
const RETAINED_SESSION_PREFIX: &[u8] = b"sluice/t/";

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

/// An aggregate's running value, as state keeps it. `from_bytes` must give
/// back what `to_bytes` was given: a batch keeps each window's value in
/// memory and state keeps its bytes between batches, so a value that does
/// not survive the round trip would depend on where batches end.
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
    /// Late records changed the closed window (with [`Windowed::retain`]):
    /// its value with them, once per batch that changed it.
    Update,
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
    /// How long (event time) a closed window takes late records; 0: none.
    retain_ms: i64,
}

/// `at` as 8 bytes that sort as the numbers do.
fn ordered(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

/// The tag before a window's aggregate in its closing timer's value.
const WINDOW_TAG: u8 = 1;

/// Where a window opened before timer values keeps its aggregate.
fn window_key(end_ms: i64, key: &[u8]) -> Vec<u8> {
    [WINDOW_PREFIX, &ordered(end_ms), key].concat()
}

/// The aggregate a closing timer's value holds, if it holds one.
fn tagged(value: &[u8]) -> Option<&[u8]> {
    match value.split_first() {
        Some((&WINDOW_TAG, acc)) => Some(acc),
        _ => None,
    }
}

/// The aggregate of `key`'s window ending at `end_ms` kept by the
/// timer's `value` or, for a window opened before timer values, under its
/// old key (removed when `take`, as its timer is about to hold it).
fn window_in(state: &State, value: &[u8], key: &[u8], end_ms: i64, take: bool) -> Option<Vec<u8>> {
    if let Some(acc) = tagged(value) {
        return Some(acc.to_vec());
    }
    let at = window_key(end_ms, key);
    let bytes = state.get(&at)?;
    if take {
        state.delete(&at);
    }
    Some(bytes)
}

/// The aggregate of `key`'s open window ending at `end_ms`: `None` if no
/// timer closes one there.
fn open_window(state: &State, key: &[u8], end_ms: i64, take: bool) -> Option<Vec<u8>> {
    let time = Time { index: state.index };
    let mut value = time.timer_value(key, end_ms - 1)?;
    if tagged(&value).is_some() {
        // The aggregate in place, without a copy.
        value.remove(0);
        return Some(value);
    }
    window_in(state, &value, key, end_ms, take)
}

/// Keeps `acc` as the value of the timer closing `key`'s window ending at
/// `end_ms`.
fn keep_open(time: &Time, key: &[u8], end_ms: i64, acc: &[u8]) {
    let value = [&[WINDOW_TAG][..], acc].concat();
    time.set_timer_value(key, end_ms - 1, &value);
}

/// Sets a timer without a value (a retention's), unless the timer exists:
/// it may hold a window, and fires at the same time anyway.
fn set_bare_timer(time: &Time, key: &[u8], at_ms: i64) {
    if time.timer_value(key, at_ms).is_none() {
        time.set_timer(key, at_ms);
    }
}

fn retained_key(end_ms: i64, key: &[u8]) -> Vec<u8> {
    [RETAINED_PREFIX, &ordered(end_ms), key].concat()
}

fn session_key(key: &[u8]) -> Vec<u8> {
    [SESSION_PREFIX, key].concat()
}

fn retained_session_key(key: &[u8]) -> Vec<u8> {
    [RETAINED_SESSION_PREFIX, key].concat()
}

/// One open session of a key.
struct Session {
    start_ms: i64,
    end_ms: i64,
    acc: Vec<u8>,
}

/// The sessions under `at` (`session_key` or `retained_session_key`).
fn read_sessions(state: &State, at: &[u8]) -> Vec<Session> {
    let bytes = state.get(at).unwrap_or_default();
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

fn write_sessions(state: &State, at: &[u8], sessions: &[Session]) {
    if sessions.is_empty() {
        return state.delete(at);
    }
    let mut bytes = Vec::new();
    for s in sessions {
        bytes.extend_from_slice(&s.start_ms.to_be_bytes());
        bytes.extend_from_slice(&s.end_ms.to_be_bytes());
        bytes.extend_from_slice(&(s.acc.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&s.acc);
    }
    state.set(at, &bytes)
}

/// A window this batch changed: emitted early unless it closes too, or
/// updated if it had closed.
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

/// A window handed out as it was when it closed.
struct Closed {
    index: u32,
    key: Vec<u8>,
    start_ms: i64,
    end_ms: i64,
    acc: Vec<u8>,
}

/// Where a window is kept: open, or closed and retained for late records.
#[derive(Clone, Copy)]
enum Kept {
    Open,
    Retained,
}

/// What a batch's records leave to write and hand out at its end.
struct Pending<A> {
    /// The open tumbling and hopping windows the batch changed.
    held: HeldWindows<A>,
    /// Open windows the batch changed (with early rows).
    early: Option<Vec<Touched>>,
    /// Windows a late record reached before their timer closed them:
    /// their final values.
    closed: Vec<Closed>,
    /// Closed windows late records updated (with a retention).
    updated: Vec<Touched>,
}

/// A record on its way into its windows.
struct Event<'r, 'a, I> {
    record: &'a Record<'r>,
    /// Its partition's slot in the batch.
    slot: usize,
    key: &'a [u8],
    /// Its event time.
    time: i64,
    input: &'a I,
    /// The watermark just before it.
    watermark: Watermark,
}

impl<G: Aggregate> Windowed<G> {
    pub fn new(windows: Windows, aggregate: G) -> Self {
        Windowed {
            windows,
            aggregate,
            early: false,
            retain_ms: 0,
        }
    }

    /// Also hands out every open window a batch changed, as
    /// [`Emit::Early`], before its final value.
    pub fn early(mut self, early: bool) -> Self {
        self.early = early;
        self
    }

    /// Keeps each closed window `retain_ms` more of event time: a record
    /// behind the watermark whose window ended less than `retain_ms`
    /// before it updates the window (handed out again as
    /// [`Emit::Update`], once per batch) instead of becoming a `late` dead
    /// letter. A late record updates a closed session only if its time is
    /// within the session's records (first to last), so a closed
    /// session's bounds never move. 0 (the default): no updates.
    pub fn retain(mut self, retain_ms: i64) -> Self {
        self.retain_ms = retain_ms.max(0);
        self
    }

    /// Runs a batch: `take` says once per record what it brings (its key,
    /// event time and aggregate input), or that it is in no window
    /// (ignored or rejected: either way it does not move the watermark, so
    /// a malformed record's Kafka timestamp cannot close windows). Each
    /// event goes into its windows, or updates retained ones, or becomes a
    /// `late` dead letter; then every window the watermark passed is
    /// handed to `emit` once, as final, every retained window late records
    /// changed as an update (and, with [`Windowed::early`], every open
    /// window the batch changed as early).
    pub fn run(
        &self,
        batch: &Batch,
        out: &mut Output,
        mut take: impl FnMut(&Record<'_>) -> Taken<G::Input>,
        mut emit: impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        let mut pending = Pending {
            held: HeldWindows::new(batch.context.seed),
            early: self.early.then(Vec::new),
            closed: Vec::new(),
            updated: Vec::new(),
        };
        let mut ceilings = Ceilings::default();
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
            let slot = ceilings.slot(&record);
            let event = Event {
                record: &record,
                slot,
                key: &key,
                time,
                input: &input,
                watermark: ceilings.before(slot, &record),
            };
            let added = match self.windows {
                Windows::Session { gap_ms } => self.add_to_session(&event, gap_ms, &mut pending),
                _ => self.add_to_windows(&event, &mut pending),
            };
            if !added {
                record.time().late(&format!(
                    "event time {time} is behind the watermark {:?}: its window has closed",
                    event.watermark.get()
                ));
            }
            ceilings.passed(slot, &event.watermark, time);
        }
        self.finish(batch, pending, out, &mut emit);
    }

    /// The batch's end: writes back the windows it holds, moves the
    /// watermarks past its records, then hands out the finals of windows
    /// late records closed, the updates (before the timers: one may forget
    /// a window this batch updated), the windows the due timers close, and
    /// the early rows.
    fn finish(
        &self,
        batch: &Batch,
        mut pending: Pending<G::Acc>,
        out: &mut Output,
        emit: &mut impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        pending.held.write_back();
        let fired = crate::due_timers();
        for closed in pending.closed {
            let state = State {
                index: closed.index,
            };
            self.hand_out(batch, out, emit, &closed, Emit::Final, state);
        }
        self.emit_changed(batch, pending.updated, Emit::Update, out, emit);
        for timer in &fired {
            self.close(batch, timer, out, emit);
        }
        if let Some(touched) = pending.early {
            self.emit_changed(batch, touched, Emit::Early, out, emit);
        }
    }

    /// The windows `time` falls in, as (start, end), in start order.
    fn windows_of(&self, time: i64) -> impl Iterator<Item = (i64, i64)> + use<G> {
        let (size, hop) = match self.windows {
            Windows::Tumbling { size_ms } => (size_ms, size_ms),
            Windows::Hopping { size_ms, hop_ms } => (size_ms, hop_ms),
            Windows::Session { .. } => unreachable!("sessions are not aligned"),
        };
        let last_start = time - time.rem_euclid(hop);
        // How many windows start before the last and after `time - size`
        // (negative: `time` falls between windows).
        let earlier = (last_start - (time - size) - 1).div_euclid(hop);
        (0..=earlier).rev().map(move |i| {
            let start = last_start - i * hop;
            (start, start + size)
        })
    }

    /// Whether a window ending at `end_ms`, closed by `watermark`, still
    /// takes late records.
    fn retained(&self, end_ms: i64, watermark: Option<i64>) -> bool {
        self.retain_ms > 0 && watermark.is_some_and(|w| end_ms - 1 + self.retain_ms > w)
    }

    /// Adds `event` to each open window of its time, and to each retained
    /// closed one; false if it reached none.
    fn add_to_windows(
        &self,
        event: &Event<'_, '_, G::Input>,
        pending: &mut Pending<G::Acc>,
    ) -> bool {
        let state = event.record.state();
        let mut added = false;
        for (start, end) in self.windows_of(event.time) {
            if event.watermark.reached(end - 1) {
                added |= self.update_closed_window(event, (start, end), pending);
                continue;
            }
            let (slot, key, init) = (event.slot, event.key, || self.aggregate.init());
            let held = pending.held.get_mut(slot, &state, key, end, init);
            self.aggregate.add(held, event.input);
            if let Some(touched) = &mut pending.early {
                touched.push(Touched::of(event, end));
            }
            added = true;
        }
        added
    }

    /// Adds the late `event` to the closed window `(start, end)` if it is
    /// retained (closing it first if its timer has not yet).
    fn update_closed_window(
        &self,
        event: &Event<'_, '_, G::Input>,
        (start, end): (i64, i64),
        pending: &mut Pending<G::Acc>,
    ) -> bool {
        if !self.retained(end, event.watermark.get()) {
            return false;
        }
        let state = event.record.state();
        let at = retained_key(end, event.key);
        let bytes = match state.get(&at) {
            Some(bytes) => Some(bytes),
            None => {
                let time = event.record.time();
                let bytes = pending.held.take(event.slot, &state, event.key, end);
                if let Some(acc) = &bytes {
                    // Its timer stays, without the window: it may also
                    // forget a retained one.
                    time.set_timer(event.key, end - 1);
                    pending.closed.push(Closed {
                        index: event.record.index,
                        key: event.key.to_vec(),
                        start_ms: start,
                        end_ms: end,
                        acc: acc.clone(),
                    });
                }
                set_bare_timer(&time, event.key, end - 1 + self.retain_ms);
                bytes
            }
        };
        let mut acc = (bytes.as_deref())
            .and_then(G::Acc::from_bytes)
            .unwrap_or_else(|| self.aggregate.init());
        self.aggregate.add(&mut acc, event.input);
        state.set(&at, &acc.to_bytes());
        pending.updated.push(Touched::of(event, end));
        true
    }

    /// Adds `event` to a session of its key: a new one, merged with the
    /// open sessions it touches, or, if that has closed, a retained closed
    /// one; false if none takes it.
    fn add_to_session(
        &self,
        event: &Event<'_, '_, G::Input>,
        gap_ms: i64,
        pending: &mut Pending<G::Acc>,
    ) -> bool {
        let (record, key, time) = (event.record, event.key, event.time);
        let watermark = event.watermark.get();
        let state = record.state();
        let sessions = read_sessions(&state, &session_key(key));
        // A session the watermark has passed is closed, though its timer
        // fires only at the batch's end: nothing joins it.
        let open = |s: &Session| watermark.is_none_or(|w| s.end_ms - 1 > w);
        let meets = |s: &Session| open(s) && s.start_ms < time + gap_ms && time < s.end_ms;
        let (mut start, mut end) = (time, time + gap_ms);
        for s in sessions.iter().filter(|s| meets(s)) {
            start = start.min(s.start_ms);
            end = end.max(s.end_ms);
        }
        if watermark.is_some_and(|w| end - 1 <= w) {
            return self.update_closed_session(event, gap_ms, sessions, pending);
        }
        let (meets, apart): (Vec<Session>, Vec<Session>) = sessions.into_iter().partition(meets);
        let mut acc = self.aggregate.init();
        self.aggregate.add(&mut acc, event.input);
        for s in meets {
            // With a retention, the timer may also forget a closed session.
            if s.end_ms != end && self.retain_ms == 0 {
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
        write_sessions(&state, &session_key(key), &sessions);
        if let Some(touched) = &mut pending.early {
            touched.push(Touched::of(event, end));
        }
        true
    }

    /// Adds the late `event` to the retained closed session of its key
    /// whose records' span holds its time (closing it first if its timer
    /// has not yet: `sessions` are the key's open ones); false if none.
    fn update_closed_session(
        &self,
        event: &Event<'_, '_, G::Input>,
        gap_ms: i64,
        mut sessions: Vec<Session>,
        pending: &mut Pending<G::Acc>,
    ) -> bool {
        let (record, key, time) = (event.record, event.key, event.time);
        let watermark = event.watermark.get();
        let holds = |s: &Session| {
            self.retained(s.end_ms, watermark) && s.start_ms <= time && time <= s.end_ms - gap_ms
        };
        let state = record.state();
        let mut retained = read_sessions(&state, &retained_session_key(key));
        let at = match retained.iter().position(holds) {
            Some(at) => at,
            None => {
                let closed = |s: &Session| watermark.is_some_and(|w| s.end_ms - 1 <= w);
                let Some(at) = sessions.iter().position(|s| closed(s) && holds(s)) else {
                    return false;
                };
                let session = sessions.remove(at);
                write_sessions(&state, &session_key(key), &sessions);
                pending.closed.push(Closed {
                    index: record.index,
                    key: key.to_vec(),
                    start_ms: session.start_ms,
                    end_ms: session.end_ms,
                    acc: session.acc.clone(),
                });
                (record.time()).set_timer(key, session.end_ms - 1 + self.retain_ms);
                retained.push(session);
                retained.sort_by_key(|s| s.start_ms);
                retained.iter().position(holds).expect("just retained")
            }
        };
        let session = &mut retained[at];
        let mut acc = G::Acc::from_bytes(&session.acc).unwrap_or_else(|| self.aggregate.init());
        self.aggregate.add(&mut acc, event.input);
        session.acc = acc.to_bytes();
        let end = session.end_ms;
        write_sessions(&state, &retained_session_key(key), &retained);
        pending.updated.push(Touched::of(event, end));
        true
    }

    /// Hands out the window `timer` closes, as final, keeping it if there
    /// is a retention; forgets the retained window it ends.
    fn close(
        &self,
        batch: &Batch,
        timer: &FiredTimer,
        out: &mut Output,
        emit: &mut impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        let state = timer.state();
        let end = timer.at_ms + 1;
        if self.retain_ms > 0 {
            // Forgets the retained window whose retention ends here.
            let retained_end = end - self.retain_ms;
            self.find(&state, &timer.key, retained_end, Kept::Retained, true);
        }
        let window = match self.windows {
            Windows::Session { .. } => self.find(&state, &timer.key, end, Kept::Open, true),
            Windows::Tumbling { size_ms } | Windows::Hopping { size_ms, .. } => {
                window_in(&state, &timer.value, &timer.key, end, true)
                    .map(|acc| (end - size_ms, acc))
            }
        };
        let Some((start_ms, acc)) = window else {
            return;
        };
        let closed = Closed {
            index: timer.index,
            key: timer.key.clone(),
            start_ms,
            end_ms: end,
            acc,
        };
        if self.retain_ms > 0 {
            self.keep_closed(&state, &closed);
            let at_ms = timer.at_ms + self.retain_ms;
            match self.windows {
                Windows::Session { .. } => timer.time().set_timer(&timer.key, at_ms),
                _ => set_bare_timer(&timer.time(), &timer.key, at_ms),
            }
        }
        self.hand_out(batch, out, emit, &closed, Emit::Final, state);
    }

    /// The window of `key` ending at `end_ms` kept at `kept`: its start
    /// and bytes, removed from state when `take`.
    fn find(
        &self,
        state: &State,
        key: &[u8],
        end_ms: i64,
        kept: Kept,
        take: bool,
    ) -> Option<(i64, Vec<u8>)> {
        match self.windows {
            Windows::Session { .. } => {
                let at = match kept {
                    Kept::Open => session_key(key),
                    Kept::Retained => retained_session_key(key),
                };
                let mut sessions = read_sessions(state, &at);
                let found = sessions.iter().position(|s| s.end_ms == end_ms)?;
                let session = sessions.remove(found);
                if take {
                    write_sessions(state, &at, &sessions);
                }
                Some((session.start_ms, session.acc))
            }
            Windows::Tumbling { size_ms } | Windows::Hopping { size_ms, .. } => {
                let bytes = match kept {
                    Kept::Open => open_window(state, key, end_ms, take)?,
                    Kept::Retained => {
                        let at = retained_key(end_ms, key);
                        let bytes = state.get(&at)?;
                        if take {
                            state.delete(&at);
                        }
                        bytes
                    }
                };
                Some((end_ms - size_ms, bytes))
            }
        }
    }

    /// Keeps a closed window for late records.
    fn keep_closed(&self, state: &State, closed: &Closed) {
        match self.windows {
            Windows::Session { .. } => {
                let at = retained_session_key(&closed.key);
                let mut retained = read_sessions(state, &at);
                retained.push(Session {
                    start_ms: closed.start_ms,
                    end_ms: closed.end_ms,
                    acc: closed.acc.clone(),
                });
                retained.sort_by_key(|s| s.start_ms);
                write_sessions(state, &at, &retained);
            }
            _ => state.set(&retained_key(closed.end_ms, &closed.key), &closed.acc),
        }
    }

    /// Hands `window` to `emit` as `why`.
    fn hand_out(
        &self,
        batch: &Batch,
        out: &mut Output,
        emit: &mut impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
        window: &Closed,
        why: Emit,
        state: State,
    ) {
        let Some(acc) = G::Acc::from_bytes(&window.acc) else {
            return;
        };
        let (topic, partition) = batch.partition_of(window.index).unwrap_or_default();
        emit(
            out,
            WindowValue {
                topic,
                partition,
                key: &window.key,
                start_ms: window.start_ms,
                end_ms: window.end_ms,
                acc: &acc,
                emit: why,
                state,
            },
        );
    }

    /// Hands out, as `why`, each window the batch changed (early: still
    /// open; update: still retained), once, in the order first changed.
    fn emit_changed(
        &self,
        batch: &Batch,
        touched: Vec<Touched>,
        why: Emit,
        out: &mut Output,
        emit: &mut impl FnMut(&mut Output, WindowValue<'_, G::Acc>),
    ) {
        let mut seen = std::collections::HashSet::new();
        for t in touched {
            if !seen.insert((t.partition.clone(), t.key.clone(), t.end_ms)) {
                continue;
            }
            let state = State { index: t.index };
            let kept = match why {
                Emit::Update => Kept::Retained,
                _ => Kept::Open,
            };
            let Some((start_ms, acc)) = self.find(&state, &t.key, t.end_ms, kept, false) else {
                continue;
            };
            let window = Closed {
                index: t.index,
                key: t.key,
                start_ms,
                end_ms: t.end_ms,
                acc,
            };
            self.hand_out(batch, out, emit, &window, why, state);
        }
    }
}

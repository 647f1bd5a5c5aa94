//! Event time as keyed state: where a partition's watermark and timers are
//! kept (host keys, starting with [`HOST_KEY_BYTE`], in the partition's
//! own state, so they commit, fence, replay and move with it like any
//! key), how they are encoded, and one run's event-time view
//! ([`RunClock`]: the watermarks its partitions started from, its records'
//! event times, the timers it fired and the records it found late).
//!
//! A partition's watermark is the highest event time of its records so
//! far minus `event_time.allowed_lateness_ms`; it never comes from the
//! host's clock. Which timers are due is read through the batch's state
//! base under a [`due_key`] (the host's answer for "timers at or before
//! this watermark"), so it is recorded with the batch's reads and a
//! replay is served the same list.
//!
//! It must not know where timers are stored or indexed: the pipeline's
//! state cache answers due keys, a replay its recorded reads.

use crate::state::{MAX_KEY_BYTES, StateError};

/// First byte of every host key: a module's state call with a key that
/// starts with it is refused.
pub const HOST_KEY_BYTE: u8 = 0xFF;
/// The partition's watermark (8 bytes, big-endian i64 ms).
pub const WATERMARK_KEY: &[u8] = b"\xFFw";
/// Timers: this, the time (8 bytes, ordered) and the timer's key.
const TIMER_PREFIX: &[u8] = b"\xFFt";
/// Due lists: this and the watermark (8 bytes, ordered); never stored.
const DUE_PREFIX: &[u8] = b"\xFFd";
/// Longest timer key, in bytes: a state key's bound less the prefix and time.
pub const MAX_TIMER_KEY_BYTES: usize = MAX_KEY_BYTES - 2 - 8;

/// How the host keeps a record that must not move the watermark (the
/// module set no event time for it: one no window takes). A record's time
/// is never this otherwise: the lowest time moves no watermark either.
pub const NO_TIME: i64 = i64::MIN;

/// A timer: a key the module chose and when it comes due.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timer {
    pub at_ms: i64,
    pub key: Vec<u8>,
}

/// `at` as 8 bytes that sort as the numbers do.
fn ordered(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

fn unordered(bytes: &[u8]) -> i64 {
    (u64::from_be_bytes(bytes.try_into().expect("8 bytes")) ^ (1 << 63)) as i64
}

/// The prefix every stored timer's state key starts with.
pub fn timer_prefix() -> &'static [u8] {
    TIMER_PREFIX
}

impl Timer {
    /// The state key the timer is stored under (its value is what
    /// `set-timer-value` kept with it, empty for `set-timer`).
    pub fn state_key(&self) -> Vec<u8> {
        let mut key = Vec::with_capacity(10 + self.key.len());
        key.extend_from_slice(TIMER_PREFIX);
        key.extend_from_slice(&ordered(self.at_ms));
        key.extend_from_slice(&self.key);
        key
    }

    /// The timer a state key holds, if it is a timer's.
    pub fn from_state_key(key: &[u8]) -> Option<Timer> {
        Some(Timer {
            at_ms: Timer::time_of_state_key(key)?,
            key: key[TIMER_PREFIX.len() + 8..].to_vec(),
        })
    }

    /// When the timer a state key holds comes due, if it is a timer's:
    /// [`Timer::from_state_key`] without copying the timer's key, for
    /// filters that look at every state change of a batch.
    pub fn time_of_state_key(key: &[u8]) -> Option<i64> {
        let rest = key.strip_prefix(TIMER_PREFIX)?;
        (rest.len() >= 8).then(|| unordered(&rest[..8]))
    }
}

/// The key a run reads the due timers of a partition under: every stored
/// timer at or before `watermark`.
pub fn due_key(watermark: i64) -> Vec<u8> {
    let mut key = DUE_PREFIX.to_vec();
    key.extend_from_slice(&ordered(watermark));
    key
}

/// The watermark a [`due_key`] asks for, if it is one.
pub fn parse_due_key(key: &[u8]) -> Option<i64> {
    let rest = key.strip_prefix(DUE_PREFIX)?;
    (rest.len() == 8).then(|| unordered(rest))
}

/// A due list as a state value: per timer its time, key length and key.
pub fn encode_timers(timers: &[Timer]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in timers {
        out.extend_from_slice(&t.at_ms.to_be_bytes());
        out.extend_from_slice(&(t.key.len() as u32).to_be_bytes());
        out.extend_from_slice(&t.key);
    }
    out
}

/// Reads back what [`encode_timers`] wrote.
pub fn decode_timers(mut bytes: &[u8]) -> Result<Vec<Timer>, StateError> {
    let corrupt = || StateError::Corrupt("a due timer list is cut short".into());
    let mut timers = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 12 {
            return Err(corrupt());
        }
        let at_ms = i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let key = bytes.get(12..12 + len).ok_or_else(corrupt)?.to_vec();
        bytes = &bytes[12 + len..];
        timers.push(Timer { at_ms, key });
    }
    Ok(timers)
}

/// A stored watermark's value.
pub fn encode_watermark(watermark: i64) -> Vec<u8> {
    watermark.to_be_bytes().to_vec()
}

/// Reads back what [`encode_watermark`] wrote.
pub fn decode_watermark(bytes: &[u8]) -> Result<i64, StateError> {
    let bytes: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StateError::Corrupt("a stored watermark is not 8 bytes".into()))?;
    Ok(i64::from_be_bytes(bytes))
}

/// How event time is judged (`[event_time]`); recorded with every batch,
/// so a replay moves watermarks alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventTimeSettings {
    /// How far behind a partition's highest event time its watermark is.
    pub allowed_lateness_ms: i64,
}

/// A timer handed to the module: its partition named by one of the run's
/// record indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredTimer {
    pub index: u32,
    pub timer: Timer,
    /// The value kept with it, when the module asked for values
    /// ([`FiredValues::Read`]); else empty.
    pub value: Vec<u8>,
}

/// Whether fired timers are handed out with their values: reading a
/// stored timer's value is a state read (recorded for replays), so a
/// module that does not ask for values (contract 0.1.2) makes none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiredValues {
    Leave,
    Read,
}

/// A record the module found late, with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateRecord {
    pub index: u32,
    pub reason: String,
}

/// One partition of a run, as event time sees it.
#[derive(Debug, Clone)]
pub(crate) struct PartitionClock {
    /// The watermark as the batch started (`None`: no record yet).
    pub(crate) started: Option<i64>,
    /// A record index of the partition, naming it in calls.
    pub(crate) index: u32,
    /// The highest event time of its records before `before` (what
    /// `watermark` calls in record order have seen so far).
    pub(crate) running: Option<i64>,
    pub(crate) before: u32,
}

impl PartitionClock {
    /// The watermark records whose highest event time is `highest` move
    /// the partition to.
    pub(crate) fn moved(&self, highest: Option<i64>, settings: EventTimeSettings) -> Option<i64> {
        let by_records = highest.map(|t| t.saturating_sub(settings.allowed_lateness_ms));
        self.started.max(by_records)
    }
}

/// A run's event time, made at its first `time` call: the partitions'
/// starting watermarks (read then, so a failed read stops the call, not
/// the run's end), its records' event times, the late records.
#[derive(Debug)]
pub(crate) struct RunClock {
    pub(crate) partitions: Vec<PartitionClock>,
    /// Event time per record of the run.
    pub(crate) times: Vec<i64>,
    pub(crate) late: Vec<LateRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_keys_sort_by_time_and_round_trip() {
        let t = |at_ms, key: &[u8]| Timer {
            at_ms,
            key: key.to_vec(),
        };
        let timers = [t(-5, b"z"), t(0, b""), t(7, b"a"), t(i64::MAX, b"k")];
        let keys: Vec<Vec<u8>> = timers.iter().map(Timer::state_key).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "ordered by time");
        for (timer, key) in timers.iter().zip(&keys) {
            assert_eq!(Timer::from_state_key(key).as_ref(), Some(timer));
        }
        assert_eq!(decode_timers(&encode_timers(&timers)).unwrap(), timers);
        assert!(decode_timers(&encode_timers(&timers)[..14]).is_err());
        assert_eq!(parse_due_key(&due_key(-9)), Some(-9));
        assert_eq!(parse_due_key(WATERMARK_KEY), None);
        assert_eq!(Timer::from_state_key(&due_key(3)), None);
        assert_eq!(decode_watermark(&encode_watermark(-3)).unwrap(), -3);
    }

    #[test]
    fn a_watermark_moves_by_records_never_back() {
        let settings = EventTimeSettings {
            allowed_lateness_ms: 10,
        };
        let clock = |started| PartitionClock {
            started,
            index: 0,
            running: None,
            before: 0,
        };
        assert_eq!(clock(None).moved(None, settings), None);
        assert_eq!(clock(None).moved(Some(100), settings), Some(90));
        assert_eq!(clock(Some(95)).moved(Some(100), settings), Some(95));
        assert_eq!(clock(Some(50)).moved(Some(100), settings), Some(90));
        assert_eq!(clock(Some(50)).moved(None, settings), Some(50));
    }
}

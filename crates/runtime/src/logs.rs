//! Module log lines: kept (the newest [`KEPT_LOG_LINES`] within
//! [`KEPT_LOG_BYTES`], numbered) for
//! `sluice logs` and the API, and re-emitted through `tracing` at their own
//! level, each line once per batch, however often the batch ran.
//!
//! A batch may run several times: retried after a deadline or a trap, and
//! bisected into parts to isolate a poison record. The lines of a run that
//! succeeded are kept at once. Those of a run that failed are held: a
//! later run of the same batch over any of the same records repeats them
//! (retry, bisection), so it discards them; a later run over other records
//! (the next part of a bisection) or the batch settling keeps them (a
//! record that failed on its own says why in them). So a record's lines
//! are kept from the last run that covered it.
//!
//! It must not run modules: the runtime hands it each run's lines.

use crate::batch::Records;
use crate::bindings::{LogLevel, ModuleLog};
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// Module log lines kept for `recent` (the newest; older ones go).
pub const KEPT_LOG_LINES: usize = 10_000;

/// Bytes of messages kept for `recent`: the newest lines within it.
pub const KEPT_LOG_BYTES: usize = 16 << 20;

/// Batches whose failed run's lines may be held at once; beyond, the
/// oldest is kept as it is (a caller that never settles cannot grow it).
const MAX_HELD: usize = 16;

/// A line a module logged (through the `log` import, or printed to stdout
/// or stderr), with the batch it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its place among every line this runtime kept, from 1: a reader
    /// asks for the lines after the last one it saw.
    pub seq: u64,
    pub batch_id: String,
    pub level: LogLevel,
    pub message: String,
    /// When the host kept it (its wall clock: for people, not the module).
    pub at_ms: i64,
}

/// Lines [`ModuleLogs::after`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPage {
    pub lines: Vec<LogLine>,
    /// The newest line kept (0 before any): where a follower goes on from
    /// when nothing matched.
    pub last_seq: u64,
    /// Lines after the asked-for one that are gone from the buffer (too
    /// old), so a reader knows it missed some.
    pub missed: u64,
}

/// A record of a run: topic, partition, offset.
type RecordId = (String, i32, i64);

/// The lines of a failed run, until it is known whether a later run
/// repeats them.
struct Held {
    batch_id: String,
    records: HashSet<RecordId>,
    lines: Vec<ModuleLog>,
}

#[derive(Default)]
struct State {
    lines: VecDeque<LogLine>,
    /// Bytes of the kept lines' messages.
    bytes: usize,
    next_seq: u64,
    held: VecDeque<Held>,
}

/// The runtime's module logs (shared by every batch it runs).
pub struct ModuleLogs {
    state: Mutex<State>,
}

impl Default for ModuleLogs {
    fn default() -> Self {
        ModuleLogs {
            state: Mutex::new(State {
                next_seq: 1,
                ..State::default()
            }),
        }
    }
}

fn ids(records: &Records) -> HashSet<RecordId> {
    records
        .iter()
        .map(|r| (r.topic.to_string(), r.partition, r.offset))
        .collect()
}

impl ModuleLogs {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lines of one run of batch `batch_id` over `records`, which
    /// `succeeded` or not (see the module header).
    pub fn run(&self, batch_id: &str, records: &Records, lines: Vec<ModuleLog>, succeeded: bool) {
        let mut state = self.state();
        // The run's record ids, made only if a held run or this one needs them.
        let mut covered = None;
        if let Some(at) = state.held.iter().position(|h| h.batch_id == batch_id) {
            let held = state.held.remove(at).expect("found");
            let covered = covered.insert(ids(records));
            // A run over any of the same records repeats these lines: they go.
            if held.records.is_disjoint(covered) {
                state.keep(batch_id, &held.lines);
            }
        }
        match succeeded {
            true => state.keep(batch_id, &lines),
            false if lines.is_empty() => {}
            false => {
                if state.held.len() == MAX_HELD {
                    let oldest = state.held.pop_front().expect("full");
                    state.keep(&oldest.batch_id, &oldest.lines);
                }
                state.held.push_back(Held {
                    batch_id: batch_id.to_string(),
                    records: covered.unwrap_or_else(|| ids(records)),
                    lines,
                });
            }
        }
    }

    /// Batch `batch_id` will not run again: keeps the lines still held
    /// (at most one run's: `run` replaces a batch's held lines).
    pub fn settle(&self, batch_id: &str) {
        let mut state = self.state();
        if let Some(at) = state.held.iter().position(|h| h.batch_id == batch_id) {
            let held = state.held.remove(at).expect("found");
            state.keep(batch_id, &held.lines);
        }
    }

    /// The newest kept lines (up to [`KEPT_LOG_LINES`]), oldest first.
    pub fn recent(&self) -> Vec<LogLine> {
        self.state().lines.iter().cloned().collect()
    }

    /// Up to `limit` kept lines after line `after` (0: from the oldest
    /// kept), of batch `batch` if given, oldest first.
    pub fn after(&self, after: u64, batch: Option<&str>, limit: usize) -> LogPage {
        let state = self.state();
        let oldest = state.lines.front().map_or(state.next_seq, |l| l.seq);
        let lines = state
            .lines
            .iter()
            .filter(|l| l.seq > after)
            .filter(|l| batch.is_none_or(|b| l.batch_id == b))
            .take(limit)
            .cloned()
            .collect();
        LogPage {
            lines,
            last_seq: state.next_seq - 1,
            missed: oldest.saturating_sub(after + 1),
        }
    }
}

impl State {
    /// Emits `lines` and keeps them, numbered.
    fn keep(&mut self, batch_id: &str, lines: &[ModuleLog]) {
        let at_ms = crate::batch::now_ms();
        for line in lines {
            emit(batch_id, line);
            self.bytes += line.message.len();
            while self.lines.len() >= KEPT_LOG_LINES
                || (self.bytes > KEPT_LOG_BYTES && !self.lines.is_empty())
            {
                let old = self.lines.pop_front().expect("not empty");
                self.bytes -= old.message.len();
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.lines.push_back(LogLine {
                seq,
                batch_id: batch_id.to_string(),
                level: line.level,
                message: line.message.clone(),
                at_ms,
            });
        }
    }
}

/// Re-emits a module's log line at its own level, marked as the module's.
fn emit(batch_id: &str, line: &ModuleLog) {
    let message = &line.message;
    match line.level {
        LogLevel::Debug => tracing::debug!(batch = %batch_id, "module: {message}"),
        LogLevel::Info => tracing::info!(batch = %batch_id, "module: {message}"),
        LogLevel::Warn => tracing::warn!(batch = %batch_id, "module: {message}"),
        LogLevel::Error => tracing::error!(batch = %batch_id, "module: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::OwnedRecord;

    fn records(offsets: std::ops::Range<i64>) -> Records {
        let owned: Vec<OwnedRecord> = offsets
            .map(|o| OwnedRecord {
                offset: o,
                timestamp: 0,
                key: None,
                value: None,
                headers: vec![],
            })
            .collect();
        let mut r = Records::default();
        r.push_slice("t", 0, &owned);
        r
    }

    fn lines(text: &[&str]) -> Vec<ModuleLog> {
        text.iter()
            .map(|t| ModuleLog {
                level: LogLevel::Warn,
                message: t.to_string(),
            })
            .collect()
    }

    fn kept(logs: &ModuleLogs) -> Vec<String> {
        logs.recent().into_iter().map(|l| l.message).collect()
    }

    #[test]
    fn a_retried_batch_keeps_the_lines_of_its_last_run_only() {
        let logs = ModuleLogs::default();
        logs.run("b", &records(0..4), lines(&["try 1"]), false);
        logs.run("b", &records(0..4), lines(&["try 2"]), true);
        logs.settle("b");
        assert_eq!(kept(&logs), ["try 2"]);
    }

    #[test]
    fn a_bisected_batch_keeps_each_records_lines_once() {
        let logs = ModuleLogs::default();
        // The whole batch traps on offset 2, and again on its retry.
        logs.run("b", &records(0..4), lines(&["0", "1", "2 traps"]), false);
        logs.run("b", &records(0..4), lines(&["0", "1", "2 traps"]), false);
        // Bisected: the left half traps, its halves run.
        logs.run("b", &records(0..2), lines(&["0", "1"]), true);
        logs.run("b", &records(2..4), lines(&["2 traps"]), false);
        logs.run("b", &records(2..3), lines(&["2 traps"]), false);
        logs.run("b", &records(2..3), lines(&["2 traps"]), false);
        logs.run("b", &records(3..4), lines(&["3"]), true);
        logs.settle("b");
        assert_eq!(kept(&logs), ["0", "1", "2 traps", "3"]);
        let numbers: Vec<u64> = logs.recent().iter().map(|l| l.seq).collect();
        assert_eq!(numbers, [1, 2, 3, 4]);
    }

    #[test]
    fn a_batch_that_fails_for_good_keeps_its_last_runs_lines() {
        let logs = ModuleLogs::default();
        logs.run("b", &records(0..4), lines(&["declared error"]), false);
        logs.run("b", &records(0..4), lines(&["declared error"]), false);
        assert!(kept(&logs).is_empty(), "held until settled");
        logs.settle("b");
        assert_eq!(kept(&logs), ["declared error"]);
    }

    #[test]
    fn held_lines_are_bounded_without_settling() {
        let logs = ModuleLogs::default();
        for b in 0..(MAX_HELD + 4) {
            logs.run(&format!("b{b}"), &records(0..1), lines(&["x"]), false);
        }
        assert_eq!(kept(&logs).len(), 4);
    }

    #[test]
    fn kept_lines_are_numbered_filtered_by_batch_and_bounded() {
        let logs = ModuleLogs::default();
        let one = records(0..1);
        let empty = logs.after(0, None, 10);
        assert_eq!((empty.lines.len(), empty.last_seq, empty.missed), (0, 0, 0));
        logs.run("a", &one, lines(&["a1", "a2"]), true);
        logs.run("b", &one, lines(&["b1"]), true);
        let all = logs.after(0, None, 10);
        let seqs: Vec<u64> = all.lines.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(all.last_seq, 3);
        let b = logs.after(0, Some("b"), 10);
        assert_eq!(b.lines.len(), 1);
        assert_eq!(b.lines[0].message, "b1");
        let after = logs.after(1, None, 1);
        assert_eq!(after.lines[0].message, "a2");
        // Past the buffer: the oldest go, and a reader behind learns how
        // many it missed.
        let flood: Vec<String> = (0..KEPT_LOG_LINES).map(|i| format!("c{i}")).collect();
        let flood: Vec<&str> = flood.iter().map(String::as_str).collect();
        logs.run("c", &one, lines(&flood), true);
        let behind = logs.after(0, None, 5);
        assert_eq!(behind.missed, 3);
        assert_eq!(behind.lines[0].seq, 4);
        assert_eq!(behind.last_seq, 3 + KEPT_LOG_LINES as u64);
        assert_eq!(logs.after(2, None, 1).missed, 1);
    }
}

//! One partition's committed timers as far as memory holds them: the
//! earliest ones, up to [`TIMER_INDEX_BYTES`], in time order, so a batch
//! learns which timers its watermark passed without reading the sink. The
//! rest stay in the sink's state store and are read, in pages, when the
//! held ones run out before the watermark does.
//!
//! Delivery: it answers reads only, with committed timers (kept up with
//! each landed batch); the sink commits timers with the batch that sets or
//! fires them, never here. It must not hold more than its bound, whatever
//! a module sets: a partition with more timers due than it holds fires the
//! earliest this batch and the rest, oldest first, in the partition's next
//! batches.

use sluice_core::batch::TopicPartition;
use sluice_core::event_time::{self, Timer};
use sluice_core::state::{ScanPage, StateError, StateStore, StateValue};
use std::collections::BTreeSet;

/// Most bytes one partition's held timers take (keys, times and the set's
/// own cost, roughly): about 50,000 timers of 32-byte keys, 14,000 of the
/// longest keys.
pub(crate) const TIMER_INDEX_BYTES: usize = 4 << 20;
/// What a held timer costs besides its key, roughly (time, set node).
const TIMER_OVERHEAD: usize = 56;
/// Timers read from the sink per round trip.
const TIMER_PAGE: usize = 10_000;

fn cost(timer: &Timer) -> usize {
    timer.key.len() + TIMER_OVERHEAD
}

/// The timers among state writes, each with its new value (`None`:
/// removed, fired or deleted).
fn timer_writes<'a>(
    changes: impl IntoIterator<Item = (&'a Vec<u8>, &'a Option<StateValue>)>,
) -> impl Iterator<Item = (Timer, &'a Option<StateValue>)> {
    changes
        .into_iter()
        .filter_map(|(key, value)| Some((Timer::from_state_key(key)?, value)))
}

/// A partition's earliest committed timers.
#[derive(Debug, Default)]
pub(crate) struct TimerIndex {
    held: BTreeSet<Timer>,
    bytes: usize,
    /// Every committed timer before this one is held; this one and later
    /// ones may be only in the store. `None`: every committed timer is
    /// held.
    beyond: Option<Timer>,
}

/// Where a read of more timers from the store starts, and what it found.
pub(crate) struct Refill {
    /// The held timer the read goes on after (`None`: from the first).
    after: Option<Timer>,
    found: Vec<Timer>,
    /// The store has no timers after `found`.
    exhausted: bool,
}

impl TimerIndex {
    /// Whether a batch whose watermark is `watermark` needs timers the
    /// store has and this index does not: its held ones end before the
    /// watermark does (so all of them are due) and fewer than half the
    /// bound are held (else they fire first, and the read waits until they
    /// have landed). An index is made by a first read
    /// ([`TimerIndex::refilled`] on a default one).
    pub(crate) fn wants_refill(&self, watermark: i64) -> bool {
        self.beyond.as_ref().is_some_and(|b| b.at_ms <= watermark)
            && self.bytes <= TIMER_INDEX_BYTES / 2
    }

    /// Where the next read from the store starts.
    pub(crate) fn refill_from(&self) -> Option<Timer> {
        self.held.last().cloned()
    }

    /// Reads, from `store`, the timers of `tp` after `after`, as many as
    /// an index can hold (a page more at most).
    pub(crate) async fn read(
        store: &dyn StateStore,
        pipeline: &str,
        tp: &TopicPartition,
        after: Option<Timer>,
    ) -> Result<Refill, StateError> {
        let mut page = ScanPage {
            prefix: event_time::timer_prefix().to_vec(),
            after: after.as_ref().map(Timer::state_key),
            limit: TIMER_PAGE,
        };
        let (mut found, mut bytes) = (Vec::new(), 0);
        loop {
            let keys = store.scan(pipeline, tp, &page).await?;
            let full = keys.len() == page.limit;
            page.after = keys.last().map(|(key, _)| key.clone());
            for timer in keys
                .iter()
                .filter_map(|(key, _)| Timer::from_state_key(key))
            {
                bytes += cost(&timer);
                found.push(timer);
            }
            if !full || bytes > TIMER_INDEX_BYTES {
                return Ok(Refill {
                    after,
                    found,
                    exhausted: !full,
                });
            }
        }
    }

    /// Takes in what a read found (made while no batch of the partition
    /// landed: the caller checks), up to the bound.
    pub(crate) fn refilled(&mut self, refill: Refill) {
        debug_assert_eq!(refill.after, self.refill_from());
        self.beyond = None;
        let mut rest = refill.found.into_iter();
        for timer in rest.by_ref() {
            if self.bytes + cost(&timer) > TIMER_INDEX_BYTES {
                self.beyond = Some(timer);
                break;
            }
            let added = cost(&timer);
            if self.held.insert(timer) {
                self.bytes += added;
            }
        }
        if self.beyond.is_none() && !refill.exhausted {
            // The read stopped at a page's end with room left: what follows
            // is unknown, so it starts just past the last timer read.
            self.beyond = self.held.last().map(|last| Timer {
                at_ms: last.at_ms,
                key: [last.key.as_slice(), &[0]].concat(),
            });
        }
    }

    /// Applies the timer changes among a landed batch's state writes.
    pub(crate) fn landed<'a>(
        &mut self,
        changes: impl Iterator<Item = (&'a Vec<u8>, &'a Option<StateValue>)>,
    ) {
        for (timer, value) in timer_writes(changes) {
            match value {
                Some(_) if self.beyond.as_ref().is_none_or(|b| &timer < b) => {
                    let added = cost(&timer);
                    if self.held.insert(timer) {
                        self.bytes += added;
                    }
                }
                Some(_) => {}
                None => {
                    if self.held.remove(&timer) {
                        self.bytes -= cost(&timer);
                    }
                }
            }
        }
        while self.bytes > TIMER_INDEX_BYTES {
            let last = self.held.pop_last().expect("bytes held");
            self.bytes -= cost(&last);
            self.beyond = Some(last);
        }
    }

    /// The timers due by `watermark` for a batch prepared now: the held
    /// ones, changed by `pending` (the state writes of batches not landed
    /// yet, oldest first), before [`TimerIndex::beyond`] (later ones fire
    /// in a later batch, once held).
    pub(crate) fn due<'a>(
        &self,
        watermark: i64,
        pending: impl Iterator<Item = &'a sluice_core::state::KeyTable>,
    ) -> Vec<Timer> {
        let mut due: BTreeSet<Timer> = (self.held.iter())
            .take_while(|t| t.at_ms <= watermark)
            .cloned()
            .collect();
        // A pending timer later than the watermark changes nothing here.
        let due_by = |(key, _): &(&Vec<u8>, &Option<StateValue>)| {
            Timer::time_of_state_key(key).is_some_and(|at| at <= watermark)
        };
        for (timer, value) in pending.flat_map(|keys| timer_writes(keys.iter().filter(due_by))) {
            match value {
                Some(_) => due.insert(timer),
                None => due.remove(&timer),
            };
        }
        due.retain(|t| t.at_ms <= watermark && self.beyond.as_ref().is_none_or(|b| t < b));
        due.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(at_ms: i64, key: &str) -> Timer {
        Timer {
            at_ms,
            key: key.as_bytes().to_vec(),
        }
    }

    fn set(t: &Timer) -> (Vec<u8>, Option<StateValue>) {
        let value = StateValue {
            value: Vec::new(),
            expires_at_ms: None,
        };
        (t.state_key(), Some(value))
    }

    /// An index filled with `n` timers of 200-byte keys, one ms apart.
    fn filled(n: i64) -> (TimerIndex, Vec<Timer>) {
        let all: Vec<Timer> = (0..n).map(|i| timer(i, &format!("{i:0>200}"))).collect();
        let mut index = TimerIndex::default();
        index.refilled(Refill {
            after: None,
            found: all.clone(),
            exhausted: true,
        });
        (index, all)
    }

    #[test]
    fn holds_the_earliest_timers_within_its_bound_and_fires_the_rest_later() {
        let (mut index, all) = filled(100_000);
        assert!(index.bytes <= TIMER_INDEX_BYTES);
        let held = index.held.len();
        assert!((10_000..100_000).contains(&held), "{held}");
        assert_eq!(index.beyond.as_ref(), Some(&all[held]));
        // Everything is due: the held ones fire, oldest first.
        let due = index.due(i64::MAX, std::iter::empty());
        assert_eq!(due, all[..held]);
        assert!(!index.wants_refill(i64::MAX), "full: no room to read more");
        // They landed (deleted): room again, and the read goes on after the
        // last held timer.
        let fired: Vec<_> = due
            .iter()
            .map(|t| (t.state_key(), None::<StateValue>))
            .collect();
        index.landed(fired.iter().map(|(k, v)| (k, v)));
        assert!(index.held.is_empty() && index.bytes == 0);
        assert!(index.wants_refill(i64::MAX));
        assert_eq!(index.refill_from(), None);
        index.refilled(Refill {
            after: None,
            found: all[held..].to_vec(),
            exhausted: true,
        });
        assert_eq!(index.due(i64::MAX, std::iter::empty())[0], all[held]);
    }

    #[test]
    fn a_timer_set_past_what_is_held_stays_in_the_store() {
        let (mut index, all) = filled(100_000);
        let late = timer(1_000_000, "late");
        let early = timer(-1, "early");
        let writes = [set(&late), set(&early)];
        index.landed(writes.iter().map(|(k, v)| (k, v)));
        assert!(!index.held.contains(&late));
        assert!(index.held.contains(&early));
        assert!(index.bytes <= TIMER_INDEX_BYTES);
        // The one pushed out is now where the store takes over.
        assert!(
            index
                .beyond
                .as_ref()
                .is_some_and(|b| b < &all[all.len() - 1])
        );
        // A pending (not landed) timer past the held ones waits too.
        let pending: sluice_core::state::KeyTable = [set(&late)].into_iter().collect();
        let due = index.due(i64::MAX, std::iter::once(&pending));
        assert!(!due.contains(&late) && due[0] == early);
    }

    #[test]
    fn a_read_that_stops_at_a_page_end_knows_what_follows_is_unknown() {
        let mut index = TimerIndex::default();
        let found: Vec<Timer> = (0..10).map(|i| timer(i, "k")).collect();
        index.refilled(Refill {
            after: None,
            found: found.clone(),
            exhausted: false,
        });
        assert_eq!(index.held.len(), 10);
        assert!(index.wants_refill(9));
        assert!(!index.wants_refill(8));
        assert_eq!(index.due(9, std::iter::empty()), found);
    }
}

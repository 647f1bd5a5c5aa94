//! The open tumbling and hopping windows a batch adds records to, held in
//! the module's memory (their aggregates as values, not bytes) until the
//! batch's end: each is read from its closing timer once and written back
//! to it once, however many of the batch's records it takes, so a record
//! costs no host call and no encoding for a window the batch has seen.
//! What the batch commits is the same: the host keeps a timer's last
//! value, and nothing reads a held window from the host before it is
//! written back.
//!
//! It must be written back (`write_back`) before the batch asks for its
//! due timers or reads an open window from the host; it must not hold a
//! window a late record has closed (`take` lets it go).

use super::{Accumulator, keep_open, open_window};
use crate::{State, Time};
use foldhash::fast::FixedState;
use std::collections::HashMap;

/// A window's partition slot and end.
type End = (usize, i64);

/// The batch's held windows.
pub(super) struct HeldWindows<A> {
    /// Where the keys of each (slot, end) are in `keys`.
    ends: HashMap<End, usize, FixedState>,
    /// The (slot, end) asked last and where its keys are: records in
    /// event-time order ask the same end again and again.
    last: Option<(End, usize)>,
    /// Per (slot, end), where each held window of a key is in `held`.
    keys: Vec<HashMap<Vec<u8>, usize, FixedState>>,
    /// In the order first read, the order they are written back in.
    held: Vec<Held<A>>,
    hasher: FixedState,
}

struct Held<A> {
    /// A record of the window's partition, to name it to the host.
    index: u32,
    key: Vec<u8>,
    end_ms: i64,
    /// `None` once a late record has taken it.
    acc: Option<A>,
}

impl<A: Accumulator> HeldWindows<A> {
    /// Hashes keys with `seed` (the batch's), so the keys that collide
    /// are not the same in every batch.
    pub(super) fn new(seed: u64) -> Self {
        let hasher = FixedState::with_seed(seed);
        HeldWindows {
            ends: HashMap::with_hasher(hasher.clone()),
            last: None,
            keys: Vec::new(),
            held: Vec::new(),
            hasher,
        }
    }

    /// Where the keys of `end` are in `keys`, made if `make`.
    fn keys_of(&mut self, end: End, make: bool) -> Option<usize> {
        if let Some((last, at)) = self.last
            && last == end
        {
            return Some(at);
        }
        let at = match self.ends.get(&end) {
            Some(&at) => at,
            None if make => {
                self.keys.push(HashMap::with_hasher(self.hasher.clone()));
                self.ends.insert(end, self.keys.len() - 1);
                self.keys.len() - 1
            }
            None => return None,
        };
        self.last = Some((end, at));
        Some(at)
    }

    /// The aggregate of `key`'s open window ending at `end_ms` in the
    /// partition of `slot` (`state`'s), read from the host if not held
    /// yet (`init()` if there is no such window), to change: it is written
    /// back at the batch's end.
    pub(super) fn get_mut(
        &mut self,
        slot: usize,
        state: &State,
        key: &[u8],
        end_ms: i64,
        init: impl FnOnce() -> A,
    ) -> &mut A {
        let keys = self.keys_of((slot, end_ms), true).expect("made");
        let keys = &mut self.keys[keys];
        let at = match keys.get(key) {
            Some(&at) => at,
            None => {
                let stored = open_window(state, key, end_ms, true);
                let acc = stored.as_deref().and_then(A::from_bytes);
                keys.insert(key.to_vec(), self.held.len());
                self.held.push(Held {
                    index: state.index,
                    key: key.to_vec(),
                    end_ms,
                    acc: Some(acc.unwrap_or_else(init)),
                });
                self.held.len() - 1
            }
        };
        self.held[at]
            .acc
            .as_mut()
            .expect("a held window has its aggregate")
    }

    /// Takes `key`'s open window ending at `end_ms` out of the batch's
    /// open windows (a late record closed it): its aggregate's bytes,
    /// held or read from the host (taken from the old layout's key if it
    /// is there), or `None` if there is no such window.
    pub(super) fn take(
        &mut self,
        slot: usize,
        state: &State,
        key: &[u8],
        end_ms: i64,
    ) -> Option<Vec<u8>> {
        let keys = self.keys_of((slot, end_ms), false);
        let at = keys.and_then(|keys| self.keys[keys].remove(key));
        match at {
            Some(at) => self.held[at].acc.take().map(|acc| acc.to_bytes()),
            None => open_window(state, key, end_ms, true),
        }
    }

    /// Writes every held window back to its closing timer, in the order
    /// first read, and holds none.
    pub(super) fn write_back(&mut self) {
        self.ends.clear();
        self.keys.clear();
        self.last = None;
        for held in self.held.drain(..) {
            if let Some(acc) = held.acc {
                let time = Time { index: held.index };
                keep_open(&time, &held.key, held.end_ms, &acc.to_bytes());
            }
        }
    }
}

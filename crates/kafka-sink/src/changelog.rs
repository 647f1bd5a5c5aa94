//! The state changelog of an exactly-once Kafka sink: how a batch's state
//! changes are laid out as records of the changelog topic, and the rule
//! that tells, reading the topic back, which records were committed.
//!
//! Partition `p` of the changelog keeps the state of input partition `p`.
//! A batch that changes state writes, inside its transaction, one record
//! per changed key (key `0x00` + state key; value the stored value, or
//! none for a delete, so compaction drops it) carrying the batch's random
//! tag in a `sluice.tag` header, then a **seal** (key `0x01`): the tag, the
//! input range, and the changelog offset of the partition's previous
//! committed seal. The same transaction moves the pipeline group's offset
//! of the changelog partition to just past the seal.
//!
//! Reading back, the group's committed offset `E` names the newest
//! committed seal (`E - 1`); its chain of previous seals names every
//! committed batch's tag. A record counts if its tag is on the chain.
//! This does not trust the broker to hide aborted records (some brokers
//! show them to `read_committed` readers: docs/kafka.md), and it tells a
//! fenced zombie's records from its successor's even when both wrote the
//! same range. Where compaction removed an old seal, the records at or
//! below it count as they are (compaction keeps only committed data).
//!
//! It must not talk to a broker: `sink` sends what this lays out, `state`
//! reads what this judges.

use crate::records::OutRecord;
use sluice_core::batch::OffsetRange;
use sluice_core::state::{Keys, StateError};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

/// The first key byte of a state record.
const STATE_KEY: u8 = 0x00;
/// The key of every seal.
pub const SEAL_KEY: &[u8] = &[0x01];
/// The header that carries a state record's tag.
pub const TAG_HEADER: &str = "sluice.tag";
/// What a seal's value starts with (format version 1).
const SEAL_MAGIC: &[u8] = b"S1";

/// A batch attempt's tag: random, so no two attempts share one.
pub type Tag = [u8; 16];

/// A fresh tag, from the OS's randomness (through std's hasher seeds), the
/// process and the clock.
pub fn fresh_tag() -> Tag {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(salt);
        h.write_u32(std::process::id());
        h.write_u128(nanos);
        h.write_u64(n);
        h.finish().to_be_bytes()
    };
    let mut tag = [0; 16];
    tag[..8].copy_from_slice(&half(0));
    tag[8..].copy_from_slice(&half(1));
    tag
}

/// What a seal says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal {
    pub tag: Tag,
    /// The changelog offset of the partition's previous committed seal.
    pub previous: Option<i64>,
    /// The input range its batch committed (for people reading the topic).
    pub from: i64,
    pub until: i64,
}

impl Seal {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = SEAL_MAGIC.to_vec();
        out.extend_from_slice(&self.tag);
        out.extend_from_slice(&self.previous.unwrap_or(-1).to_be_bytes());
        out.extend_from_slice(&self.from.to_be_bytes());
        out.extend_from_slice(&self.until.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Seal, StateError> {
        let corrupt = || StateError::Corrupt("a changelog seal is not sluice's".into());
        let rest = bytes.strip_prefix(SEAL_MAGIC).ok_or_else(corrupt)?;
        if rest.len() != 16 + 24 {
            return Err(corrupt());
        }
        let int = |at: usize| i64::from_be_bytes(rest[at..at + 8].try_into().expect("8 bytes"));
        Ok(Seal {
            tag: rest[..16].try_into().expect("16 bytes"),
            previous: Some(int(16)).filter(|p| *p >= 0),
            from: int(24),
            until: int(32),
        })
    }
}

/// One batch's changelog records for one partition: its changes, then
/// its seal.
pub struct ChangelogBatch<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub tag: Tag,
    pub changes: &'a Keys,
    pub seal: Seal,
}

impl<'a> ChangelogBatch<'a> {
    /// The records of `changes` (one partition's) for the batch of
    /// `range`, chained to the seal at `previous`.
    pub fn new(
        topic: &'a str,
        range: &OffsetRange,
        changes: &'a Keys,
        previous: Option<i64>,
    ) -> ChangelogBatch<'a> {
        let tag = fresh_tag();
        ChangelogBatch {
            topic,
            partition: range.partition,
            tag,
            changes,
            seal: Seal {
                tag,
                previous,
                from: range.from,
                until: range.until,
            },
        }
    }

    /// Calls `send` with each change, then the seal.
    pub fn send_each<E>(
        &self,
        mut send: impl FnMut(&OutRecord<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        for (key, value) in self.changes {
            let mut stored = vec![STATE_KEY];
            stored.extend_from_slice(key);
            send(&OutRecord {
                topic: self.topic,
                partition: Some(self.partition),
                key: Some(Cow::Owned(stored)),
                value: value.as_ref().map(|v| Cow::Owned(v.to_stored())),
                headers: vec![(TAG_HEADER, Some(Cow::Borrowed(&self.tag[..])))],
            })?;
        }
        send(&OutRecord {
            topic: self.topic,
            partition: Some(self.partition),
            key: Some(Cow::Borrowed(SEAL_KEY)),
            value: Some(Cow::Owned(self.seal.encode())),
            headers: Vec::new(),
        })
    }
}

/// What a changelog record is, by its key.
pub enum Entry<'a> {
    /// A state change: the state key.
    Change(&'a [u8]),
    Seal,
    /// Not sluice's: someone else wrote to the topic.
    Foreign,
}

impl Entry<'_> {
    pub fn of(key: Option<&[u8]>) -> Entry<'_> {
        match key {
            Some(k) if k == SEAL_KEY => Entry::Seal,
            Some([STATE_KEY, rest @ ..]) => Entry::Change(rest),
            _ => Entry::Foreign,
        }
    }
}

/// Which changelog records of a partition were committed.
#[derive(Debug)]
pub struct Chain {
    tags: HashSet<Tag>,
    /// Records below it count whatever their tag (their seals were
    /// compacted away).
    floor: i64,
}

impl Chain {
    /// The chain ending at the seal at `end - 1`, `end` being the group's
    /// committed offset of the partition; `seals` are the seals read, by
    /// offset.
    pub fn ending_at(end: i64, seals: &HashMap<i64, Seal>) -> Result<Chain, StateError> {
        let mut chain = Chain {
            tags: HashSet::new(),
            floor: 0,
        };
        let mut at = end - 1;
        let Some(mut seal) = seals.get(&at) else {
            return Err(StateError::Corrupt(format!(
                "the changelog's committed position {end} does not follow a seal (offset {at})"
            )));
        };
        loop {
            chain.tags.insert(seal.tag);
            match seal.previous {
                None => return Ok(chain),
                Some(previous) if previous >= at => {
                    return Err(StateError::Corrupt(format!(
                        "the changelog seal at {at} points forward to {previous}"
                    )));
                }
                Some(previous) => match seals.get(&previous) {
                    Some(earlier) => (at, seal) = (previous, earlier),
                    None => {
                        chain.floor = previous + 1;
                        return Ok(chain);
                    }
                },
            }
        }
    }

    /// Whether the state record at `offset` with `tag` was committed.
    pub fn keeps(&self, offset: i64, tag: Option<&[u8]>) -> bool {
        offset < self.floor
            || tag
                .and_then(|t| Tag::try_from(t).ok())
                .is_some_and(|t| self.tags.contains(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(tag: u8, previous: Option<i64>) -> Seal {
        Seal {
            tag: [tag; 16],
            previous,
            from: 0,
            until: 1,
        }
    }

    #[test]
    fn seals_and_values_round_trip() {
        let s = seal(7, Some(12));
        assert_eq!(Seal::decode(&s.encode()).unwrap(), s);
        let first = seal(1, None);
        assert_eq!(Seal::decode(&first.encode()).unwrap(), first);
        assert!(Seal::decode(b"S1short").is_err());
        assert_ne!(fresh_tag(), fresh_tag());
    }

    #[test]
    fn the_chain_keeps_committed_tags_and_skips_aborted_ones() {
        // Committed seals at 2 and 6 (an aborted one at 4, a zombie's).
        let seals = HashMap::from([
            (2, seal(1, None)),
            (4, seal(9, Some(2))),
            (6, seal(2, Some(2))),
        ]);
        let chain = Chain::ending_at(7, &seals).unwrap();
        assert!(chain.keeps(0, Some(&[1; 16])));
        assert!(chain.keeps(5, Some(&[2; 16])));
        assert!(!chain.keeps(3, Some(&[9; 16])), "the aborted attempt's");
        assert!(!chain.keeps(3, None));
        // Compacted: the seal at 2 is gone; records up to it count.
        let compacted = HashMap::from([(6, seal(2, Some(2)))]);
        let chain = Chain::ending_at(7, &compacted).unwrap();
        assert!(chain.keeps(1, Some(&[1; 16])) && chain.keeps(2, None));
        assert!(!chain.keeps(3, Some(&[9; 16])));
        assert!(Chain::ending_at(6, &seals).is_err(), "5 is not a seal");
    }
}

//! What `sluice reset` does, whichever sink keeps the checkpoints: one
//! partition's move, what to do with keyed state, and what a reset did.
//! Each sink moves its own checkpoints (`sluice_sql::reset`,
//! `sluice_redis::reset`); this file must not move anything.

use crate::batch::TopicPartition;

/// One partition's move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMove {
    pub partition: TopicPartition,
    /// The checkpoint before the reset; `None` if it never committed.
    pub from: Option<i64>,
    pub to: i64,
}

/// What a reset does with the keyed state of the partitions it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnState {
    /// Refuse to move a partition that keeps state.
    Refuse,
    /// Delete the moved partitions' state (`--clear-state`).
    Clear,
}

/// What a reset did (or, in a dry run, would do).
#[derive(Debug, Clone)]
pub struct ResetDone {
    /// Where the stale lineage and dead letters went: the pipeline name
    /// they are kept under (`PIPELINE@reset-N`).
    pub archived_as: String,
    pub moves: Vec<PartitionMove>,
    pub batches_archived: usize,
    pub dead_letters_archived: u64,
    /// State keys deleted with [`OnState::Clear`].
    pub state_keys_cleared: u64,
}

/// The message of a reset refused because `tp` keeps state (`keys` keys,
/// if counted).
pub fn keeps_state(tp: &TopicPartition, keys: Option<i64>) -> String {
    let counted = keys.map_or(String::new(), |k| format!(" ({k} keys)"));
    format!(
        "{tp} keeps keyed state{counted} as of its checkpoint; moving the checkpoint \
         would leave state that disagrees with it. Add `--clear-state` to delete the moved \
         partitions' state with the move (the re-run starts from empty state); nothing \
         was moved"
    )
}

//! Moving a Redis sink's checkpoints on purpose (`sluice reset`), with the
//! lineage entries and dead letters the move makes stale, by one script.
//!
//! # Delivery guarantee
//!
//! As on SQL sinks (`sluice_sql::reset`): a running instance's next batch
//! planned from an old checkpoint fails the commit script's offset
//! compare-and-set, so it is fenced, re-reads the checkpoint and continues
//! from the new one. The lineage entries of batches whose ranges the
//! re-run covers again, and the dead letters of re-run offsets, move to
//! the lists of pipeline `PIPELINE@reset-N` (N counting this pipeline's
//! resets, in `<prefix>resets:<pipeline>`), where they stay readable.
//!
//! The host reads the checkpoints, lineage and dead letters and picks what
//! moves; the script then writes only if nothing it was picked from
//! changed: the reset count and every moved partition's checkpoint must be
//! as read (a batch committed in between is what could add a stale entry).
//! Otherwise it writes nothing and the host reads again. Everything is
//! checked before the first write, so the script never stops half-way.
//! Keyed state: a partition that keeps some is moved only with
//! [`OnState::Clear`] (its hash deleted in the same script), else the
//! reset is refused and nothing moves. It must not touch target keys.

use crate::connect::{StateKeys, connect, sink_err, whole_list};
use crate::dead_letters::stored;
use redis::aio::ConnectionManager;
use sluice_core::batch::TopicPartition;
use sluice_core::config::StoreConnection;
use sluice_core::reset::{OnState, PartitionMove, ResetDone, keeps_state};
use sluice_core::sink::SinkError;
use sluice_core::store::LineageEntry;
use std::time::Duration;

/// KEYS: checkpoints, lineage, dead letters, the archive's lineage and
/// dead letters, the reset count, then each moved partition's state hash.
/// ARGV: the reset count read, dry run, clear state, the partitions (field,
/// checkpoint read or empty, new offset), the lineage entries and the dead
/// letters to move. Replies `raced`, `state` (field, keys) or `ok` (state
/// keys cleared).
const RESET: &str = r#"
local at = 1
local function take()
  local v = ARGV[at]
  at = at + 1
  return v
end
if (redis.call('GET', KEYS[6]) or '0') ~= take() then return {'raced'} end
local dry = take() == '1'
local clear = take() == '1'
local moves = {}
for _ = 1, tonumber(take()) do
  local field, read, to = take(), take(), take()
  if (redis.call('HGET', KEYS[1], field) or '') ~= read then return {'raced'} end
  moves[#moves + 1] = {field, to}
end
local cleared = 0
for i = 1, #moves do
  local keys = redis.call('HLEN', KEYS[6 + i])
  if keys > 0 and not clear then return {'state', moves[i][1], tostring(keys)} end
  cleared = cleared + keys
end
if dry then return {'ok', tostring(cleared)} end
for _, m in ipairs(moves) do
  redis.call('HSET', KEYS[1], m[1], m[2])
end
for i = 1, #moves do
  redis.call('DEL', KEYS[6 + i])
end
for _, list in ipairs({{KEYS[2], KEYS[4]}, {KEYS[3], KEYS[5]}}) do
  for _ = 1, tonumber(take()) do
    local entry = take()
    if redis.call('LREM', list[1], 1, entry) == 1 then
      redis.call('RPUSH', list[2], entry)
    end
  end
end
redis.call('INCR', KEYS[6])
return {'ok', tostring(cleared)}
"#;

/// Tries before giving up on a pipeline that keeps committing to the
/// partitions being moved.
const ATTEMPTS: usize = 20;

/// What the host picked for one attempt.
struct Picked {
    resets: u64,
    from: Vec<Option<i64>>,
    lineage: Vec<String>,
    dead_letters: Vec<String>,
}

/// Moves `pipeline`'s checkpoints of the given partitions to their
/// offsets, archiving the lineage entries and dead letters the move makes
/// stale; with `dry_run`, reports and changes nothing.
pub async fn reset(
    sink: &StoreConnection,
    pipeline: &str,
    targets: &[(TopicPartition, i64)],
    on_state: OnState,
    dry_run: bool,
) -> Result<ResetDone, SinkError> {
    let conn = connect(&sink.url, Duration::from_millis(sink.lock_timeout_ms)).await?;
    let keys = StateKeys::new(&sink.table_prefix, pipeline);
    let script = redis::Script::new(RESET);
    for _ in 0..ATTEMPTS {
        let picked = pick(&conn, &keys, targets).await?;
        let archived_as = format!("{pipeline}@reset-{}", picked.resets + 1);
        let archive = StateKeys::new(&sink.table_prefix, &archived_as);
        let mut call = script.prepare_invoke();
        call.key(&keys.checkpoints)
            .key(&keys.lineage)
            .key(&keys.dead_letters)
            .key(&archive.lineage)
            .key(&archive.dead_letters)
            .key(&keys.resets);
        for (tp, _) in targets {
            call.key(keys.state(tp));
        }
        call.arg(picked.resets)
            .arg(dry_run as u8)
            .arg((on_state == OnState::Clear) as u8)
            .arg(targets.len());
        for ((tp, to), from) in targets.iter().zip(&picked.from) {
            call.arg(StateKeys::field(&tp.topic, tp.partition))
                .arg(from.map_or(String::new(), |f| f.to_string()))
                .arg(to);
        }
        for list in [&picked.lineage, &picked.dead_letters] {
            call.arg(list.len());
            for entry in list {
                call.arg(entry);
            }
        }
        let mut c = conn.clone();
        let reply: Vec<String> = call
            .invoke_async(&mut c)
            .await
            .map_err(|e| sink_err("running the reset script", e))?;
        match reply.first().map(String::as_str) {
            Some("raced") => continue,
            Some("state") => {
                let tp = targets
                    .iter()
                    .map(|(tp, _)| tp)
                    .find(|tp| reply.get(1) == Some(&StateKeys::field(&tp.topic, tp.partition)))
                    .cloned()
                    .unwrap_or_else(|| TopicPartition {
                        topic: reply.get(1).cloned().unwrap_or_default(),
                        partition: -1,
                    });
                let count = reply.get(2).and_then(|k| k.parse().ok()).unwrap_or(0);
                return Err(SinkError::Config(keeps_state(&tp, Some(count))));
            }
            Some("ok") => {
                return Ok(ResetDone {
                    archived_as,
                    moves: targets
                        .iter()
                        .zip(picked.from)
                        .map(|((tp, to), from)| PartitionMove {
                            partition: tp.clone(),
                            from,
                            to: *to,
                        })
                        .collect(),
                    batches_archived: picked.lineage.len(),
                    dead_letters_archived: picked.dead_letters.len() as u64,
                    state_keys_cleared: reply.get(1).and_then(|k| k.parse().ok()).unwrap_or(0),
                });
            }
            _ => {
                return Err(SinkError::Database {
                    context: format!("the reset script answered {reply:?}"),
                    cause: None,
                });
            }
        }
    }
    Err(SinkError::Config(format!(
        "the pipeline committed to the partitions being moved during each of {ATTEMPTS} \
         tries; nothing was moved. Stop it (or run the reset again)"
    )))
}

/// Reads what a reset of `targets` moves: the reset count, each
/// partition's checkpoint, the lineage entries with a range of a moved
/// partition that ends past its new offset, and the dead letters at or
/// past it.
async fn pick(
    conn: &ConnectionManager,
    keys: &StateKeys,
    targets: &[(TopicPartition, i64)],
) -> Result<Picked, SinkError> {
    let mut c = conn.clone();
    let resets: Option<u64> = redis::cmd("GET")
        .arg(&keys.resets)
        .query_async(&mut c)
        .await
        .map_err(|e| sink_err("reading the reset count", e))?;
    let mut from = Vec::with_capacity(targets.len());
    for (tp, _) in targets {
        let stored: Option<i64> = redis::cmd("HGET")
            .arg(&keys.checkpoints)
            .arg(StateKeys::field(&tp.topic, tp.partition))
            .query_async(&mut c)
            .await
            .map_err(|e| sink_err("reading checkpoints", e))?;
        from.push(stored);
    }
    let moved_past = |topic: &str, partition: i32, offset: i64| {
        targets
            .iter()
            .any(|(tp, to)| tp.topic == topic && tp.partition == partition && offset > *to)
    };
    let mut lineage = Vec::new();
    for text in whole_list(conn, &keys.lineage)
        .await
        .map_err(|e| sink_err("reading lineage", e))?
    {
        let entry: LineageEntry = serde_json::from_str(&text)
            .map_err(|e| SinkError::database("a lineage entry is not sluice's JSON", e))?;
        if entry
            .ranges
            .iter()
            .any(|r| moved_past(&r.topic, r.partition, r.until))
        {
            lineage.push(text);
        }
    }
    let dead_letters = stored(conn, keys)
        .await?
        .into_iter()
        .filter(|e| moved_past(&e.letter.topic, e.letter.partition, e.letter.offset + 1))
        .map(|e| e.text)
        .collect();
    Ok(Picked {
        resets: resets.unwrap_or(0),
        from,
        lineage,
        dead_letters,
    })
}

//! Dead letters on Redis: the list `<prefix>dead_letters:<pipeline>`, one
//! JSON entry each. Owns the entry's format: rendered here for the commit
//! script (which pushes them, trimmed to `sink.dead_letters_keep`), and
//! parsed back for `sluice dead-letters list|show`, with each batch's times
//! from its lineage entry while that is kept.
//!
//! It must not write: entries are written, trimmed and (for a redrive,
//! `redrive.rs`) removed only by the commit script.

use crate::connect::{StateKeys, connect, sink_err, whole_list};
use crate::lineage::RedisLineage;
use redis::aio::ConnectionManager;
use sluice_core::config::StoreConnection;
use sluice_core::dead_letters::{
    DeadLetterFilter, DeadLetterReader, StoredDeadLetter, with_batch_times,
};
use sluice_core::sink::{Commit, SinkError};
use std::time::Duration;

/// Reads a pipeline's dead letters from a Redis sink.
pub struct RedisDeadLetters {
    conn: ConnectionManager,
    prefix: String,
    lineage: RedisLineage,
}

impl RedisDeadLetters {
    pub async fn open(sink: &StoreConnection) -> Result<RedisDeadLetters, SinkError> {
        let conn = connect(&sink.url, Duration::from_millis(sink.lock_timeout_ms)).await?;
        Ok(RedisDeadLetters {
            lineage: RedisLineage::on(conn.clone(), sink),
            conn,
            prefix: sink.table_prefix.clone(),
        })
    }
}

#[async_trait::async_trait]
impl DeadLetterReader for RedisDeadLetters {
    async fn list(
        &self,
        pipeline: &str,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<StoredDeadLetter>, SinkError> {
        let keys = StateKeys::new(&self.prefix, pipeline);
        let entries = stored(&self.conn, &keys).await?;
        let letters = entries.into_iter().map(|e| e.letter);
        with_batch_times(letters, &self.lineage, pipeline, filter)
            .await
            .map_err(|e| SinkError::database("reading the lineage", e))
    }
}

/// One stored dead letter: the list's entry as stored (what the commit
/// script removes) and what it says.
pub(crate) struct StoredEntry {
    pub text: String,
    pub letter: StoredDeadLetter,
}

/// Every dead letter stored for `keys`' pipeline, oldest first.
pub(crate) async fn stored(
    conn: &ConnectionManager,
    keys: &StateKeys,
) -> Result<Vec<StoredEntry>, SinkError> {
    let entries = whole_list(conn, &keys.dead_letters)
        .await
        .map_err(|e| sink_err("reading the dead letters", e))?;
    entries
        .into_iter()
        .map(|text| {
            let letter = parse(&text).map_err(|why| {
                SinkError::database(
                    format!(
                        "a dead letter in `{}` is not one sluice wrote",
                        keys.dead_letters
                    ),
                    why,
                )
            })?;
            Ok(StoredEntry { text, letter })
        })
        .collect()
}

/// The batch's dead letters as the JSON entries the commit script pushes
/// ([`parse`] reads them back).
pub(crate) fn entries(c: &Commit<'_>) -> Vec<String> {
    if c.dead_letters.is_empty() {
        return Vec::new();
    }
    let records: Vec<_> = c.records.iter().collect();
    c.dead_letters
        .iter()
        .map(|d| {
            let r = records[d.index];
            let mut entry = serde_json::json!({
                "batch_id": c.plan.batch_id,
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": r.timestamp,
                "kind": d.kind.as_str(),
                "reason": d.reason,
            });
            for (name, bytes) in [("key", r.key), ("value", r.value)] {
                if let Some(b) = bytes {
                    match std::str::from_utf8(b) {
                        Ok(text) => entry[name] = text.into(),
                        Err(_) => entry[format!("{name}_hex")] = hex::encode(b).into(),
                    }
                }
            }
            entry.to_string()
        })
        .collect()
}

/// One entry as [`entries`] renders it (key and value as text, or hex
/// when not UTF-8; no record time before it was kept).
pub(crate) fn parse(entry: &str) -> Result<StoredDeadLetter, String> {
    let v: serde_json::Value = serde_json::from_str(entry).map_err(|e| e.to_string())?;
    let text = |name: &str| {
        v[name]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no `{name}`"))
    };
    let int = |name: &str| v[name].as_i64().ok_or_else(|| format!("no `{name}`"));
    let bytes = |name: &str| -> Result<Option<Vec<u8>>, String> {
        match (v[name].as_str(), v[format!("{name}_hex")].as_str()) {
            (Some(t), _) => Ok(Some(t.as_bytes().to_vec())),
            (None, Some(h)) => hex::decode(h).map(Some).map_err(|e| e.to_string()),
            (None, None) => Ok(None),
        }
    };
    Ok(StoredDeadLetter {
        batch_id: text("batch_id")?,
        topic: text("topic")?,
        partition: i32::try_from(int("partition")?).map_err(|e| e.to_string())?,
        offset: int("offset")?,
        timestamp: v["timestamp"].as_i64().unwrap_or(-1),
        key: bytes("key")?,
        value: bytes("value")?,
        kind: text("kind")?,
        reason: text("reason")?,
        batch_time_ms: None,
        committed_at_ms: None,
        stored_at: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_as_written_text_or_hex() {
        let d = parse(
            r#"{"batch_id":"b1","topic":"t:x","partition":3,"offset":42,"timestamp":7,
                "kind":"trap","reason":"boom","key":"k","value_hex":"ff00"}"#,
        )
        .unwrap();
        assert_eq!((d.topic.as_str(), d.partition, d.offset), ("t:x", 3, 42));
        assert_eq!(d.timestamp, 7);
        assert_eq!(d.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(d.value.as_deref(), Some(&[0xff, 0x00][..]));
        let old = parse(
            r#"{"batch_id":"b","topic":"t","partition":0,"offset":1,"kind":"rejected","reason":"r"}"#,
        )
        .unwrap();
        assert_eq!((old.timestamp, old.key, old.value), (-1, None, None));
        assert!(parse(r#"{"topic":"t"}"#).unwrap_err().contains("batch_id"));
    }
}

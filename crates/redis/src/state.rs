//! Keyed state on Redis: one hash per partition (`<prefix>state:<pipeline>:
//! <topic>:<partition>`, state key -> stored value), the arguments that
//! make the commit script write a batch's changes, and [`RedisStateStore`],
//! which reads the state back for the pipeline's cache.
//!
//! A stored value is [`StateValue::to_stored`]'s bytes.
//!
//! It must not write: changes are written only by the commit script, in
//! the same call as the batch's commands and offset moves (see `sink`).

use crate::connect::{StateKeys, connect};
use redis::aio::ConnectionManager;
use sluice_core::batch::TopicPartition;
use sluice_core::config::StoreConnection;
use sluice_core::sink::SinkError;
use sluice_core::state::{StateError, StateMap, StateSize, StateStore, StateValue};

/// A batch's state changes as commit-script operations: the hash keys
/// (for `KEYS`) and per change the key's index among them, `s`et or
/// `d`elete, the field and the stored value (empty for a delete).
pub(crate) struct StateOps {
    pub keys: Vec<String>,
    pub args: Vec<Vec<u8>>,
}

impl StateOps {
    pub(crate) fn of(changes: &StateMap, keys: &StateKeys, first_key: usize) -> StateOps {
        let mut ops = StateOps {
            keys: Vec::new(),
            args: Vec::new(),
        };
        for (tp, changed) in &changes.0 {
            ops.keys.push(keys.state(tp));
            let index = (first_key + ops.keys.len()).to_string().into_bytes();
            for (key, value) in changed {
                ops.args.push(index.clone());
                let (op, stored) = match value {
                    Some(v) => (b"s".to_vec(), v.to_stored()),
                    None => (b"d".to_vec(), Vec::new()),
                };
                ops.args.extend([op, key.clone(), stored]);
            }
        }
        ops
    }

    /// How many changes.
    pub(crate) fn count(&self) -> usize {
        self.args.len() / 4
    }

    /// The commit script's checks that the hashes are hashes (or absent),
    /// in its check layout: key index, wanted type, field, check.
    pub(crate) fn checks(&self, first_key: usize) -> Vec<Vec<u8>> {
        (1..=self.keys.len())
            .flat_map(|i| {
                [
                    (first_key + i).to_string().into_bytes(),
                    b"hash".to_vec(),
                    Vec::new(),
                    Vec::new(),
                ]
            })
            .collect()
    }
}

/// Reads a Redis sink's keyed state for the pipeline's cache.
pub struct RedisStateStore {
    conn: ConnectionManager,
    prefix: String,
}

impl RedisStateStore {
    /// Opens a connection of its own to `store` (`sluice state`).
    pub async fn open(store: &StoreConnection) -> Result<RedisStateStore, SinkError> {
        let timeout = std::time::Duration::from_millis(store.lock_timeout_ms);
        Ok(RedisStateStore::new(
            connect(&store.url, timeout).await?,
            &store.table_prefix,
        ))
    }

    /// Reads through the sink's connection.
    pub(crate) fn new(conn: ConnectionManager, prefix: &str) -> RedisStateStore {
        RedisStateStore {
            conn,
            prefix: prefix.to_string(),
        }
    }
}

#[async_trait::async_trait]
impl StateStore for RedisStateStore {
    async fn load(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        max_bytes: usize,
    ) -> Result<Option<Vec<(Vec<u8>, StateValue)>>, StateError> {
        let hash = StateKeys::new(&self.prefix, pipeline).state(tp);
        let mut conn = self.conn.clone();
        let (mut cursor, mut bytes, mut entries) = (0u64, 0usize, Vec::new());
        loop {
            let (next, page): (u64, Vec<(Vec<u8>, Vec<u8>)>) = redis::cmd("HSCAN")
                .arg(&hash)
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(StateError::unreadable)?;
            for (key, stored) in page {
                let value = StateValue::from_stored(&stored)?;
                bytes += key.len() + value.size();
                if bytes > max_bytes {
                    return Ok(None);
                }
                entries.push((key, value));
            }
            if next == 0 {
                // HSCAN may return a field twice (a rehash between pages).
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                entries.dedup_by(|a, b| a.0 == b.0);
                return Ok(Some(entries));
            }
            cursor = next;
        }
    }

    async fn get(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        key: &[u8],
    ) -> Result<Option<StateValue>, StateError> {
        let hash = StateKeys::new(&self.prefix, pipeline).state(tp);
        let mut conn = self.conn.clone();
        let stored: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&hash)
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(StateError::unreadable)?;
        stored.map(|s| StateValue::from_stored(&s)).transpose()
    }

    /// Counted inside Redis by a script (one call, the host holds nothing
    /// of the partition; Redis is busy for the length of the hash). The
    /// stored tag and expiry are not the value's bytes (see
    /// [`StateValue::to_stored`]).
    async fn size(&self, pipeline: &str, tp: &TopicPartition) -> Result<StateSize, StateError> {
        const SIZE: &str = r"
            local keys, bytes = 0, 0
            for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
              local stored = redis.call('HGET', KEYS[1], field)
              local head = 1
              if string.byte(stored, 1) == 2 then head = 9 end
              keys = keys + 1
              bytes = bytes + #field + #stored - head
            end
            return {keys, bytes}";
        let hash = StateKeys::new(&self.prefix, pipeline).state(tp);
        let mut conn = self.conn.clone();
        let (keys, bytes): (usize, usize) = redis::Script::new(SIZE)
            .key(&hash)
            .invoke_async(&mut conn)
            .await
            .map_err(StateError::unreadable)?;
        Ok(StateSize { keys, bytes })
    }

    /// One `HMGET` of the partition's hash.
    async fn get_many(
        &self,
        pipeline: &str,
        tp: &TopicPartition,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<StateValue>>, StateError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let hash = StateKeys::new(&self.prefix, pipeline).state(tp);
        let mut conn = self.conn.clone();
        let stored: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(&hash)
            .arg(keys)
            .query_async(&mut conn)
            .await
            .map_err(StateError::unreadable)?;
        stored
            .iter()
            .map(|s| s.as_deref().map(StateValue::from_stored).transpose())
            .collect()
    }
}

//! Connections to Redis and what its errors mean to the batch loop: an
//! outage (retry), an answer that never came (read the offsets back), or a
//! refusal (fatal). Also the names of sluice's own keys.
//!
//! It must not write: the sink, the module store and the lineage reader do.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, ServerErrorKind};
use sluice_core::sink::{SinkError, redact_url};
use sluice_core::store::StoreError;
use std::time::Duration;

/// Opens a connection that reconnects by itself after an outage. Replies
/// slower than `timeout` count as lost.
pub async fn connect(url: &str, timeout: Duration) -> Result<ConnectionManager, SinkError> {
    let cannot = |e| SinkError::connecting(&redact_url(url), e);
    let client = redis::Client::open(url)
        .map_err(|e| SinkError::Config(format!("`{}` is not a Redis URL: {e}", redact_url(url))))?;
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(cannot)
}

/// Every element of the list `key` (LRANGE 0 -1), oldest first.
pub async fn whole_list(conn: &ConnectionManager, key: &str) -> Result<Vec<String>, RedisError> {
    let mut conn = conn.clone();
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
}

/// True if the request never reached Redis or Redis refused it for now
/// (loading, busy with a script): nothing was done, try again.
fn is_outage(e: &RedisError) -> bool {
    e.is_connection_refusal()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::TryAgain)
        )
        || e.code() == Some("BUSY")
        || e.code() == Some("MASTERDOWN")
}

/// True if the request may have run without its answer arriving.
fn is_lost_reply(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
}

/// A failed read or a write that is safe to repeat.
pub fn sink_err(what: &str, e: RedisError) -> SinkError {
    if is_outage(&e) || is_lost_reply(&e) {
        SinkError::unavailable(what, e)
    } else {
        SinkError::database(what, e)
    }
}

/// A failed commit script: unknown outcome if it may have run.
pub fn commit_err(e: RedisError) -> SinkError {
    if is_outage(&e) {
        SinkError::unavailable("running the commit script", e)
    } else if is_lost_reply(&e) {
        SinkError::commit_unknown("the commit script's reply was lost", e)
    } else {
        SinkError::database("the commit script", e)
    }
}

/// A failed module store operation.
pub fn store_err(what: &str, e: RedisError) -> StoreError {
    if is_outage(&e) || is_lost_reply(&e) {
        StoreError::Unavailable {
            context: what.to_string(),
            cause: Some(Box::new(e)),
        }
    } else {
        StoreError::Database {
            context: what.to_string(),
            cause: Some(Box::new(e)),
        }
    }
}

/// The names of sluice's own keys for one pipeline, under the sink's
/// prefix.
#[derive(Debug, Clone)]
pub struct StateKeys {
    /// Hash: `topic:partition` -> next offset.
    pub checkpoints: String,
    /// List of JSON lineage entries, oldest first (trimmed by count).
    pub lineage: String,
    /// List of JSON dead letters, oldest first.
    pub dead_letters: String,
    /// How many times `sluice reset` moved this pipeline's checkpoints.
    pub resets: String,
    /// Where the keyed-state hashes' names start (see [`StateKeys::state`]).
    state: String,
}

impl StateKeys {
    pub fn new(prefix: &str, pipeline: &str) -> StateKeys {
        StateKeys {
            checkpoints: format!("{prefix}checkpoints:{pipeline}"),
            lineage: format!("{prefix}lineage:{pipeline}"),
            dead_letters: format!("{prefix}dead_letters:{pipeline}"),
            resets: format!("{prefix}resets:{pipeline}"),
            state: format!("{prefix}state:{pipeline}:"),
        }
    }

    /// Hash of one partition's keyed state: state key -> stored value
    /// ([`crate::state`] encodes it).
    pub fn state(&self, tp: &sluice_core::batch::TopicPartition) -> String {
        format!("{}{}", self.state, Self::field(&tp.topic, tp.partition))
    }

    /// The checkpoint hash's field of a partition.
    pub fn field(topic: &str, partition: i32) -> String {
        format!("{topic}:{partition}")
    }
}

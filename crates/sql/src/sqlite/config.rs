//! Connection settings of the SQLite sink, derived from the sink URL.
//!
//! Owns the pragmas exactly-once relies on (WAL, `synchronous=FULL`, a busy
//! timeout so several hosts can share one file). It must not open anything.

use crate::sink::SinkError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use std::str::FromStr;
use std::time::Duration;

/// How the SQLite sink connects.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    pub options: SqliteConnectOptions,
}

impl SqliteConfig {
    /// Parses `sqlite://PATH`; the file is created if missing. A writer
    /// waits up to `lock_timeout_ms` for another's lock.
    pub fn from_url(url: &str, lock_timeout_ms: u64) -> Result<Self, SinkError> {
        if !url.starts_with("sqlite:") {
            return Err(SinkError::Config(format!(
                "unsupported sink URL `{url}`: this build supports sqlite://PATH"
            )));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| SinkError::Config(format!("bad SQLite URL `{url}`: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_millis(lock_timeout_ms));
        Ok(SqliteConfig { options })
    }
}

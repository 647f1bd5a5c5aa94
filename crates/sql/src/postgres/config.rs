//! Connection settings of the Postgres sink, derived from the sink URL.
//!
//! Owns the pool settings (small: one connection commits, one reads
//! checkpoints) and the timeouts that turn a dead server into a retriable
//! error instead of a hang, and a stalled peer's locks into a bounded wait. It must not open anything.

use crate::sink::{SinkError, redact_url};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;

/// How the Postgres sink connects.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    pub options: PgConnectOptions,
    pub pool: PgPoolOptions,
}

impl PostgresConfig {
    /// Parses `postgres://user[:password]@host[:port]/database[?options]`;
    /// every session gets `lock_timeout_ms` as its lock and
    /// idle-in-transaction timeouts (`sink.lock_timeout_ms`).
    pub fn from_url(url: &str, lock_timeout_ms: u64) -> Result<Self, SinkError> {
        let timeout = lock_timeout_ms.max(1).to_string();
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| SinkError::Config(format!("bad Postgres URL `{}`: {e}", redact_url(url))))?
            .application_name("sluice")
            .options([
                ("lock_timeout", timeout.as_str()),
                ("idle_in_transaction_session_timeout", timeout.as_str()),
            ]);
        let pool = crate::pool::pool_options::<sqlx::Postgres>(2)
            .acquire_timeout(crate::pool::ACQUIRE_TIMEOUT);
        Ok(PostgresConfig { options, pool })
    }
}

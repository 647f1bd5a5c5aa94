//! Connection settings of the Postgres sink, derived from the sink URL.
//!
//! Owns the pool settings (small: one connection commits, one reads
//! checkpoints) and the timeouts that turn a dead server into a retriable
//! error instead of a hang. It must not open anything.

use crate::sink::{SinkError, redact_url};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;
use std::time::Duration;

/// How the Postgres sink connects.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    pub options: PgConnectOptions,
    pub pool: PgPoolOptions,
}

impl PostgresConfig {
    /// Parses `postgres://user[:password]@host[:port]/database[?options]`.
    pub fn from_url(url: &str) -> Result<Self, SinkError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| SinkError::Config(format!("bad Postgres URL `{}`: {e}", redact_url(url))))?
            .application_name("sluice");
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10));
        Ok(PostgresConfig { options, pool })
    }
}

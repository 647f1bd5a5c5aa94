//! Connection settings of the MySQL/MariaDB sink, derived from the sink URL.
//!
//! Owns the pool settings and the URL schemes accepted (`mysql://`,
//! `mariadb://`). It must not open anything.

use crate::sink::{SinkError, redact_url};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use std::str::FromStr;
use std::time::Duration;

/// How the MySQL sink connects.
#[derive(Debug, Clone)]
pub struct MysqlConfig {
    pub options: MySqlConnectOptions,
    pub pool: MySqlPoolOptions,
}

impl MysqlConfig {
    /// Parses `mysql://user[:password]@host[:port]/database` (or
    /// `mariadb://...`).
    pub fn from_url(url: &str) -> Result<Self, SinkError> {
        let normalized = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_string(),
        };
        let options = MySqlConnectOptions::from_str(&normalized)
            .map_err(|e| SinkError::Config(format!("bad MySQL URL `{}`: {e}", redact_url(url))))?
            .charset("utf8mb4");
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10));
        Ok(MysqlConfig { options, pool })
    }
}

//! Connection settings of the MySQL/MariaDB sink, derived from the sink URL.
//!
//! Owns the pool settings, the session timeouts that bound a stalled
//! peer's locks, and the URL schemes accepted (`mysql://`, `mariadb://`). It must not open anything.

use crate::sink::{SinkError, redact_url};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use std::str::FromStr;

/// How the MySQL sink connects.
#[derive(Debug, Clone)]
pub struct MysqlConfig {
    pub options: MySqlConnectOptions,
    pub pool: MySqlPoolOptions,
}

impl MysqlConfig {
    /// Parses `mysql://user[:password]@host[:port]/database` (or
    /// `mariadb://...`); every session gets `lock_timeout_ms` (rounded up
    /// to seconds) as its lock-wait and idle-transaction timeouts.
    pub fn from_url(url: &str, lock_timeout_ms: u64) -> Result<Self, SinkError> {
        let normalized = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_string(),
        };
        let options = MySqlConnectOptions::from_str(&normalized)
            .map_err(|e| SinkError::Config(format!("bad MySQL URL `{}`: {e}", redact_url(url))))?
            .charset("utf8mb4");
        let seconds = lock_timeout_ms.div_ceil(1000).max(1);
        let pool = crate::pool::pool_options::<sqlx::MySql>(2)
            .acquire_timeout(crate::pool::ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _| Box::pin(bound_waits(conn, seconds)));
        Ok(MysqlConfig { options, pool })
    }
}

/// Bounds how long this session waits for a lock, and how long the server
/// keeps it while it sits idle inside a transaction (a frozen or cut-off
/// client): MariaDB's `idle_transaction_timeout`; MySQL has none, so there
/// `wait_timeout` (idle sessions of the pool are then closed too, and
/// replaced when next needed).
async fn bound_waits(conn: &mut MySqlConnection, seconds: u64) -> Result<(), sqlx::Error> {
    sqlx::query(&format!("SET SESSION innodb_lock_wait_timeout = {seconds}"))
        .execute(&mut *conn)
        .await?;
    let idle = format!("SET SESSION idle_transaction_timeout = {seconds}");
    if sqlx::query(&idle).execute(&mut *conn).await.is_err() {
        sqlx::query(&format!("SET SESSION wait_timeout = {seconds}"))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

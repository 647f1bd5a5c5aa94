//! A connection to a SQL sink's database through sqlx's `Any` driver, for
//! what reads and writes sluice's tables outside the batch path (the module
//! store, lineage readers for `verify` and `shadow`), with the dialect to
//! quote for.
//!
//! It must not be used for batch commits: those go through each backend's
//! own typed connection and bulk path.

use super::{Dialect, MYSQL, POSTGRES, SQLITE};
use crate::config::StoreConnection;
use crate::sink::{SinkError, SinkKind, redact_url};
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};
use std::sync::Once;

/// Opens a small pool on the sink's database (it must exist: the sink or
/// an earlier run created it).
pub async fn connect_any(sink: &StoreConnection) -> Result<(AnyPool, &'static Dialect), SinkError> {
    static DRIVERS: Once = Once::new();
    DRIVERS.call_once(sqlx::any::install_default_drivers);
    let dialect = match sink.kind()? {
        SinkKind::Sqlite => &SQLITE,
        SinkKind::Postgres => &POSTGRES,
        SinkKind::Mysql => &MYSQL,
        other => {
            return Err(SinkError::Config(format!(
                "a {} URL is not a SQL database",
                other.as_str()
            )));
        }
    };
    // One connection for SQLite: an in-memory database is per connection.
    let connections = if std::ptr::eq(dialect, &SQLITE) { 1 } else { 2 };
    let mysql = std::ptr::eq(dialect, &MYSQL);
    let pool = crate::pool::pool_options::<sqlx::Any>(connections)
        .acquire_timeout(crate::pool::ACQUIRE_TIMEOUT)
        // MySQL's default, made sure of: a state read's snapshot
        // (`SqlStateStore`) is REPEATABLE READ's, whatever the server's
        // `transaction_isolation`.
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if mysql {
                    use sqlx::Executor;
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        .await?;
                }
                Ok(())
            })
        })
        .connect(&any_url(&sink.url))
        .await
        .map_err(|e| SinkError::connecting(&redact_url(&sink.url), e))?;
    Ok((pool, dialect))
}

/// Text column `i` of `row`. MySQL reports `TEXT`/`LONGTEXT` columns to
/// the `Any` driver as `BLOB`, so bytes are accepted too (as UTF-8).
pub fn text_at(row: &AnyRow, i: usize) -> Result<String, sqlx::Error> {
    match row.try_get::<String, _>(i) {
        Ok(text) => Ok(text),
        Err(e) => match row.try_get::<Vec<u8>, _>(i) {
            Ok(bytes) => String::from_utf8(bytes).map_err(|_| e),
            Err(_) => Err(e),
        },
    }
}

/// The sink URL as the `Any` driver takes it.
fn any_url(url: &str) -> String {
    match url.split_once("://") {
        Some(("mariadb", rest)) => format!("mysql://{rest}"),
        Some(("postgresql", rest)) => format!("postgres://{rest}"),
        // A state store of its own may be a new file.
        Some(("sqlite", rest)) if !rest.contains('?') => format!("sqlite://{rest}?mode=rwc"),
        _ => url.to_string(),
    }
}

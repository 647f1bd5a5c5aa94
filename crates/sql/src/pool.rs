//! How every connection pool of the SQL sinks is set up: the one place
//! their options start from, so a setting every pool needs is said once.
//!
//! It must not open connections or hold pools: the backends do.

use sqlx::Database;
use sqlx::pool::PoolOptions;
use std::time::Duration;

/// How long the Postgres, MySQL and state-store pools wait for a
/// connection before the statement fails (and the caller's retry policy
/// takes over). The SQLite sink keeps sqlx's default.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A pool of at most `connections`, with no background reaper.
///
/// sqlx's default pool closes idle and old connections from a background
/// task; in sqlx 0.8.6 that task can spin for ever at 100% CPU, and keep
/// the process from exiting, when its idle count underflows in a race
/// (launchbadge/sqlx#3645; the fix, sqlx PR #4289, is in no release this
/// workspace uses). Seen here: a `sluice verify` that had printed its
/// result never exited. sluice's pools hold one or two connections, so
/// nothing is lost by not reaping them: a connection the server closed is
/// replaced when next taken (sqlx checks it first), and an in-memory
/// SQLite database (one per connection) is no longer dropped with an idle
/// connection after ten minutes.
pub fn pool_options<DB: Database>(connections: u32) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(connections)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
}

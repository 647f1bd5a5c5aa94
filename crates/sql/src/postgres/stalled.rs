//! Ends sluice sessions whose process froze in the middle of a statement,
//! so a frozen instance holds the others up for a bounded time.
//!
//! Postgres ends a frozen client's transaction by itself only while the
//! session is idle in it (`idle_in_transaction_session_timeout`). A client
//! frozen inside `COPY ... FROM STDIN` (append targets, keyed state) leaves
//! its session *active*, waiting for data (`ClientRead`): no timeout of the
//! server's ends it, and its locks (the checkpoint rows it moved first of
//! all) stay until the process wakes. So an instance whose statement timed
//! out on a lock ends every session that is sluice's, of the same user and
//! database, holds a transaction, and has waited on its client inside one
//! statement for longer than `sink.lock_timeout_ms`: sluice sends a
//! statement's data as soon as it starts, so such a session's process is
//! stalled. Ending it rolls its transaction back and nothing of its batch
//! lands; when it wakes, it resolves the batch from the checkpoint like any
//! frozen instance (see `docs/operations.md`).
//!
//! It must not end a session for any other reason, nor decide retries:
//! the statement that timed out is retried by the pipeline as before.

use crate::sink::SinkError;
use sqlx::postgres::PgPool;
use std::time::Duration;

/// Sessions of sluice (same application name, user and database) holding a
/// transaction and waiting on their client in one statement for longer
/// than `$1` milliseconds: each is ended, and its pid returned (the CTE is
/// materialized so no other session is ever ended: SQL does not order the
/// conditions of one `WHERE`).
const END_STALLED: &str = "\
    WITH stalled AS MATERIALIZED (SELECT pid FROM pg_stat_activity \
      WHERE application_name = current_setting('application_name') \
        AND datname = current_database() AND usename = current_user \
        AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL \
        AND state = 'active' AND wait_event_type = 'Client' AND wait_event = 'ClientRead' \
        AND state_change < clock_timestamp() - make_interval(secs => $1::bigint / 1000.0)) \
    SELECT pid FROM stalled WHERE pg_terminate_backend(pid)";

/// Whether `e` is Postgres's `lock_not_available` (55P03): a statement
/// waited `lock_timeout` for a lock.
pub fn timed_out_on_a_lock(e: &SinkError) -> bool {
    let code = std::error::Error::source(e)
        .and_then(|cause| cause.downcast_ref::<sqlx::Error>())
        .and_then(|e| e.as_database_error())
        .and_then(|d| d.code());
    code.as_deref() == Some("55P03")
}

/// Ends the sessions stalled inside a statement for longer than
/// `stalled_for` (see the module header); logs each and returns their
/// pids. Failing to look or to end one is logged and otherwise ignored:
/// the caller's own error is the one that matters.
pub async fn end_stalled_sessions(pool: &PgPool, stalled_for: Duration) -> Vec<i32> {
    let ended: Result<Vec<i32>, sqlx::Error> = sqlx::query_scalar(END_STALLED)
        .bind(stalled_for.as_millis() as i64)
        .fetch_all(pool)
        .await;
    match ended {
        Ok(pids) => {
            for &pid in &pids {
                tracing::warn!(
                    pid,
                    "ended a sluice session of this database that held locks while waiting on its \
                     client inside a statement for over {} ms (its process is frozen)",
                    stalled_for.as_millis()
                );
            }
            pids
        }
        Err(e) => {
            tracing::warn!("could not look for stalled sluice sessions: {e}");
            Vec::new()
        }
    }
}

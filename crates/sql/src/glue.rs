//! The sqlx glue every SQL backend needs, written once: binding sluice's
//! parameters and cells, running a statement on the pool or a batch
//! transaction, reading integers or bytes back. sqlx has no trait for rows
//! affected, so these are generated per database by macro; each backend
//! invokes them with its database type and its own error classifier
//! (`db_err`: which server errors are worth retrying is the backend's).
//!
//! It must not decide anything about errors or SQL text: it only moves
//! values between sluice's types and sqlx's.

/// Generates `args`, `execute_on`, `query_i64_on`, `query_i64s_on` and
/// `query_blobs_on` for database `$db`,
/// turning sqlx errors into `SinkError`s with `$db_err`.
macro_rules! statements_on {
    ($db:ty, $db_err:path) => {
        fn args<'q>(
            params: &[$crate::Param<'q>],
        ) -> Result<<$db as sqlx::Database>::Arguments<'q>, $crate::sink::SinkError> {
            use sqlx::Arguments;
            let mut args = <$db as sqlx::Database>::Arguments::<'q>::default();
            for p in params {
                match *p {
                    $crate::Param::Int(x) => args.add(x),
                    $crate::Param::Text(s) => args.add(s),
                    $crate::Param::Bytes(b) => args.add(b),
                }
                .map_err(|e| $crate::sink::SinkError::database("cannot bind value", e))?;
            }
            Ok(args)
        }

        /// Runs one statement on `executor` (the pool or a batch
        /// transaction); returns rows affected.
        async fn execute_on<'c>(
            executor: impl sqlx::Executor<'c, Database = $db>,
            sql: &str,
            params: &[$crate::Param<'_>],
        ) -> Result<u64, $crate::sink::SinkError> {
            Ok(sqlx::query_with(sql, args(params)?)
                .execute(executor)
                .await
                .map_err($db_err)?
                .rows_affected())
        }

        /// The first column of the first row `sql` returns on `executor`,
        /// if any.
        async fn query_i64_on<'c>(
            executor: impl sqlx::Executor<'c, Database = $db>,
            sql: &str,
            params: &[$crate::Param<'_>],
        ) -> Result<Option<i64>, $crate::sink::SinkError> {
            use sqlx::Row;
            let row = sqlx::query_with(sql, args(params)?)
                .fetch_optional(executor)
                .await
                .map_err($db_err)?;
            Ok(row.map(|r| r.get::<i64, _>(0)))
        }

        /// Every column of the first row `sql` returns on `executor`, as
        /// integers, if there is a row.
        async fn query_i64s_on<'c>(
            executor: impl sqlx::Executor<'c, Database = $db>,
            sql: &str,
            params: &[$crate::Param<'_>],
        ) -> Result<Option<Vec<i64>>, $crate::sink::SinkError> {
            use sqlx::Row;
            let row = sqlx::query_with(sql, args(params)?)
                .fetch_optional(executor)
                .await
                .map_err($db_err)?;
            row.map(|r| (0..r.len()).map(|i| r.try_get::<i64, _>(i)).collect())
                .transpose()
                .map_err($db_err)
        }

        /// Every row `sql` returns on `executor`, each column as bytes.
        async fn query_blobs_on<'c>(
            executor: impl sqlx::Executor<'c, Database = $db>,
            sql: &str,
            params: &[$crate::Param<'_>],
        ) -> Result<Vec<Vec<Vec<u8>>>, $crate::sink::SinkError> {
            use sqlx::Row;
            let rows = sqlx::query_with(sql, args(params)?)
                .fetch_all(executor)
                .await
                .map_err($db_err)?;
            rows.iter()
                .map(|r| (0..r.len()).map(|i| r.try_get::<Vec<u8>, _>(i)).collect())
                .collect::<Result<_, _>>()
                .map_err($db_err)
        }
    };
}

/// Generates `bind`, which adds one output cell to a multi-row statement's
/// arguments for database `$db`.
macro_rules! cells_on {
    ($db:ty) => {
        fn bind<'q>(
            args: &mut <$db as sqlx::Database>::Arguments<'q>,
            cell: $crate::Cell<'q>,
        ) -> Result<(), $crate::sink::SinkError> {
            use sqlx::Arguments;
            match cell {
                $crate::Cell::Integer(v) => args.add(v),
                $crate::Cell::Real(v) => args.add(v),
                $crate::Cell::Text(v) => args.add(v),
                $crate::Cell::Blob(v) => args.add(v),
                $crate::Cell::Boolean(v) => args.add(v),
            }
            .map_err(|e| $crate::sink::SinkError::database("cannot bind value", e))
        }
    };
}

pub(crate) use {cells_on, statements_on};

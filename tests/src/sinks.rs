//! The databases a test pipeline commits into, behind one handle: a SQLite
//! file, a fresh Postgres schema or a fresh MariaDB database (dropped and
//! recreated per test, so each test owns its tables), with the queries the
//! tests check results by.
//!
//! Services are found by `SLUICE_TEST_POSTGRES_URL` / `SLUICE_TEST_MYSQL_URL`
//! with the local defaults. It must not write into a pipeline's tables.

use crate::scenarios::TestSink;
use crate::{PipelineToml, Seen};
use sqlx::AnyPool;
use std::path::PathBuf;
use std::sync::Once;

pub fn postgres_url() -> String {
    std::env::var("SLUICE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub fn mysql_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// Where a test pipeline commits.
#[derive(Debug, Clone)]
pub enum SinkDb {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
    Mysql { url: String, schema: String },
}

async fn connect(url: &str) -> AnyPool {
    static DRIVERS: Once = Once::new();
    DRIVERS.call_once(sqlx::any::install_default_drivers);
    // No idle reaper: sqlx 0.8.6's can spin at exit (sluice_sql::pool).
    sluice::sink::sql::pool::pool_options::<sqlx::Any>(2)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

impl SinkDb {
    /// A Postgres schema `name`, dropped first.
    pub async fn fresh_postgres(name: &str) -> SinkDb {
        let url = postgres_url();
        let pool = connect(&url).await;
        sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
            .execute(&pool)
            .await
            .expect("drop schema");
        SinkDb::Postgres {
            url,
            schema: name.into(),
        }
    }

    /// A MariaDB database `name`, dropped first.
    pub async fn fresh_mysql(name: &str) -> SinkDb {
        let url = mysql_url();
        let pool = connect(&url).await;
        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{name}`"))
            .execute(&pool)
            .await
            .expect("drop database");
        SinkDb::Mysql {
            url,
            schema: name.into(),
        }
    }

    pub fn url(&self) -> String {
        match self {
            SinkDb::Sqlite(path) => format!("sqlite://{}", path.display()),
            SinkDb::Postgres { url, .. } | SinkDb::Mysql { url, .. } => url.clone(),
        }
    }

    /// Points `config`'s `[sink]` here (`url`, and `schema` on servers).
    pub fn configure(&self, config: PipelineToml) -> PipelineToml {
        self.configure_via(config, &self.url())
    }

    /// [`SinkDb::configure`], connecting through `url` instead (a fault
    /// proxy).
    pub fn configure_via(&self, config: PipelineToml, url: &str) -> PipelineToml {
        let config = config.sink_url(url);
        match self {
            SinkDb::Sqlite(_) => config,
            SinkDb::Postgres { schema, .. } | SinkDb::Mysql { schema, .. } => {
                config.sink("schema", schema.as_str())
            }
        }
    }

    /// `name` quoted (and schema-qualified for tables) in this dialect.
    pub fn ident(&self, name: &str) -> String {
        match self {
            SinkDb::Mysql { .. } => format!("`{name}`"),
            _ => format!("\"{name}\""),
        }
    }

    pub fn table(&self, name: &str) -> String {
        match self {
            SinkDb::Sqlite(_) => self.ident(name),
            SinkDb::Postgres { schema, .. } | SinkDb::Mysql { schema, .. } => {
                format!("{}.{}", self.ident(schema), self.ident(name))
            }
        }
    }

    pub async fn pool(&self) -> AnyPool {
        connect(&self.url()).await
    }

    /// One integer; `None` if the query fails (e.g. no table yet).
    pub async fn scalar(&self, sql: &str) -> Option<i64> {
        if let SinkDb::Sqlite(path) = self
            && !path.exists()
        {
            return None;
        }
        let pool = self.pool().await;
        let value = sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&pool)
            .await
            .ok();
        pool.close().await;
        value
    }

    /// Every partition's stored checkpoint (its next offset) by partition
    /// number; empty before the first commit.
    pub async fn checkpoints(&self) -> std::collections::BTreeMap<i64, i64> {
        let sql = format!(
            "SELECT {}, {} FROM {}",
            self.ident("partition"),
            self.ident("next_offset"),
            self.table("sluice_checkpoints")
        );
        let pool = self.pool().await;
        let rows: Vec<(i64, i64)> = sqlx::query_as(&sql)
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
        pool.close().await;
        rows.into_iter().collect()
    }

    /// Waits until `pipeline`'s checkpoints add up to `total` (its
    /// partitions' logs start at 0: all of `total` records committed);
    /// fails after `limit` with `logs()`.
    pub async fn wait_for_committed_total(
        &self,
        pipeline: &str,
        total: i64,
        limit: std::time::Duration,
        logs: impl Fn() -> String,
    ) {
        let sql = format!(
            "SELECT CAST(sum({}) AS BIGINT) FROM {} WHERE pipeline = '{pipeline}'",
            self.ident("next_offset"),
            self.table("sluice_checkpoints")
        );
        let deadline = std::time::Instant::now() + limit;
        while self.scalar(&sql).await != Some(total) {
            assert!(
                std::time::Instant::now() < deadline,
                "not caught up with {total} records\n{}",
                logs()
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// How many batches the pipelines committed (0 before the first).
    pub async fn committed_batches(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.table("sluice_batches"));
        self.scalar(&sql).await.unwrap_or(0)
    }

    pub async fn dead_letters(&self) -> i64 {
        let sql = format!("SELECT count(*) FROM {}", self.table("sluice_dead_letters"));
        self.scalar(&sql).await.expect("dead letters table")
    }

    /// The `records` table of an identity pipeline, in (partition, offset)
    /// order.
    pub async fn identity_rows(&self) -> Vec<Seen> {
        let (p, o) = (self.ident("partition"), self.ident("offset"));
        let sql = format!(
            "SELECT {p}, {o}, {k}, {v} FROM {t} ORDER BY {p}, {o}",
            k = self.ident("key"),
            v = self.ident("value"),
            t = self.table("records")
        );
        let pool = self.pool().await;
        let rows: Vec<crate::RecordRow> = sqlx::query_as(&sql)
            .fetch_all(&pool)
            .await
            .expect("records table");
        rows.into_iter()
            .map(|(partition, offset, key, value)| Seen {
                partition: partition as i32,
                offset,
                key: key.map(|k| String::from_utf8_lossy(&k).into_owned()),
                value: String::from_utf8_lossy(&value.unwrap_or_default()).into_owned(),
            })
            .collect()
    }

    /// `(text, integer)` pairs of a two-column query, e.g. word counts.
    pub async fn pairs(&self, table: &str, a: &str, b: &str) -> Vec<(String, i64)> {
        let sql = format!(
            "SELECT {a}, {b} FROM {t} ORDER BY {a}",
            a = self.ident(a),
            b = self.ident(b),
            t = self.table(table)
        );
        let pool = self.pool().await;
        sqlx::query_as(&sql).fetch_all(&pool).await.expect("query")
    }

    /// Asserts lineage rows form contiguous ranges per partition: each range
    /// starts where the previous one ended, with no overlap and no gap.
    /// Returns how many batches `pipeline` committed.
    pub async fn assert_contiguous_lineage(&self, pipeline: &str) -> usize {
        let sql = format!(
            "SELECT topic, {p}, from_offset, until_offset FROM {t} WHERE pipeline = '{pipeline}' \
             ORDER BY topic, {p}, from_offset",
            p = self.ident("partition"),
            t = self.table("sluice_batch_ranges")
        );
        let pool = self.pool().await;
        let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(&sql)
            .fetch_all(&pool)
            .await
            .expect("lineage");
        crate::assert_ranges_contiguous(rows);
        let batches = format!(
            "SELECT count(*) FROM {} WHERE pipeline = '{pipeline}'",
            self.table("sluice_batches")
        );
        self.scalar(&batches).await.expect("batches table") as usize
    }

    /// Asserts the `records` table of an identity pipeline equals the
    /// committed input of `topic`, row for row (an independent
    /// `read_committed` read), with contiguous lineage and no dead letters;
    /// returns the row count.
    pub async fn assert_exactly_once(
        &self,
        brokers: &str,
        topic: &str,
        partitions: i32,
        pipeline: &str,
    ) -> usize {
        let expected = crate::read_committed(brokers, topic, partitions);
        self.assert_identity_exactly_once(pipeline, &expected).await
    }
}

impl TestSink for SinkDb {
    fn label(&self) -> String {
        match self {
            SinkDb::Sqlite(_) => "sqlite",
            SinkDb::Postgres { .. } => "postgres",
            SinkDb::Mysql { .. } => "mariadb",
        }
        .into()
    }

    fn configure(&self, config: PipelineToml) -> PipelineToml {
        SinkDb::configure(self, config)
    }

    async fn progress(&self, _pipeline: &str) -> i64 {
        self.committed_batches().await
    }

    /// The `records` table (none before the first batch made it).
    async fn identity_output(&self) -> Vec<Seen> {
        let exists = format!("SELECT count(*) FROM {}", self.table("records"));
        match self.scalar(&exists).await {
            Some(_) => self.identity_rows().await,
            None => Vec::new(),
        }
    }

    async fn assert_lineage(&self, pipeline: &str) -> usize {
        let batches = self.assert_contiguous_lineage(pipeline).await;
        assert_eq!(self.dead_letters().await, 0);
        batches
    }
}

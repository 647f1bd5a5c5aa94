//! The module store: components content-addressed by sha256, and each
//! pipeline's history of activations, kept in the pipeline's state store
//! (the sink's database: SQLite, Postgres or MySQL/MariaDB) so every
//! instance of a pipeline sees the same versions.
//!
//! Owns the two tables (`<prefix>modules`, `<prefix>versions`) and their
//! statements in every dialect. It must not compile or run modules (that is
//! `runtime`), nor decide when a host swaps (that is `pipeline`). A version
//! row is only ever appended: rollback appends the earlier version again.

use crate::batch::{now_ms, sha256_hex};
use crate::config::StoreConnection;
use crate::section::SqlSinkFields;
use crate::sink::SinkError;
use crate::{Dialect, connect_any, text_at};
use sluice_core::backoff::{GiveUp, RetryPolicy};
use sluice_core::error::Chain;
use sluice_core::store::{Activation, ModuleStore, StoreError, Version};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyPool, Row, Transaction};
use std::time::Duration;

/// How an activation is tried again when another one took the same
/// version number first (at once) or SQLite was busy (after the wait):
/// 10 tries, waits from 50 ms doubling up to 500 ms.
const ACTIVATION_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(50),
    max: Duration::from_millis(500),
    give_up: GiveUp::AfterTries(10),
};

/// The module store in a SQL sink's database.
pub struct SqlModuleStore {
    pool: AnyPool,
    sql: Statements,
}

/// The store's statements, quoted once.
struct Statements {
    create_modules: String,
    create_versions: String,
    insert_module: String,
    select_module: String,
    module_exists: String,
    max_version: String,
    insert_version: String,
    select_active: String,
    select_history: String,
}

impl Statements {
    fn new(d: &Dialect, schema: Option<&str>, prefix: &str) -> Result<Self, StoreError> {
        let table = |name: &str| {
            d.qualified(schema, &format!("{prefix}{name}"))
                .map_err(StoreError::Settings)
        };
        let (modules, versions) = (table("modules")?, table("versions")?);
        let c = |name: &str| d.ident(name).expect("sluice's own column names are valid");
        let t = &d.types;
        let version_cols = [
            "pipeline",
            "version",
            "module_digest",
            "params",
            "params_digest",
            "action",
            "activated_at_ms",
        ];
        let listed = |cols: &[&str]| cols.iter().map(|n| c(n)).collect::<Vec<_>>().join(", ");
        let insert_module = format!(
            "INSERT INTO {modules} ({}) VALUES ({})",
            listed(&["digest", "size", "component", "uploaded_at_ms"]),
            d.params(1, 4)
        );
        let insert_module = d.ignoring_conflicts(insert_module);
        let (pipeline, version) = (c("pipeline"), c("version"));
        Ok(Statements {
            create_modules: format!(
                "CREATE TABLE IF NOT EXISTS {modules} ({} {} NOT NULL, {} {} NOT NULL, \
                 {} {} NOT NULL, {} {} NOT NULL, PRIMARY KEY ({}))",
                c("digest"),
                t.key_text,
                c("size"),
                t.bigint,
                c("component"),
                t.blob,
                c("uploaded_at_ms"),
                t.bigint,
                c("digest"),
            ),
            create_versions: format!(
                "CREATE TABLE IF NOT EXISTS {versions} ({pipeline} {kt} NOT NULL, \
                 {version} {bi} NOT NULL, {} {kt} NOT NULL, {} {tx} NOT NULL, \
                 {} {kt} NOT NULL, {} {kt} NOT NULL, {} {bi} NOT NULL, \
                 PRIMARY KEY ({pipeline}, {version}))",
                c("module_digest"),
                c("params"),
                c("params_digest"),
                c("action"),
                c("activated_at_ms"),
                kt = t.key_text,
                bi = t.bigint,
                tx = t.text,
            ),
            insert_module,
            select_module: format!(
                "SELECT {} FROM {modules} WHERE {} = {}",
                c("component"),
                c("digest"),
                d.param(1)
            ),
            module_exists: format!(
                "SELECT {} FROM {modules} WHERE {} = {}",
                c("size"),
                c("digest"),
                d.param(1)
            ),
            max_version: format!(
                "SELECT MAX({version}) FROM {versions} WHERE {pipeline} = {}",
                d.param(1)
            ),
            insert_version: format!(
                "INSERT INTO {versions} ({}) VALUES ({})",
                listed(&version_cols),
                d.params(1, version_cols.len())
            ),
            select_active: format!(
                "SELECT {} FROM {versions} WHERE {pipeline} = {} ORDER BY {version} DESC LIMIT 1",
                listed(&version_cols),
                d.param(1)
            ),
            select_history: format!(
                "SELECT {} FROM {versions} WHERE {pipeline} = {} ORDER BY {version}",
                listed(&version_cols),
                d.param(1)
            ),
        })
    }
}

/// SQLite's "database is busy / locked" (codes 5 and 6 and their extended
/// forms): another connection holds the write lock longer than the busy
/// timeout, or a read transaction could not be upgraded. Transient.
fn is_busy(e: &sqlx::Error) -> bool {
    let code = e.as_database_error().and_then(|d| d.code());
    code.is_some_and(|c| {
        c.parse::<i64>()
            .is_ok_and(|n| n & 0xff == 5 || n & 0xff == 6)
    })
}

fn db_err(e: sqlx::Error) -> StoreError {
    if is_busy(&e) {
        return StoreError::Busy(e.into());
    }
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_) => StoreError::Unavailable {
            context: String::new(),
            cause: Some(e.into()),
        },
        e => StoreError::Database {
            context: String::new(),
            cause: Some(e.into()),
        },
    }
}

fn version_of(row: &AnyRow) -> Result<Version, StoreError> {
    let get_text = |i: usize| text_at(row, i).map_err(db_err);
    let get_int = |i: usize| row.try_get::<i64, _>(i).map_err(db_err);
    Ok(Version {
        pipeline: get_text(0)?,
        version: get_int(1)?,
        module_digest: get_text(2)?,
        params: get_text(3)?,
        params_digest: get_text(4)?,
        action: get_text(5)?,
        activated_at_ms: get_int(6)?,
    })
}

impl SqlModuleStore {
    /// Opens the store in the sink's database (the sink has created the
    /// schema already) and creates its tables if missing.
    pub async fn open(sink: &StoreConnection) -> Result<SqlModuleStore, StoreError> {
        let (pool, dialect) = connect_any(sink).await.map_err(|e| match e {
            SinkError::Unavailable { context, cause } => StoreError::Unavailable {
                context: format!("at {context}"),
                cause,
            },
            e => StoreError::Settings(e),
        })?;
        let schema = SqlSinkFields::of(sink)
            .map_err(|e| StoreError::Settings(e.into()))?
            .schema;
        let sql = Statements::new(dialect, schema.as_deref(), &sink.table_prefix)?;
        let store = SqlModuleStore { pool, sql };
        for ddl in [&store.sql.create_modules, &store.sql.create_versions] {
            store.create(ddl).await?;
        }
        Ok(store)
    }

    /// `CREATE TABLE IF NOT EXISTS`, tried again when several instances
    /// starting at once race on the catalog.
    async fn create(&self, ddl: &str) -> Result<(), StoreError> {
        crate::create_racing(ddl, || async {
            sqlx::query(ddl)
                .execute(&self.pool)
                .await
                .map(drop)
                .map_err(db_err)
        })
        .await
    }

    /// Appends a version row in a transaction, counting again when another
    /// activation took the same number first. With `only_first`, appends
    /// nothing (`None`) if the pipeline has a version already.
    async fn append(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
        action: Activation,
        only_first: bool,
    ) -> Result<Option<Version>, StoreError> {
        let mut backoff = ACTIVATION_RETRY.start();
        loop {
            let mut tx = self.pool.begin().await.map_err(db_err)?;
            let appended = self
                .append_version(&mut tx, pipeline, digest, params, action, only_first)
                .await;
            let outcome = match appended {
                // A commit that failed for a busy database did not happen;
                // any other failed commit may have: never append again.
                Ok(Some(v)) => match tx.commit().await.map_err(db_err) {
                    Ok(()) => Ok(Some(v)),
                    Err(e @ StoreError::Busy(_)) => Err(e),
                    Err(e) => return Err(e),
                },
                other => {
                    let _ = tx.rollback().await;
                    other
                }
            };
            match outcome {
                Ok(Some(v)) => {
                    tracing::info!(
                        pipeline,
                        version = v.version,
                        module = %v.module_digest,
                        action = action.as_str(),
                        "module version activated"
                    );
                    return Ok(Some(v));
                }
                Ok(None) => return Ok(None),
                Err(e @ (StoreError::Database { .. } | StoreError::Busy(_))) => {
                    let Some(wait) = backoff.next_wait() else {
                        return Err(e);
                    };
                    tracing::debug!("activation of {digest}: {}; trying again", Chain(&e));
                    // Another activation took the same number: count again
                    // at once. SQLite refused the write (busy, or a read
                    // that could not become a write while a batch commits):
                    // try again shortly.
                    if let StoreError::Busy(_) = e {
                        tokio::time::sleep(wait).await;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn append_version(
        &self,
        tx: &mut Transaction<'_, Any>,
        pipeline: &str,
        digest: &str,
        params: &str,
        action: Activation,
        only_first: bool,
    ) -> Result<Option<Version>, StoreError> {
        let known = sqlx::query(&self.sql.module_exists)
            .bind(digest.to_string())
            .fetch_optional(&mut **tx)
            .await
            .map_err(db_err)?;
        if known.is_none() {
            return Err(StoreError::UnknownModule(digest.to_string()));
        }
        let newest: Option<i64> = sqlx::query(&self.sql.max_version)
            .bind(pipeline.to_string())
            .fetch_one(&mut **tx)
            .await
            .and_then(|row| row.try_get::<Option<i64>, _>(0))
            .map_err(db_err)?;
        if only_first && newest.is_some() {
            return Ok(None);
        }
        let v = Version {
            pipeline: pipeline.to_string(),
            version: newest.unwrap_or(0) + 1,
            module_digest: digest.to_string(),
            params: params.to_string(),
            params_digest: sha256_hex(params.as_bytes()),
            action: action.as_str().to_string(),
            activated_at_ms: now_ms(),
        };
        sqlx::query(&self.sql.insert_version)
            .bind(v.pipeline.clone())
            .bind(v.version)
            .bind(v.module_digest.clone())
            .bind(v.params.clone())
            .bind(v.params_digest.clone())
            .bind(v.action.clone())
            .bind(v.activated_at_ms)
            .execute(&mut **tx)
            .await
            .map_err(db_err)?;
        Ok(Some(v))
    }
}

#[async_trait::async_trait]
impl ModuleStore for SqlModuleStore {
    async fn put(&self, component: &[u8]) -> Result<String, StoreError> {
        let digest = sha256_hex(component);
        sqlx::query(&self.sql.insert_module)
            .bind(digest.clone())
            .bind(component.len() as i64)
            .bind(component.to_vec())
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(db_err)?;
        Ok(digest)
    }

    async fn get(&self, digest: &str) -> Result<Vec<u8>, StoreError> {
        let row = sqlx::query(&self.sql.select_module)
            .bind(digest.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_err)?
            .ok_or_else(|| StoreError::UnknownModule(digest.to_string()))?;
        row.try_get::<Vec<u8>, _>(0).map_err(db_err)
    }

    async fn active(&self, pipeline: &str) -> Result<Option<Version>, StoreError> {
        sqlx::query(&self.sql.select_active)
            .bind(pipeline.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_err)?
            .map(|row| version_of(&row))
            .transpose()
    }

    async fn history(&self, pipeline: &str) -> Result<Vec<Version>, StoreError> {
        sqlx::query(&self.sql.select_history)
            .bind(pipeline.to_string())
            .fetch_all(&self.pool)
            .await
            .map_err(db_err)?
            .iter()
            .map(version_of)
            .collect()
    }

    async fn activate(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
        action: Activation,
    ) -> Result<Version, StoreError> {
        self.append(pipeline, digest, params, action, false)
            .await
            .map(|v| v.expect("appended unconditionally"))
    }

    async fn seed(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
    ) -> Result<Version, StoreError> {
        if let Some(v) = self
            .append(pipeline, digest, params, Activation::Seed, true)
            .await?
        {
            return Ok(v);
        }
        self.active(pipeline)
            .await?
            .ok_or_else(|| StoreError::Database {
                context: format!("pipeline `{pipeline}` lost its versions"),
                cause: None,
            })
    }
}

//! The module store on Redis, next to a Redis sink's data: components in
//! the hash `<prefix>modules` (sha256 -> bytes), each pipeline's
//! activations in the list `<prefix>versions:<pipeline>` (JSON, oldest
//! first). A version is appended by a script that numbers it one past the
//! newest, so instances activating or seeding at once never share a number.
//!
//! It must not write lineage or checkpoints: those are the commit
//! script's.

use crate::connect::{connect, store_err, whole_list};
use redis::aio::ConnectionManager;
use sluice_core::batch::{now_ms, sha256_hex};
use sluice_core::config::StoreConnection;
use sluice_core::store::{Activation, ModuleStore, StoreError, Version};
use std::time::Duration;

/// Appends a version unless the module is missing (or, with `only_first`,
/// unless the pipeline has one). KEYS: modules hash, versions list. ARGV:
/// digest, the version's JSON without its number and opening brace,
/// only_first. Returns the newest version's JSON, or `missing`. (The JSON
/// is spliced, not re-encoded: Lua's numbers would round large integers.)
const APPEND_VERSION: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 'missing' end
local n = redis.call('LLEN', KEYS[2])
if ARGV[3] == '1' and n > 0 then return redis.call('LINDEX', KEYS[2], -1) end
local text = '{"version":' .. (n + 1) .. ',' .. ARGV[2]
redis.call('RPUSH', KEYS[2], text)
return text
"#;

/// A Redis sink's module store.
pub struct RedisModuleStore {
    conn: ConnectionManager,
    modules: String,
    prefix: String,
    append: redis::Script,
}

impl RedisModuleStore {
    pub async fn open(config: &StoreConnection) -> Result<RedisModuleStore, StoreError> {
        let conn = connect(&config.url, Duration::from_millis(config.lock_timeout_ms))
            .await
            .map_err(|e| StoreError::Unavailable {
                context: String::new(),
                cause: Some(Box::new(e)),
            })?;
        Ok(RedisModuleStore {
            conn,
            modules: format!("{}modules", config.table_prefix),
            prefix: config.table_prefix.clone(),
            append: redis::Script::new(APPEND_VERSION),
        })
    }

    fn versions_key(&self, pipeline: &str) -> String {
        format!("{}versions:{pipeline}", self.prefix)
    }

    async fn append(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
        action: Activation,
        only_first: bool,
    ) -> Result<Version, StoreError> {
        let draft = serde_json::json!({
            "pipeline": pipeline,
            "module_digest": digest,
            "params": params,
            "params_digest": sha256_hex(params.as_bytes()),
            "action": action.as_str(),
            "activated_at_ms": now_ms(),
        })
        .to_string();
        let draft = draft.strip_prefix('{').expect("a JSON object").to_string();
        let mut conn = self.conn.clone();
        let reply: String = self
            .append
            .key(&self.modules)
            .key(self.versions_key(pipeline))
            .arg(digest)
            .arg(draft)
            .arg(if only_first { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .map_err(|e| store_err("appending a version", e))?;
        if reply == "missing" {
            return Err(StoreError::UnknownModule(digest.to_string()));
        }
        parse_version(&reply)
    }
}

fn parse_version(text: &str) -> Result<Version, StoreError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        pipeline: String,
        version: i64,
        module_digest: String,
        params: String,
        params_digest: String,
        action: String,
        activated_at_ms: i64,
    }
    let s: Stored = serde_json::from_str(text).map_err(|e| StoreError::Database {
        context: "a version entry is not sluice's JSON".into(),
        cause: Some(Box::new(e)),
    })?;
    Ok(Version {
        pipeline: s.pipeline,
        version: s.version,
        module_digest: s.module_digest,
        params: s.params,
        params_digest: s.params_digest,
        action: s.action,
        activated_at_ms: s.activated_at_ms,
    })
}

#[async_trait::async_trait]
impl ModuleStore for RedisModuleStore {
    async fn put(&self, component: &[u8]) -> Result<String, StoreError> {
        let digest = sha256_hex(component);
        let mut conn = self.conn.clone();
        redis::cmd("HSETNX")
            .arg(&self.modules)
            .arg(&digest)
            .arg(component)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| store_err("storing a module", e))?;
        Ok(digest)
    }

    async fn get(&self, digest: &str) -> Result<Vec<u8>, StoreError> {
        let mut conn = self.conn.clone();
        let stored: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&self.modules)
            .arg(digest)
            .query_async(&mut conn)
            .await
            .map_err(|e| store_err("reading a module", e))?;
        stored.ok_or_else(|| StoreError::UnknownModule(digest.to_string()))
    }

    async fn active(&self, pipeline: &str) -> Result<Option<Version>, StoreError> {
        let mut conn = self.conn.clone();
        let newest: Option<String> = redis::cmd("LINDEX")
            .arg(self.versions_key(pipeline))
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(|e| store_err("reading the active version", e))?;
        newest.as_deref().map(parse_version).transpose()
    }

    async fn history(&self, pipeline: &str) -> Result<Vec<Version>, StoreError> {
        let all = whole_list(&self.conn, &self.versions_key(pipeline))
            .await
            .map_err(|e| store_err("reading versions", e))?;
        all.iter().map(|t| parse_version(t)).collect()
    }

    async fn activate(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
        action: Activation,
    ) -> Result<Version, StoreError> {
        self.append(pipeline, digest, params, action, false).await
    }

    async fn seed(
        &self,
        pipeline: &str,
        digest: &str,
        params: &str,
    ) -> Result<Version, StoreError> {
        self.append(pipeline, digest, params, Activation::Seed, true)
            .await
    }
}

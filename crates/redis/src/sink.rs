//! The Redis sink: a batch's commands, dead letters, lineage entry and
//! offset moves, committed by one server-side script.
//!
//! # Delivery guarantee
//!
//! `exactly-once` (the default): one `EVALSHA` of `commit.lua` per batch
//! (loaded once, called by its SHA, loaded again on NOSCRIPT). The script
//! first compares every partition's stored next offset with the plan's
//! `from` (the compare-and-set: another owner's move makes it return
//! `fenced` having written nothing), then checks every key's type and
//! every counter, and only then writes the commands, the lineage entry,
//! the dead letters and the offset moves. Redis runs a script alone and
//! whole, so they land together or not at all; a script is not rolled
//! back if it fails halfway, which is why everything that can fail is
//! checked before anything is written (here, before the call; there,
//! before the first write). A reply that never arrives (connection lost,
//! `lock_timeout_ms` passed) is [`SinkError::CommitUnknown`]: the
//! pipeline reads the checkpoints back; a late script finds the offsets
//! moved and is fenced. Durability is Redis's: with `appendonly yes` and
//! `appendfsync always` an acknowledged batch survives the server's death;
//! with less, a crash of Redis can lose acknowledged batches (and their
//! offsets with them, so they are read again, consistently).
//! Depends on (1) the source replaying the same records for the same
//! range, (2) the module being deterministic, (3) Redis's script
//! atomicity.
//!
//! The batch's keyed-state changes (one hash per partition, see `state`)
//! are written by the same script after the same checks (each hash must be
//! a hash or absent), so they land exactly when the offsets move.
//!
//! `at-least-once` (`idempotent`): the commands are pipelined first, then
//! a script moves the offsets (with the same compare-and-set) and writes
//! lineage, dead letters and keyed state. A crash in between runs the commands again,
//! so only idempotent commands are allowed (the config refuses others).
//!
//! It must not write outside one script call per batch in exactly-once
//! mode.

use crate::connect::{StateKeys, commit_err, connect, sink_err};
use crate::render::{CompiledTarget, Rendered, ops_of};
use crate::section::{RedisSection, RedisSinkFields};
use crate::state::{RedisStateStore, StateOps};
use redis::aio::ConnectionManager;
use sluice_core::batch::TopicPartition;
use sluice_core::config::{
    ConfigError, Guarantee, KindSection, SinkConfig, StoreConnection, Writes,
};
use sluice_core::sink::{Commit, CommitOutcome, Sink, SinkError};
use sluice_core::store::LineageEntry;
use std::collections::HashMap;
use std::time::Duration;

/// Most arguments one commit script is given. Redis runs a script alone,
/// blocking every other client. Batches are bounded when planned
/// (`source.max_records_per_batch`); one that would still need more (a
/// module writing many rows per record) fails with a clear error instead
/// of stalling the server.
pub const MAX_SCRIPT_ARGUMENTS: usize = 2_000_000;

/// The Redis sink.
pub struct RedisSink {
    conn: ConnectionManager,
    prefix: String,
    targets: HashMap<String, CompiledTarget>,
    guarantee: Guarantee,
    lineage_keep: u64,
    dead_letters_keep: u64,
    script: redis::Script,
    /// What a redrive looks its dead letters up in (`redrive`).
    pub(crate) redrive_entries: crate::redrive::RedriveEntries,
}

/// Opens the sink `sink` configures (the server must answer).
pub async fn open(sink: &SinkConfig) -> Result<RedisSink, SinkError> {
    open_with(&sink.store(), sink.writes()).await
}

/// Opens `store` to write `writes` ([`Writes::NOTHING`] as another sink's
/// `[state]`: checkpoints and lineage only).
pub async fn open_with(
    store: &StoreConnection,
    writes: Writes<'_>,
) -> Result<RedisSink, SinkError> {
    let fields = RedisSinkFields::of(store)?;
    let targets = writes
        .targets
        .iter()
        .map(|t| {
            let fields = RedisSection::target(t)?;
            Ok((
                t.name.clone(),
                CompiledTarget::new(t, &fields, writes.guarantee)?,
            ))
        })
        .collect::<Result<_, ConfigError>>()?;
    let conn = connect(&store.url, Duration::from_millis(store.lock_timeout_ms)).await?;
    let sink = RedisSink {
        conn,
        prefix: store.table_prefix.clone(),
        targets,
        guarantee: writes.guarantee,
        lineage_keep: fields.lineage_keep(),
        dead_letters_keep: fields.dead_letters_keep(),
        script: redis::Script::new(include_str!("commit.lua")),
        redrive_entries: Default::default(),
    };
    if writes.guarantee == Guarantee::AtLeastOnce {
        tracing::info!(
            "redis sink: at-least-once (idempotent commands pipelined, then offsets): a crash \
             between the two runs a batch's commands again"
        );
    }
    Ok(sink)
}

impl RedisSink {
    /// The commit script's arguments for `c`: offsets, lineage, dead
    /// letters, the stored dead letters a redrive takes (their exact
    /// entries), checks and (unless `with_commands` is false) the commands.
    fn script_call(
        &self,
        c: &Commit<'_>,
        keys: &StateKeys,
        with_commands: bool,
        taken: &[String],
    ) -> Result<redis::ScriptInvocation<'_>, SinkError> {
        let mut rendered = Rendered::default();
        if with_commands {
            for rows in &c.output.targets {
                rendered.add(self.target(&rows.target)?, rows)?;
            }
        }
        let mut checks = rendered.checks()?;
        // The state hashes' KEYS follow the commands' (KEYS[1..3] are
        // sluice's own).
        let first_state_key = 3 + rendered.keys.len();
        let state = StateOps::of(&c.output.state, keys, first_state_key);
        checks.extend(state.checks(first_state_key));
        let mut call = self.script.prepare_invoke();
        call.key(&keys.checkpoints)
            .key(&keys.lineage)
            .key(&keys.dead_letters);
        for k in &rendered.keys {
            call.key(k.as_slice());
        }
        for k in &state.keys {
            call.key(k.as_str());
        }
        call.arg(c.plan.ranges.len());
        for r in &c.plan.ranges {
            call.arg(StateKeys::field(&r.topic, r.partition))
                .arg(r.from)
                .arg(r.until);
        }
        call.arg(LineageEntry::of(c).to_json())
            .arg(self.lineage_keep)
            .arg(self.dead_letters_keep);
        let dead = crate::dead_letters::entries(c);
        call.arg(dead.len());
        for d in &dead {
            call.arg(d);
        }
        call.arg(taken.len());
        for t in taken {
            call.arg(t);
        }
        call.arg(checks.len() / 4);
        for a in &checks {
            call.arg(a.as_slice());
        }
        call.arg(rendered.call_count());
        let calls = rendered.into_calls();
        for a in &calls {
            call.arg(a.as_slice());
        }
        call.arg(state.count());
        for a in &state.args {
            call.arg(a.as_slice());
        }
        let arguments = 9
            + 3 * c.plan.ranges.len()
            + dead.len()
            + taken.len()
            + checks.len()
            + calls.len()
            + state.args.len();
        if arguments > MAX_SCRIPT_ARGUMENTS {
            return Err(SinkError::Config(format!(
                "batch {} needs {arguments} script arguments, over the {MAX_SCRIPT_ARGUMENTS} one \
                 Redis script may take without stalling the server: lower \
                 `source.max_records_per_batch`",
                c.plan.batch_id
            )));
        }
        Ok(call)
    }

    fn target(&self, name: &str) -> Result<&CompiledTarget, SinkError> {
        self.targets.get(name).ok_or_else(|| {
            SinkError::Config(format!(
                "module wrote to target `{name}`, which the sink does not declare"
            ))
        })
    }

    /// Runs the commit script (deleting `taken` with the batch, see
    /// [`Self::script_call`]); its reply.
    pub(crate) async fn run_script(
        &self,
        c: &Commit<'_>,
        with_commands: bool,
        taken: &[String],
    ) -> Result<Vec<String>, SinkError> {
        let keys = StateKeys::new(&self.prefix, &c.plan.pipeline);
        let call = self.script_call(c, &keys, with_commands, taken)?;
        let mut conn = self.conn.clone();
        call.invoke_async(&mut conn).await.map_err(commit_err)
    }

    /// Commits `c` (with `taken` for a redrive) in the sink's guarantee:
    /// the script's reply.
    pub(crate) async fn commit_with(
        &self,
        c: &Commit<'_>,
        taken: &[String],
    ) -> Result<Vec<String>, SinkError> {
        match self.guarantee {
            Guarantee::ExactlyOnce => self.run_script(c, true, taken).await,
            Guarantee::AtLeastOnce => {
                self.write_commands(c).await?;
                // A lost reply only risks the commands running again,
                // which this mode allows: retry like an outage.
                self.run_script(c, false, taken).await.map_err(|e| match e {
                    SinkError::CommitUnknown { context, cause } => {
                        SinkError::Unavailable { context, cause }
                    }
                    other => other,
                })
            }
        }
    }

    /// The sink's connection (readers share it).
    pub(crate) fn conn(&self) -> &ConnectionManager {
        &self.conn
    }

    /// sluice's own keys of `pipeline`.
    pub(crate) fn keys(&self, pipeline: &str) -> StateKeys {
        StateKeys::new(&self.prefix, pipeline)
    }

    /// At-least-once: the commands, pipelined, outside the script.
    async fn write_commands(&self, c: &Commit<'_>) -> Result<(), SinkError> {
        let mut pipe = redis::pipe();
        for rows in &c.output.targets {
            for op in ops_of(self.target(&rows.target)?, rows)? {
                let mut cmd = redis::cmd(&op.command.as_str().to_uppercase());
                cmd.arg(&op.key);
                for a in &op.arguments {
                    cmd.arg(a.as_slice());
                }
                if let Some(ttl) = op.ttl_s {
                    cmd.arg("EX").arg(ttl);
                }
                pipe.add_command(cmd).ignore();
            }
        }
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn)
            .await
            .map_err(|e| sink_err("writing a batch's commands", e))
    }
}

/// The script's reply as the loop acts on it.
pub(crate) fn outcome(reply: Vec<String>, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
    match reply.first().map(String::as_str) {
        Some("ok") => Ok(CommitOutcome::Committed),
        Some("fenced") => {
            let field = reply.get(1).cloned().unwrap_or_default();
            let expected = c
                .plan
                .ranges
                .iter()
                .find(|r| StateKeys::field(&r.topic, r.partition) == field)
                .map_or(-1, |r| r.from);
            Ok(CommitOutcome::Fenced {
                partition: field,
                expected,
                found: reply.get(2).and_then(|f| f.parse().ok()),
            })
        }
        Some("wrongtype") => Err(SinkError::Config(format!(
            "key {:?} holds a {}, but the batch writes it as a {}: nothing was written",
            reply.get(1).map_or("", String::as_str),
            reply.get(2).map_or("", String::as_str),
            reply.get(3).map_or("", String::as_str),
        ))),
        Some("notinteger") => Err(SinkError::Config(format!(
            "key {:?} field {:?} holds no integer, so it cannot be incremented: nothing was \
             written",
            reply.get(1).map_or("", String::as_str),
            reply.get(2).map_or("", String::as_str),
        ))),
        _ => Err(SinkError::Database {
            context: format!("the commit script answered {reply:?}"),
            cause: None,
        }),
    }
}

impl Sink for RedisSink {
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        let keys = StateKeys::new(&self.prefix, pipeline);
        if partitions.is_empty() {
            return Ok(HashMap::new());
        }
        let fields: Vec<String> = partitions
            .iter()
            .map(|tp| StateKeys::field(&tp.topic, tp.partition))
            .collect();
        let mut conn = self.conn.clone();
        let stored: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(&keys.checkpoints)
            .arg(&fields)
            .query_async(&mut conn)
            .await
            .map_err(|e| sink_err("reading checkpoints", e))?;
        Ok(partitions
            .iter()
            .zip(stored)
            .filter_map(|(tp, next)| next.map(|n| (tp.clone(), n)))
            .collect())
    }

    fn state_store(&self) -> Option<std::sync::Arc<dyn sluice_core::state::StateStore>> {
        Some(std::sync::Arc::new(RedisStateStore::new(
            self.conn.clone(),
            &self.prefix,
        )))
    }

    async fn commit(&self, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        outcome(self.commit_with(c, &[]).await?, c)
    }
}

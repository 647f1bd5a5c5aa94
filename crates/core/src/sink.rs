//! The sink contract: where a batch's outputs, dead letters, lineage and
//! offset move are committed as one unit. Holds the `Sink` trait the batch
//! loop consumes, what every backend shares (the commit request, dead
//! letters, the error kinds, the canonical digest of a batch's result) and
//! the sink kind a URL names.
//!
//! It must not hold a backend: backends live in their own crates (the SQL
//! ones in `sluice-sql`) and never import each other.

use crate::batch::{Plan, Records, TopicPartition};
use crate::error::{Cause, prefixed};
use crate::output::Output;
use std::collections::HashMap;

/// Where batches are committed; implemented by each sink backend.
#[allow(async_fn_in_trait)]
pub trait Sink {
    /// Stored next offsets of `partitions`; absent = never committed.
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError>;
    /// Commits one batch atomically with the offset compare-and-set.
    async fn commit(&self, commit: &Commit<'_>) -> Result<CommitOutcome, SinkError>;
    /// True if every batch must hold one partition only: a sink that fences
    /// owners per partition (the Kafka sink's transactional ids) commits a
    /// batch under one partition's fence.
    fn one_partition_per_batch(&self) -> bool {
        false
    }
    /// This instance no longer owns `partitions` (revoked, or lost with its
    /// session): a sink may let go of what it keeps for each of them (the
    /// Kafka sink: a producer per partition). A batch of one of them still
    /// to commit must then come back fenced, never fail fatally; a later
    /// `checkpoints` of one takes it up again.
    fn released(&self, _partitions: &[TopicPartition]) {}
    /// Where this sink keeps the keyed state it commits, for the
    /// pipeline's cache to read; `None` if it keeps none (a module's state
    /// calls then fail, saying so).
    fn state_store(&self) -> Option<std::sync::Arc<dyn crate::state::StateStore>> {
        None
    }
}

/// Why a sink operation failed. Callers act on the variant.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The database could not be reached or dropped the connection: retry
    /// with backoff, then re-read the checkpoint.
    #[error("sink unavailable{}", prefixed(.context))]
    Unavailable {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
    /// COMMIT was sent but its outcome is unknown: read the checkpoint back
    /// before doing anything else; never write the batch again blindly.
    #[error("commit outcome unknown{}", prefixed(.context))]
    CommitUnknown {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The configuration or the module's output does not fit the tables
    /// (missing column, wrong type, bad identifier): fatal, fix the config.
    #[error("sink configuration: {0}")]
    Config(String),
    /// A sink kind's own fields of the config do not read or break one of
    /// its rules (see `config::section`): fatal, fix the config.
    #[error(transparent)]
    Section(#[from] crate::config::ConfigError),
    /// The module's rows do not fit their target's declared columns:
    /// fatal, fix the module or the config.
    #[error(transparent)]
    Contract(#[from] crate::contract::ContractError),
    /// Any other database error: fatal.
    #[error("sink error{}", prefixed(.context))]
    Database {
        context: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl SinkError {
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SinkError::Unavailable { .. } | SinkError::CommitUnknown { .. }
        )
    }

    /// Unreachable while doing `what` (may be empty), because of `cause`.
    pub fn unavailable(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        SinkError::Unavailable {
            context: what.into(),
            cause: Some(cause.into()),
        }
    }

    /// COMMIT sent, its outcome unknown because of `cause`.
    pub fn commit_unknown(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        SinkError::CommitUnknown {
            context: what.into(),
            cause: Some(cause.into()),
        }
    }

    /// Connecting to `server` (a redacted URL) failed for `cause`: a server
    /// that could not be reached is an outage (retry), but one whose TLS
    /// certificate does not verify is refused for good (retrying cannot
    /// change it: fix the trusted roots or the URL).
    pub fn connecting(server: &str, cause: impl Into<Cause>) -> Self {
        let cause = cause.into();
        if is_certificate_refusal(cause.as_ref()) {
            return SinkError::database(
                format!(
                    "TLS to {server}: the server's certificate does not verify against the trusted roots"
                ),
                cause,
            );
        }
        SinkError::unavailable(format!("cannot connect to {server}"), cause)
    }

    /// The database refused `what` (may be empty), for `cause`.
    pub fn database(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        SinkError::Database {
            context: what.into(),
            cause: Some(cause.into()),
        }
    }
}

/// True if `error`, or an error it was caused by, is rustls refusing the
/// server's certificate (drivers wrap it in an `io::Error`, Redis's errors
/// that in an `Arc`).
pub fn is_certificate_refusal(error: &(dyn std::error::Error + 'static)) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next = Some(error);
    while let Some(mut e) = next {
        next = e.source();
        if let Some(shared) = e.downcast_ref::<Shared>() {
            e = shared.as_ref();
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            e = inner;
        }
        if let Some(rustls::Error::InvalidCertificate(_)) = e.downcast_ref::<rustls::Error>() {
            return true;
        }
    }
    false
}

/// Why a record became a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    /// The module rejected it.
    Rejected,
    /// It made the module trap (isolated by bisection).
    Trap,
    /// The module ran out of fuel on it alone.
    Fuel,
    /// The module passed its memory cap on it alone.
    Memory,
    /// The module hit the batch deadline on it alone, every try.
    Deadline,
    /// The module wrote a NaN or infinite float for it.
    NonFinite,
    /// Its output alone is over `limits.max_output_mib`.
    Output,
    /// Its output alone breaks the output contract: text that is not
    /// UTF-8, a column with more or fewer values than rows, a target or
    /// column the sink does not declare, a type that does not fit.
    Contract,
    /// The module found it late: behind its partition's watermark, for a
    /// window already closed.
    Late,
}

impl DeadLetterKind {
    /// Every kind, in the order they are documented.
    pub const ALL: [DeadLetterKind; 9] = [
        DeadLetterKind::Rejected,
        DeadLetterKind::Trap,
        DeadLetterKind::Fuel,
        DeadLetterKind::Memory,
        DeadLetterKind::Deadline,
        DeadLetterKind::NonFinite,
        DeadLetterKind::Output,
        DeadLetterKind::Contract,
        DeadLetterKind::Late,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::Rejected => "rejected",
            DeadLetterKind::Trap => "trap",
            DeadLetterKind::Fuel => "fuel",
            DeadLetterKind::Memory => "memory",
            DeadLetterKind::Deadline => "deadline",
            DeadLetterKind::NonFinite => "non-finite",
            DeadLetterKind::Output => "output",
            DeadLetterKind::Contract => "contract",
            DeadLetterKind::Late => "late",
        }
    }
}

/// A record that will be stored as a dead letter, by batch index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub index: usize,
    pub reason: String,
    pub kind: DeadLetterKind,
}

/// Everything one batch commits.
pub struct Commit<'a> {
    pub plan: &'a Plan,
    pub records: &'a Records,
    pub output: &'a Output,
    pub dead_letters: &'a [DeadLetter],
    pub output_digest: &'a str,
    /// The keyed state the batch's runs read as it started (what a replay
    /// of it needs); its writes are `output.state`.
    pub state_reads: &'a crate::state::StateMap,
}

/// Commits everything of `c` but its rows in `state`: offsets, lineage
/// (with the digest of the rows, which went elsewhere) and dead letters.
/// For sinks whose rows go where no commit reaches (a terminal, a
/// non-transactional producer) and whose checkpoints live in a state store.
pub async fn commit_all_but_rows<S: Sink>(
    state: &S,
    c: &Commit<'_>,
) -> Result<CommitOutcome, SinkError> {
    let no_rows = Output {
        targets: Vec::new(),
        rejections: c.output.rejections.clone(),
        late: c.output.late.clone(),
        state: c.output.state.clone(),
    };
    state
        .commit(&Commit {
            output: &no_rows,
            ..*c
        })
        .await
}

/// The result of a commit attempt that reached the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Outputs and offsets landed together.
    Committed,
    /// Another owner moved the offsets first: nothing was written.
    Fenced {
        partition: String,
        expected: i64,
        found: Option<i64>,
    },
}

/// The sink kinds: `sink.kind` in the config, or named by the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    Sqlite,
    Postgres,
    #[serde(alias = "mariadb")]
    Mysql,
    Redis,
    Stdout,
    Kafka,
}

impl SinkKind {
    /// The kind named by the URL's scheme.
    pub fn of_url(url: &str) -> Result<SinkKind, SinkError> {
        let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
        match scheme {
            "sqlite" => Ok(SinkKind::Sqlite),
            "postgres" | "postgresql" => Ok(SinkKind::Postgres),
            "mysql" | "mariadb" => Ok(SinkKind::Mysql),
            "redis" | "rediss" => Ok(SinkKind::Redis),
            "stdout" => Ok(SinkKind::Stdout),
            "kafka" => Ok(SinkKind::Kafka),
            _ => Err(SinkError::Config(format!(
                "unsupported sink URL `{}`: use sqlite://PATH, postgres://USER@HOST/DB, \
                 mysql://USER@HOST/DB, redis://HOST:PORT/DB, kafka://HOST:PORT or stdout://",
                redact_url(url)
            ))),
        }
    }

    /// The name `sink.kind` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkKind::Sqlite => "sqlite",
            SinkKind::Postgres => "postgres",
            SinkKind::Mysql => "mysql",
            SinkKind::Redis => "redis",
            SinkKind::Stdout => "stdout",
            SinkKind::Kafka => "kafka",
        }
    }

    /// True for the kinds that write tables (SQL).
    pub fn is_sql(self) -> bool {
        !matches!(self, SinkKind::Redis | SinkKind::Stdout | SinkKind::Kafka)
    }

    /// True for the kinds that can be a state store (checkpoints, lineage,
    /// modules): the SQL ones and Redis. Stdout keeps nothing; Kafka keeps
    /// its checkpoints (the group's offsets) and lineage (a topic) itself,
    /// its modules in `[state]`.
    pub fn keeps_state(self) -> bool {
        !matches!(self, SinkKind::Stdout | SinkKind::Kafka)
    }

    /// `source.max_records_per_batch` when the config leaves it unset:
    /// none, except on Redis, where a batch is one script and Redis serves
    /// no other client while it runs (how long a script of 10,000 rows
    /// takes: BENCHMARKS.md, "Redis sink").
    pub fn default_max_records_per_batch(self) -> Option<u32> {
        match self {
            SinkKind::Redis => Some(50_000),
            _ => None,
        }
    }
}

/// The URL with its password (if any) masked, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// The canonical digest of a batch's result: its rows and dead letters
/// (the reason only where the module wrote it).
pub fn digest(output: &Output, dead_letters: &[DeadLetter]) -> String {
    let dead: Vec<(usize, &str, Option<&str>)> = dead_letters
        .iter()
        .map(|d| {
            let by_module = matches!(d.kind, DeadLetterKind::Rejected | DeadLetterKind::Late);
            let reason = by_module.then_some(d.reason.as_str());
            (d.index, d.kind.as_str(), reason)
        })
        .collect();
    output.digest(&dead)
}

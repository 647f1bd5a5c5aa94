//! Reprocessing on purpose: `sluice reset` moves a pipeline's checkpoints
//! to an offset, a time, the log start or the log end, for all its
//! partitions or some.
//!
//! Owns turning the user's choice into one offset per partition (asking
//! Kafka) and what the user is told about the sink's rows. The move itself,
//! and what happens to lineage and running instances, is the sink's
//! (`sluice_sql::reset`, `sluice_redis::reset`). It must not touch target
//! tables or keys.

use crate::batch::TopicPartition;
use crate::config::{KindSection, PipelineConfig};
use crate::kafka_source::{LogPositions, ResetTo, SourceError};
use crate::sink::redis::section::RedisSection;
use crate::sink::sql::section::{SqlTargetFields, WriteMode};
use crate::sink::{SinkError, SinkKind};
pub use sluice_core::reset::{OnState, ResetDone};
use sluice_redis::section::RedisCommand;

/// Why a reset was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error("`--partitions` names {0}, which is not a partition of the pipeline's topics")]
    UnknownPartition(String),
    /// Only SQL and Redis sinks' checkpoints can be moved (yet).
    #[error("`reset` moves checkpoints of SQL and Redis sinks only; this pipeline's sink is {0}")]
    NotSupported(&'static str),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// Moves the checkpoints of `partitions` (all of the pipeline's if `None`)
/// to where `to` says; with `dry_run`, only reports.
pub async fn reset(
    config: &PipelineConfig,
    to: ResetTo,
    partitions: Option<Vec<TopicPartition>>,
    on_state: OnState,
    dry_run: bool,
) -> Result<ResetDone, ResetError> {
    let kind = config.sink.kind()?;
    if !kind.is_sql() && kind != SinkKind::Redis {
        return Err(ResetError::NotSupported(kind.as_str()));
    }
    let source = config.source.clone();
    let pipeline = config.pipeline.clone();
    let targets = tokio::task::spawn_blocking(move || {
        let positions = LogPositions::connect(&source, &pipeline)?;
        let all = positions.partitions(&source.topics)?;
        let chosen = match partitions {
            None => all,
            Some(chosen) => {
                if let Some(unknown) = chosen.iter().find(|tp| !all.contains(tp)) {
                    return Err(ResetError::UnknownPartition(unknown.to_string()));
                }
                chosen
            }
        };
        chosen
            .into_iter()
            .map(|tp| {
                let offset = positions.resolve(&tp, to)?;
                Ok((tp, offset))
            })
            .collect::<Result<Vec<_>, ResetError>>()
    })
    .await
    .expect("reset positions task")?;
    let store = config.sink.store();
    let (pipeline, store) = (&config.pipeline, &store);
    Ok(match kind {
        SinkKind::Redis => {
            sluice_redis::reset::reset(store, pipeline, &targets, on_state, dry_run).await?
        }
        _ => sluice_sql::reset::reset(store, pipeline, &targets, on_state, dry_run).await?,
    })
}

/// A target whose rows (or keys) a re-run does not simply overwrite.
#[derive(Debug, Clone)]
pub struct NeedsCare {
    /// The table, or the Redis target's name.
    pub target: String,
    /// What re-processed records do to it.
    pub again: Again,
}

/// What re-processed records do to a target that needs care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// Rows (or stream entries) come again.
    Appended,
    /// Counters and sums add again.
    Added,
}

/// Targets whose rows a re-run does not simply overwrite, unless the user
/// clears them: SQL append rows and Redis `xadd` entries come again, SQL
/// accumulate targets and Redis increments add again.
pub fn targets_needing_care(config: &PipelineConfig) -> Vec<NeedsCare> {
    let redis = config.sink.kind().ok() == Some(SinkKind::Redis);
    let mut care = Vec::new();
    for t in &config.sink.targets {
        let again = match redis {
            true => RedisSection::target(t).ok().and_then(|f| {
                f.redis.iter().find_map(|c| match c.command {
                    RedisCommand::Xadd => Some(Again::Appended),
                    RedisCommand::Incrby | RedisCommand::Hincrby | RedisCommand::Zincrby => {
                        Some(Again::Added)
                    }
                    _ => None,
                })
            }),
            false => SqlTargetFields::of(t).ok().and_then(|f| match f.mode {
                WriteMode::Append => Some(Again::Appended),
                WriteMode::Accumulate => Some(Again::Added),
                _ => None,
            }),
        };
        let target = match redis {
            true => t.name.clone(),
            false => SqlTargetFields::of(t).map_or(t.name.clone(), |f| f.table(t).to_string()),
        };
        if let Some(again) = again {
            care.push(NeedsCare { target, again });
        }
    }
    care
}

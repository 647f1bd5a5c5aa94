//! Reprocessing on purpose: `sluice reset` moves a pipeline's checkpoints
//! to an offset, a time, the log start or the log end, for all its
//! partitions or some.
//!
//! Owns turning the user's choice into one offset per partition (asking
//! Kafka) and what the user is told about the sink's rows. The move itself,
//! and what happens to lineage and running instances, is the sink's
//! (`sluice_sql::reset`, `sluice_redis::reset`, `sluice_kafka_sink::reset`;
//! stdout and at-least-once Kafka keep theirs in `[state]`, moved like a
//! SQL or Redis sink's). It must not touch targets.

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
    // Where the checkpoints are, before asking Kafka anything.
    let exactly_once_kafka = crate::backends::exactly_once_kafka(config)?;
    let store = crate::backends::state_sink(config)?;
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
    if exactly_once_kafka {
        return Ok(sluice_kafka_sink::reset::reset(config, &targets, on_state, dry_run).await?);
    }
    // SQL and Redis sinks keep their own checkpoints; stdout and
    // at-least-once Kafka keep them in `[state]`.
    let (pipeline, store) = (&config.pipeline, &store);
    Ok(match store.kind()? {
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
/// clears them: SQL append rows, Redis `xadd` entries and Kafka records
/// come again, SQL accumulate targets and Redis increments add again.
pub fn targets_needing_care(config: &PipelineConfig) -> Vec<NeedsCare> {
    let kind = config.sink.kind().ok();
    let redis = kind == Some(SinkKind::Redis);
    let mut care = Vec::new();
    for t in &config.sink.targets {
        let again = match redis {
            _ if kind == Some(SinkKind::Kafka) => Some(Again::Appended),
            _ if kind == Some(SinkKind::Stdout) => None,
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

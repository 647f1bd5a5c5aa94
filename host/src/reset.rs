//! Reprocessing on purpose: `sluice reset` moves a pipeline's checkpoints
//! to an offset, a time, the log start or the log end, for all its
//! partitions or some.
//!
//! Owns turning the user's choice into one offset per partition (asking
//! Kafka) and what the user is told about the sink's rows. The move itself,
//! and what happens to lineage and running instances, is the sink's
//! (`sluice_sql::reset`). It must not touch target tables.

use crate::batch::TopicPartition;
use crate::config::PipelineConfig;
use crate::kafka_source::{LogPositions, ResetTo, SourceError};
use crate::sink::SinkError;
use crate::sink::sql::reset::{self, OnState, ResetDone};
use crate::sink::sql::section::{SqlTargetFields, WriteMode};

/// Why a reset was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error("`--partitions` names {0}, which is not a partition of the pipeline's topics")]
    UnknownPartition(String),
    /// Only SQL sinks' checkpoints can be moved (yet).
    #[error("`reset` moves checkpoints of SQL sinks only; this pipeline's sink is {0}")]
    NotSql(&'static str),
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
    if !kind.is_sql() {
        return Err(ResetError::NotSql(kind.as_str()));
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
    Ok(reset::reset(&store, &config.pipeline, &targets, on_state, dry_run).await?)
}

/// Targets whose rows a re-run does not simply overwrite: append rows come
/// again and accumulate targets add again, unless the user clears them.
pub fn targets_needing_care(config: &PipelineConfig) -> Vec<(String, WriteMode)> {
    config
        .sink
        .targets
        .iter()
        .filter_map(|t| Some((t, SqlTargetFields::of(t).ok()?)))
        .filter(|(_, f)| matches!(f.mode, WriteMode::Append | WriteMode::Accumulate))
        .map(|(t, f)| (f.table(t).to_string(), f.mode))
        .collect()
}

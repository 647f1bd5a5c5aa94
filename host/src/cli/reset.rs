//! `sluice reset`: the checkpoints moved to an offset, a time, the log
//! start or the log end, and what that means for the targets said.
//!
//! It must not move anything itself: that is `sluice::reset`.

use anyhow::Context;
use std::path::PathBuf;

// The arguments of `sluice reset`.
#[derive(clap::Args)]
pub struct Reset {
    /// The pipeline's TOML config.
    config: PathBuf,
    #[command(flatten)]
    to: ResetArgs,
    /// Only these partitions, as TOPIC:PARTITION (repeatable); default:
    /// every partition of the pipeline's topics.
    #[arg(long = "partition")]
    partitions: Vec<String>,
    /// Show what would move, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Delete the moved partitions' keyed state with the move (the re-run
    /// starts from empty state). Without it, a partition that keeps state
    /// is not moved: its state would disagree with the new checkpoint.
    #[arg(long)]
    clear_state: bool,
}

/// Where `reset` moves the checkpoints (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct ResetArgs {
    /// This offset in every chosen partition.
    #[arg(long)]
    to_offset: Option<i64>,
    /// The first offset with a record time at or after this (ms since the
    /// epoch).
    #[arg(long)]
    to_time: Option<i64>,
    /// The oldest offset still in each log.
    #[arg(long)]
    to_earliest: bool,
    /// The log end (skip everything there is now).
    #[arg(long)]
    to_latest: bool,
}

impl ResetArgs {
    fn target(&self) -> sluice::kafka_source::ResetTo {
        use sluice::kafka_source::ResetTo;
        match (self.to_offset, self.to_time, self.to_earliest) {
            (Some(o), _, _) => ResetTo::Offset(o),
            (_, Some(t), _) => ResetTo::Time(t),
            (_, _, true) => ResetTo::Earliest,
            _ => ResetTo::Latest,
        }
    }
}

pub(crate) fn parse_partition(spec: &str) -> anyhow::Result<sluice::batch::TopicPartition> {
    let (topic, partition) = spec
        .rsplit_once(':')
        .with_context(|| format!("--partition {spec:?}: expected TOPIC:PARTITION"))?;
    Ok(sluice::batch::TopicPartition {
        topic: topic.to_string(),
        partition: partition
            .parse()
            .with_context(|| format!("--partition {spec:?}: expected TOPIC:PARTITION"))?,
    })
}

pub async fn reset(args: Reset) -> anyhow::Result<()> {
    let Reset {
        config,
        to,
        partitions,
        dry_run,
        clear_state,
    } = args;
    let on_state = match clear_state {
        true => sluice::reset::OnState::Clear,
        false => sluice::reset::OnState::Refuse,
    };
    let config = sluice::backends::load(&config)?;
    let chosen = match partitions.is_empty() {
        true => None,
        false => Some(
            partitions
                .iter()
                .map(|p| parse_partition(p))
                .collect::<anyhow::Result<_>>()?,
        ),
    };
    let done = sluice::reset::reset(&config, to.target(), chosen, on_state, dry_run).await?;
    let verb = if dry_run { "would move" } else { "moved" };
    for m in &done.moves {
        let from = m
            .from
            .map_or("(no checkpoint)".to_string(), |o| o.to_string());
        println!("{}: checkpoint {from} -> {}", m.partition, m.to);
    }
    println!(
        "{verb} {} batches and {} dead letters of the old run to pipeline `{}` (readable there)",
        done.batches_archived, done.dead_letters_archived, done.archived_as
    );
    if done.state_keys_cleared > 0 {
        let verb = if dry_run { "would delete" } else { "deleted" };
        println!(
            "{verb} {} keyed state keys of the moved partitions",
            done.state_keys_cleared
        );
    }
    for care in sluice::reset::targets_needing_care(&config) {
        println!(
            "note: target `{}`: re-processed records {} (clear it first if that is not wanted)",
            care.target,
            match care.again {
                sluice::reset::Again::Added => "add to it again",
                sluice::reset::Again::Appended => "are appended again",
            }
        );
    }
    if dry_run {
        println!("dry run: nothing changed");
    }
    Ok(())
}

//! `sluice verify` and `sluice shadow`: committed batches replayed and
//! compared with what was committed, or run with a candidate module.
//!
//! It must not replay anything itself: that is `sluice::replay`.

use super::progress::Progress;
use anyhow::Context;
use std::path::PathBuf;

// The arguments of `sluice verify`.
#[derive(clap::Args)]
pub struct Verify {
    /// The pipeline's TOML config.
    config: PathBuf,
    #[command(flatten)]
    select: Select,
}

// The arguments of `sluice shadow`.
#[derive(clap::Args)]
pub struct Shadow {
    /// The pipeline's TOML config.
    config: PathBuf,
    /// The candidate component (.wasm).
    module: PathBuf,
    /// Params for the candidate's init, JSON.
    #[arg(long, default_value = "{}")]
    params: String,
    /// How many of the newest committed batches to run.
    #[arg(long, default_value_t = 10)]
    last: usize,
}

/// Which committed batches `verify` replays (all by default).
#[derive(clap::Args)]
pub struct Select {
    /// Only this batch (repeatable).
    #[arg(long = "batch")]
    batches: Vec<String>,
    /// Only batches committed at or after this time (ms since the epoch).
    #[arg(long)]
    since_ms: Option<i64>,
    /// Only batches committed before this time (ms since the epoch).
    #[arg(long)]
    until_ms: Option<i64>,
    /// Only batches overlapping TOPIC:PARTITION:FROM..UNTIL.
    #[arg(long)]
    offsets: Option<String>,
}

impl Select {
    fn selection(self) -> anyhow::Result<sluice::replay::Selection> {
        let offsets = match self.offsets {
            None => None,
            Some(spec) => Some(parse_offsets(&spec).with_context(|| {
                format!("--offsets {spec:?}: expected TOPIC:PARTITION:FROM..UNTIL")
            })?),
        };
        Ok(sluice::replay::Selection {
            batch_ids: self.batches,
            since_ms: self.since_ms,
            until_ms: self.until_ms,
            offsets,
            last: None,
        })
    }
}

fn parse_offsets(spec: &str) -> anyhow::Result<(String, i32, i64, i64)> {
    let (rest, range) = spec.rsplit_once(':').context("no range")?;
    let (topic, partition) = rest.rsplit_once(':').context("no partition")?;
    let (from, until) = range.split_once("..").context("no FROM..UNTIL")?;
    Ok((
        topic.to_string(),
        partition.parse()?,
        from.parse()?,
        until.parse()?,
    ))
}

pub async fn verify(args: Verify) -> anyhow::Result<()> {
    let Verify { config, select } = args;
    let config = sluice::backends::load(&config)?;
    let mut replayer = sluice::replay::Replayer::open(&config).await?;
    let (batches, redrives) = replayer.select(&select.selection()?).await?;
    anyhow::ensure!(
        !batches.is_empty(),
        "no committed batch matches the selection"
    );
    let mut bar = Progress::new("verifying", batches.len(), "batches");
    let mut differ = Vec::new();
    let mut caveats = std::collections::BTreeMap::new();
    for batch in &batches {
        let verdict = replayer.verify(batch).await?;
        if let Some(caveat) = verdict.caveat.clone() {
            *caveats.entry(caveat).or_insert(0usize) += 1;
        }
        if !verdict.matches() {
            bar.println(&format!(
                "MISMATCH batch {} ({}): recorded output {}, replay gives {} (module {}, params {})",
                batch.batch_id,
                sluice::batch::describe(&batch.ranges),
                batch.output_digest,
                verdict.replayed_digest,
                batch.module_digest,
                batch.params_digest
            ));
            differ.push(batch.batch_id.clone());
        }
        bar.step(verdict.records);
    }
    bar.finish();
    if redrives > 0 {
        println!(
            "note: {redrives} redrive batch(es) not replayed: their records were dead letters, which they removed"
        );
    }
    for (caveat, count) in caveats {
        println!("note: {count} batch(es): {caveat}");
    }
    println!(
        "verified {} batches: {} match, {} differ",
        batches.len(),
        batches.len() - differ.len(),
        differ.len()
    );
    anyhow::ensure!(
        differ.is_empty(),
        "{} batch(es) do not reproduce their recorded output: {}",
        differ.len(),
        differ.join(", ")
    );
    Ok(())
}

pub async fn shadow(args: Shadow) -> anyhow::Result<()> {
    let Shadow {
        config,
        module,
        params,
        last,
    } = args;
    let config = sluice::backends::load(&config)?;
    let component = std::fs::read(&module)
        .with_context(|| format!("cannot read module {}", module.display()))?;
    let candidate = sluice::replay::ModuleVersion::new(component, params);
    let keys = sluice::backends::target_keys(&config)?;
    let mut replayer = sluice::replay::Replayer::open(&config).await?;
    let selection = sluice::replay::Selection {
        last: Some(last),
        ..Default::default()
    };
    let (batches, _redrives) = replayer.select(&selection).await?;
    anyhow::ensure!(
        !batches.is_empty(),
        "the pipeline has no committed batch yet"
    );
    let mut bar = Progress::new("shadowing", batches.len(), "batches");
    let mut totals: std::collections::BTreeMap<String, sluice::replay::TargetDiff> =
        Default::default();
    let (mut dead_recorded, mut dead_candidate) = (0, 0);
    for batch in &batches {
        let recorded = replayer.rerun_recorded(batch).await?;
        let candidate_output = replayer.rerun(batch, &candidate).await?;
        dead_recorded += recorded.dead_letters.len();
        dead_candidate += candidate_output.dead_letters.len();
        for d in sluice::replay::diff_outputs(&recorded.output, &candidate_output.output, &keys) {
            totals.entry(d.target.clone()).or_default().absorb(d);
        }
        bar.step(recorded.records.len());
    }
    bar.finish();
    println!(
        "shadow of {} over the last {} committed batches:",
        module.display(),
        batches.len()
    );
    for (target, d) in &totals {
        println!(
            "  {target}: {} added, {} removed, {} changed, {} unchanged",
            d.added, d.removed, d.changed, d.unchanged
        );
        for s in &d.samples {
            println!("    {s}");
        }
    }
    println!("  dead letters: {dead_recorded} committed, {dead_candidate} with the candidate");
    Ok(())
}

//! `sluice dead-letters list|show|redrive`: the CLI of `sluice::redrive`.
//!
//! Owns the arguments, the filters they make and how dead letters are
//! printed (a table, full records, or JSON lines; `show --sample` prints
//! the lines `sluice test --input` takes, to run a dead letter locally).
//! It must not read the sink or run a module itself.

use super::progress::Progress;
use anyhow::Context;
use sluice::batch::now_ms;
use sluice::sample::SampleLine;
use sluice_core::dead_letters::{DeadLetterFilter, RecordKey, StoredDeadLetter};
use sluice_core::sink::DeadLetterKind;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum DeadLetterCommand {
    /// List stored dead letters: record (TOPIC:PARTITION:OFFSET), batch,
    /// kind and reason, by partition and offset.
    List {
        /// The pipeline's TOML config.
        config: PathBuf,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print at most this many (0: all).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per dead letter instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show dead letters in full (key, value, record time, reason): one
    /// record, or those the filters keep.
    Show {
        /// The pipeline's TOML config.
        config: PathBuf,
        /// The record, as TOPIC:PARTITION:OFFSET (as `list` prints it).
        record: Option<String>,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print at most this many (0: all).
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print them as the JSON lines `sluice test --input` takes, to run
        /// them locally against a fixed module.
        #[arg(long)]
        sample: bool,
    },
    /// Run dead letters through the pipeline's active version and commit
    /// what they give now (rows, or dead letters again) together with
    /// their removal, one transaction per batch that stored them: exactly
    /// once, recorded in lineage. Deploy and activate the fixed module
    /// first.
    Redrive {
        /// The pipeline's TOML config.
        config: PathBuf,
        #[command(flatten)]
        which: RedriveWhich,
        /// Only dead letters of this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Only those whose batch committed at or after this: ms since the
        /// epoch, or an age like 30m, 12h, 7d.
        #[arg(long)]
        since: Option<String>,
    },
}

/// Which dead letters a redrive takes (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct RedriveWhich {
    /// Those of this batch.
    #[arg(long)]
    batch: Option<String>,
    /// All of them (that `--kind` and `--since` keep).
    #[arg(long)]
    all: bool,
}

/// Filters of `list` and `show`.
#[derive(clap::Args)]
pub struct FilterArgs {
    /// Only those of this batch.
    #[arg(long)]
    batch: Option<String>,
    /// Only this kind: rejected, trap, fuel, memory, deadline, non-finite,
    /// output, contract, late.
    #[arg(long)]
    kind: Option<String>,
    /// Only those whose batch committed at or after this: ms since the
    /// epoch, or an age like 30m, 12h, 7d.
    #[arg(long)]
    since: Option<String>,
}

impl FilterArgs {
    fn filter(self) -> anyhow::Result<DeadLetterFilter> {
        Ok(DeadLetterFilter {
            batch_id: self.batch,
            kind: self.kind.map(checked_kind).transpose()?,
            since_ms: self.since.as_deref().map(parse_since).transpose()?,
            record: None,
        })
    }
}

/// `kind` if it names a dead-letter kind.
fn checked_kind(kind: String) -> anyhow::Result<String> {
    let kinds = DeadLetterKind::ALL.map(DeadLetterKind::as_str);
    anyhow::ensure!(
        kinds.contains(&kind.as_str()),
        "--kind {kind:?}: expected one of {}",
        kinds.join(", ")
    );
    Ok(kind)
}

/// `--since`: ms since the epoch, or an age (`90s`, `30m`, `12h`, `7d`).
fn parse_since(spec: &str) -> anyhow::Result<i64> {
    let bad =
        || format!("--since {spec:?}: expected ms since the epoch or an age like 30m, 12h, 7d");
    if let Ok(ms) = spec.parse::<i64>() {
        return Ok(ms);
    }
    let split = spec.len().checked_sub(1).with_context(bad)?;
    let (number, unit) = spec.split_at(split);
    let number: i64 = number.parse().ok().with_context(bad)?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => anyhow::bail!(bad()),
    };
    Ok(now_ms() - number.saturating_mul(unit_ms))
}

pub async fn execute(command: DeadLetterCommand) -> anyhow::Result<()> {
    match command {
        DeadLetterCommand::List {
            config,
            filter,
            limit,
            json,
        } => {
            let config = sluice::backends::load(&config)?;
            let letters = sluice::redrive::list(&config, &filter.filter()?).await?;
            print_list(&letters, limit, json);
            Ok(())
        }
        DeadLetterCommand::Show {
            config,
            record,
            filter,
            limit,
            sample,
        } => {
            let config = sluice::backends::load(&config)?;
            let mut filter = filter.filter()?;
            filter.record = record
                .map(|r| r.parse::<RecordKey>().map_err(anyhow::Error::msg))
                .transpose()?;
            let letters = sluice::redrive::list(&config, &filter).await?;
            anyhow::ensure!(!letters.is_empty(), "no stored dead letter matches");
            for d in shown(&letters, limit) {
                match sample {
                    true => println!("{}", sample_line(d)),
                    false => print_full(d),
                }
            }
            Ok(())
        }
        DeadLetterCommand::Redrive {
            config,
            which,
            kind,
            since,
        } => {
            let config = sluice::backends::load(&config)?;
            let filter = FilterArgs {
                batch: which.batch,
                kind,
                since,
            }
            .filter()?;
            redrive(&config, &filter).await
        }
    }
}

async fn redrive(
    config: &sluice::config::PipelineConfig,
    filter: &DeadLetterFilter,
) -> anyhow::Result<()> {
    let mut progress: Option<Progress> = None;
    let done = sluice::redrive::redrive(config, filter, |batch, total| {
        let p = progress.get_or_insert_with(|| Progress::new("redriving", total, "dead letters"));
        p.advance(batch.records, batch.records);
        if !batch.committed {
            p.println(&format!(
                "skipped the dead letters of batch {}: another redrive or a reset took them",
                batch.from_batch
            ));
        }
    })
    .await
    .with_context(|| format!("pipeline `{}`", config.pipeline))?;
    if let Some(p) = progress {
        p.finish();
    }
    let Some(version) = done.version else {
        println!("no stored dead letter matches: nothing to redrive");
        return Ok(());
    };
    println!(
        "redrove {} dead letters in {} batches with version {} (module {}): {} rows written, \
         {} failed again (stored again as dead letters){}",
        done.records,
        done.batches,
        version.version,
        version.module_digest,
        done.rows_out,
        done.dead_again,
        match done.skipped {
            0 => String::new(),
            n => format!("; {n} batches skipped (taken by another redrive)"),
        }
    );
    Ok(())
}

fn shown(letters: &[StoredDeadLetter], limit: usize) -> &[StoredDeadLetter] {
    match limit {
        0 => letters,
        n => &letters[..n.min(letters.len())],
    }
}

fn print_list(letters: &[StoredDeadLetter], limit: usize, json: bool) {
    let shown = shown(letters, limit);
    if json {
        for d in shown {
            println!("{}", full_json(d));
        }
        return;
    }
    if !shown.is_empty() {
        println!("{:<28}  {:<32}  {:<10}  REASON", "RECORD", "BATCH", "KIND");
    }
    for d in shown {
        println!(
            "{:<28}  {:<32}  {:<10}  {}",
            d.key().to_string(),
            d.batch_id,
            d.kind,
            one_line(&d.reason, 100)
        );
    }
    match shown.len() == letters.len() {
        true => println!("{} dead letters", letters.len()),
        false => println!(
            "{} dead letters ({} shown; --limit 0 for all)",
            letters.len(),
            shown.len()
        ),
    }
}

fn print_full(d: &StoredDeadLetter) {
    println!("{}", d.key());
    println!("  batch      {}", d.batch_id);
    println!("  kind       {}", d.kind);
    println!("  reason     {}", d.reason);
    println!("  timestamp  {}", d.timestamp);
    if let Some(at) = d.committed_at_ms {
        println!("  committed  {at} (ms since the epoch)");
    }
    println!("  key        {}", shown_bytes(d.key.as_deref()));
    println!("  value      {}", shown_bytes(d.value.as_deref()));
}

/// Text in quotes if UTF-8, else hex; `null` if absent.
fn shown_bytes(bytes: Option<&[u8]>) -> String {
    match bytes {
        None => "null".into(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(text) => format!("{text:?}"),
            Err(_) => format!("hex {}", hex::encode(b)),
        },
    }
}

fn one_line(text: &str, max: usize) -> String {
    let line: String = text.replace(['\n', '\r'], " ");
    match line.chars().count() > max {
        true => format!("{}…", line.chars().take(max).collect::<String>()),
        false => line,
    }
}

/// The record as a `sluice test --input` (or `sluice produce`) line.
fn sample_line(d: &StoredDeadLetter) -> serde_json::Value {
    SampleLine {
        topic: Some(d.topic.clone()),
        partition: Some(d.partition),
        offset: Some(d.offset),
        timestamp: Some(d.timestamp),
        key: d.key.clone(),
        value: d.value.clone(),
        headers: Vec::new(),
    }
    .to_json()
}

fn full_json(d: &StoredDeadLetter) -> serde_json::Value {
    let mut line = sample_line(d);
    let o = line.as_object_mut().expect("an object");
    o.insert("batch_id".into(), d.batch_id.clone().into());
    o.insert("kind".into(), d.kind.clone().into());
    o.insert("reason".into(), d.reason.clone().into());
    o.insert("committed_at_ms".into(), d.committed_at_ms.into());
    if let Some(at) = d.stored_at {
        o.insert(
            "stored_at".into(),
            serde_json::json!({"partition": at.partition, "offset": at.offset}),
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_ms_or_an_age() {
        assert_eq!(parse_since("1700000000000").unwrap(), 1_700_000_000_000);
        let hour_ago = parse_since("1h").unwrap();
        assert!((now_ms() - 3_600_000 - hour_ago).abs() < 5_000);
        for bad in ["", "h", "1w", "x1h", "1.5h"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }
}

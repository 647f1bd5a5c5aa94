//! `sluice state get|scan`: a look at the keyed state a pipeline's sink
//! holds, one partition at a time (reads only: it opens the sink's state
//! store, never the pipeline, and writes nothing).
//!
//! It owns the arguments and what is printed; reading is the state
//! store's (`sluice::backends::state_store`), showing `sluice::state_view`'s.

use super::reset::parse_partition;
use anyhow::Context;
use sluice::state_view::StateLine;
use sluice_core::state::ScanPage;
use std::path::PathBuf;

/// Keys read per round trip when `--limit 0` asks for them all.
const SCAN_PAGE: usize = 10_000;

#[derive(clap::Subcommand)]
pub enum StateCommand {
    /// The value of one key of a partition's state (or that it is absent),
    /// and when it expires.
    Get {
        /// The pipeline's TOML config.
        config: PathBuf,
        /// The input partition the state belongs to, as TOPIC:PARTITION.
        #[arg(long)]
        partition: String,
        #[command(flatten)]
        key: KeyArgs,
        /// One JSON object instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// The keys of a partition's state in key order (expired keys too,
    /// with their expiry: they read as absent in batches at or past it),
    /// a page at a time: a full page ends with the `--after-hex` that
    /// shows the next.
    Scan {
        /// The pipeline's TOML config.
        config: PathBuf,
        /// The input partition the state belongs to, as TOPIC:PARTITION.
        #[arg(long)]
        partition: String,
        /// Only keys starting with these bytes (UTF-8).
        #[arg(long, default_value = "")]
        prefix: String,
        /// Only keys after this one (the last of the page before), as hex.
        #[arg(long)]
        after_hex: Option<String>,
        /// Keys per page (0: every key, page after page).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per key instead of lines.
        #[arg(long)]
        json: bool,
    },
}

/// The key, as text or as hex (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct KeyArgs {
    /// The key as UTF-8 text.
    #[arg(long)]
    key: Option<String>,
    /// The key as hex bytes.
    #[arg(long)]
    key_hex: Option<String>,
}

impl KeyArgs {
    fn bytes(&self) -> anyhow::Result<Vec<u8>> {
        match (&self.key, &self.key_hex) {
            (Some(text), _) => Ok(text.as_bytes().to_vec()),
            (_, Some(h)) => hex::decode(h).with_context(|| format!("--key-hex {h:?} is not hex")),
            _ => unreachable!("clap requires one of --key, --key-hex"),
        }
    }
}

fn print(line: &StateLine<'_>, json: bool, absent: &str) {
    match json {
        true => println!("{}", line.json()),
        false => println!("{}", line.line(absent)),
    }
}

pub async fn execute(command: StateCommand) -> anyhow::Result<()> {
    match command {
        StateCommand::Get {
            config,
            partition,
            key,
            json,
        } => {
            let (config, tp) = (
                sluice::backends::load(&config)?,
                parse_partition(&partition)?,
            );
            let key = key.bytes()?;
            let store = sluice::backends::state_store(&config).await?;
            let value = store.get(&config.pipeline, &tp, &key).await?;
            let line = StateLine::of(&tp, &key, value.as_ref());
            print(&line, json, "absent");
        }
        StateCommand::Scan {
            config,
            partition,
            prefix,
            after_hex,
            limit,
            json,
        } => {
            let (config, tp) = (
                sluice::backends::load(&config)?,
                parse_partition(&partition)?,
            );
            let after = after_hex
                .map(|h| hex::decode(&h).with_context(|| format!("--after-hex {h:?} is not hex")))
                .transpose()?;
            let store = sluice::backends::state_store(&config).await?;
            let mut page = ScanPage {
                prefix: prefix.into_bytes(),
                after,
                limit: if limit == 0 { SCAN_PAGE } else { limit },
            };
            loop {
                let keys = store.scan(&config.pipeline, &tp, &page).await?;
                for (key, value) in &keys {
                    print(&StateLine::of(&tp, key, Some(value)), json, "absent");
                }
                let Some((last, _)) = keys.last().filter(|_| keys.len() == page.limit) else {
                    break;
                };
                if limit != 0 {
                    let last = hex::encode(last);
                    eprintln!("a full page: `--after-hex {last}` shows the next");
                    break;
                }
                page.after = Some(last.clone());
            }
        }
    }
    Ok(())
}

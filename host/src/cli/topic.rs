//! `sluice produce` and `sluice consume`: a sample file into a topic, a
//! topic's committed records out as sample lines.
//!
//! It must not hold Kafka logic: that is `sluice::topic_io`.

use anyhow::Context;
use sluice::topic_io::{Brokers, Consume as Which};
use std::path::PathBuf;

/// Where the topic is: `--brokers`, or a pipeline config's `[source]`
/// (its brokers and librdkafka properties: TLS, SASL).
#[derive(clap::Args)]
pub struct Where {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    brokers: Option<String>,
    /// Take the brokers and client properties from this pipeline config.
    #[arg(long, value_name = "PIPELINE.toml")]
    config: Option<PathBuf>,
}

impl Where {
    fn brokers(self) -> anyhow::Result<Brokers> {
        match (self.brokers, self.config) {
            (Some(brokers), _) => Ok(Brokers {
                brokers,
                properties: Default::default(),
            }),
            (None, Some(path)) => {
                let config = sluice::backends::load(&path)?;
                Ok(Brokers {
                    brokers: config.source.brokers,
                    properties: config.source.properties,
                })
            }
            (None, None) => anyhow::bail!("give --brokers or --config"),
        }
    }
}

// The arguments of `sluice produce`.
#[derive(clap::Args)]
pub struct Produce {
    /// The topic (it must exist).
    topic: String,
    /// Sample records, one JSON object per line (the `sluice test --input`
    /// format); a line's `partition`, `timestamp`, key, value and headers
    /// are kept, its `topic` and `offset` are not used.
    file: PathBuf,
    /// Create the topic with this many partitions if it does not exist
    /// (replication 1, for a local broker).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=10_000))]
    partitions: Option<i32>,
    #[command(flatten)]
    to: Where,
}

// The arguments of `sluice consume`.
#[derive(clap::Args)]
pub struct Consume {
    /// The topic.
    topic: String,
    /// Only this partition.
    #[arg(long)]
    partition: Option<i32>,
    /// At most this many records.
    #[arg(long, value_name = "N")]
    max_records: Option<usize>,
    #[command(flatten)]
    from: Where,
}

pub async fn produce(args: Produce) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let brokers = args.to.brokers()?;
    if let Some(partitions) = args.partitions
        && sluice::topic_io::create_if_missing(&brokers, &args.topic, partitions).await?
    {
        println!("created {} with {partitions} partitions", args.topic);
    }
    let produced = sluice::topic_io::produce(&brokers, &args.topic, &text)
        .await
        .with_context(|| format!("{}", args.file.display()))?;
    let per: Vec<String> = produced
        .partitions
        .iter()
        .map(|(p, n)| format!("{p}: {n}"))
        .collect();
    println!(
        "produced {} records to {} (by partition: {})",
        produced.records(),
        args.topic,
        per.join(", ")
    );
    Ok(())
}

pub fn consume(args: Consume) -> anyhow::Result<()> {
    let brokers = args.from.brokers()?;
    let which = Which {
        partition: args.partition,
        max_records: args.max_records,
    };
    let lines =
        tokio::task::block_in_place(|| sluice::topic_io::consume(&brokers, &args.topic, &which))?;
    for line in lines {
        println!("{}", line.to_json());
    }
    Ok(())
}

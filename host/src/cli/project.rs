//! `sluice new`, `sluice build` and `sluice test`: a plugin project made,
//! built into a component, and run on sample records.
//!
//! It must not hold build or run logic: that is `sluice::plugin_build` and
//! `sluice::plugin_test`.

use anyhow::Context;
use std::num::NonZeroUsize;
use std::path::PathBuf;

// The arguments of `sluice new`.
#[derive(clap::Args)]
pub struct New {
    /// The guest language.
    #[arg(long)]
    lang: sluice::plugin_build::Language,
    /// The new project's directory; its last part is the plugin's name.
    name: PathBuf,
}

// The arguments of `sluice build`.
#[derive(clap::Args)]
pub struct Build {
    /// The project (holds sluice-plugin.toml).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Where to write the component.
    #[arg(long, short)]
    out: Option<PathBuf>,
}

// The arguments of `sluice test`.
#[derive(clap::Args)]
pub struct Test {
    /// The component (.wasm).
    module: PathBuf,
    /// Sample records, one JSON object per line: `value`, `key` (or
    /// `value_hex`, `key_hex`), optional `topic`, `partition`, `offset`,
    /// `timestamp`, `headers`.
    #[arg(long)]
    input: PathBuf,
    /// Params for the module's init, JSON.
    #[arg(long, default_value = "{}")]
    params: String,
    /// A pipeline config: rows are checked against its targets, and its
    /// limits, poison policy and name are used.
    #[arg(long, value_name = "PIPELINE.toml")]
    target_schema: Option<PathBuf>,
    /// The batch time the module sees as its clock (ms since the epoch).
    #[arg(long, default_value_t = 0)]
    batch_time_ms: i64,
    /// JSON lines (rows, dead letters, logs, a summary) instead of tables.
    #[arg(long)]
    json: bool,
    /// Run the sample as batches of at most N records per partition, each
    /// starting from the keyed state the ones before it left (default: one
    /// batch).
    #[arg(long, value_name = "N")]
    batch_size: Option<NonZeroUsize>,
    /// `limits.fuel_per_batch` for this run (over --target-schema's).
    #[arg(long, value_name = "FUEL")]
    fuel: Option<u64>,
    /// `limits.max_memory_mib` for this run (over --target-schema's).
    #[arg(long, value_name = "MIB")]
    max_memory_mib: Option<u64>,
    /// `limits.batch_timeout_ms` for this run (over --target-schema's).
    #[arg(long, value_name = "MS")]
    batch_timeout_ms: Option<u64>,
    /// The `--json` output of an earlier run: exit 1, saying what differs,
    /// unless this run gives the same rows, dead letters, state written and
    /// output digest.
    #[arg(long, value_name = "FILE")]
    expect: Option<PathBuf>,
}

pub fn new(args: New) -> anyhow::Result<()> {
    let New { lang, name } = args;
    sluice::plugin_build::new_project(&name, lang)?;
    println!(
        "made {} ({}); next: cd {} && sluice build && sluice test dist/{}.wasm --input sample.jsonl",
        name.display(),
        lang.name(),
        name.display(),
        name.file_name().unwrap_or_default().to_string_lossy()
    );
    Ok(())
}

pub fn build(args: Build) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let built = sluice::plugin_build::build(&args.dir, args.out.as_deref())?;
    let size = std::fs::metadata(&built).map(|m| m.len()).unwrap_or(0);
    println!(
        "built {} ({size} bytes) in {:.1} s",
        built.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn test(args: Test) -> anyhow::Result<()> {
    let Test {
        module,
        input,
        params,
        target_schema,
        batch_time_ms,
        json,
        batch_size,
        fuel,
        max_memory_mib,
        batch_timeout_ms,
        expect,
    } = args;
    // Read first: a missing file is said before the module runs.
    let expected = match &expect {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --expect {}", path.display()))?,
        ),
        None => None,
    };
    let sample = sluice::plugin_test::SampleRun {
        module,
        input,
        params,
        pipeline: target_schema,
        batch_time_ms,
        limits: sluice::plugin_test::LimitFlags {
            fuel_per_batch: fuel,
            max_memory_mib,
            batch_timeout_ms,
        },
        batch_size,
    };
    // Transforms block: run off the async workers.
    let report = tokio::task::block_in_place(|| sluice::plugin_test::run(&sample))?;
    match json {
        true => print!("{}", report.json_lines()),
        false => print!("{}", report.table()),
    }
    if !report.contract_errors.is_empty() {
        anyhow::bail!("rows break the pipeline's targets");
    }
    let (Some(path), Some(expected)) = (expect, expected) else {
        return Ok(());
    };
    let differences = report
        .differences(&expected)
        .map_err(|e| anyhow::anyhow!("--expect {}: {e}", path.display()))?;
    if !differences.is_empty() {
        anyhow::bail!(
            "the result differs from {} (- expected, + got):\n{}",
            path.display(),
            differences.join("\n")
        );
    }
    eprintln!("as expected: the result matches {}", path.display());
    Ok(())
}

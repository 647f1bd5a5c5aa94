//! `sluice new`, `sluice build` and `sluice test`: a plugin project made,
//! built into a component, and run on sample records.
//!
//! It must not hold build or run logic: that is `sluice::plugin_build` and
//! `sluice::plugin_test`.

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
    } = args;
    let sample = sluice::plugin_test::SampleRun {
        module,
        input,
        params,
        pipeline: target_schema,
        batch_time_ms,
    };
    // Transforms block: run off the async workers.
    let report = tokio::task::block_in_place(|| sluice::plugin_test::run(&sample))?;
    match json {
        true => print!("{}", report.json_lines()),
        false => print!("{}", report.table()),
    }
    match report.contract_errors.is_empty() {
        true => Ok(()),
        false => anyhow::bail!("rows break the pipeline's targets"),
    }
}

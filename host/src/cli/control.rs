//! The commands that talk to a running host's control API: `deploy`,
//! `versions`, `activate`, `rollback`, `status` and `logs`.
//!
//! It must not interpret versions: the host decides; this prints.

use super::stop_on_signal;
use anyhow::Context;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// Where the control API is and how to authenticate.
#[derive(clap::Args)]
pub struct Api {
    /// Base URL of a host's control API.
    #[arg(
        long,
        env = "SLUICE_CONTROL_URL",
        default_value = "http://127.0.0.1:7878"
    )]
    url: String,
    /// Bearer token for writes.
    #[arg(long, env = "SLUICE_CONTROL_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl Api {
    pub fn client(&self) -> sluice::control::ControlClient {
        sluice::control::ControlClient::new(&self.url, self.token.clone())
    }
}

// The arguments of `sluice deploy`.
#[derive(clap::Args)]
pub struct Deploy {
    #[command(flatten)]
    api: Api,
    /// The component (.wasm).
    module: PathBuf,
    /// Params for the module's init, JSON.
    #[arg(long, default_value = "{}")]
    params: String,
    /// Activate it: every instance switches at its next batch boundary.
    #[arg(long)]
    activate: bool,
}

// The arguments of `sluice versions`.
#[derive(clap::Args)]
pub struct Versions {
    #[command(flatten)]
    api: Api,
}

// The arguments of `sluice activate`.
#[derive(clap::Args)]
pub struct Activate {
    #[command(flatten)]
    api: Api,
    /// sha256 of a deployed module (as `deploy` or `versions` print it).
    module_digest: String,
    /// Params for the module's init, JSON.
    #[arg(long, default_value = "{}")]
    params: String,
}

// The arguments of `sluice rollback`.
#[derive(clap::Args)]
pub struct Rollback {
    #[command(flatten)]
    api: Api,
}

// The arguments of `sluice status`.
#[derive(clap::Args)]
pub struct Status {
    #[command(flatten)]
    api: Api,
}

// The arguments of `sluice logs`.
#[derive(clap::Args)]
pub struct Logs {
    #[command(flatten)]
    api: Api,
    /// Only this batch's lines.
    #[arg(long)]
    batch: Option<String>,
    /// Keep printing new lines as they come (until Ctrl-C).
    #[arg(long, short)]
    follow: bool,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn deploy(args: Deploy) -> anyhow::Result<()> {
    let Deploy {
        api,
        module,
        params,
        activate,
    } = args;
    let component = std::fs::read(&module)
        .with_context(|| format!("cannot read module {}", module.display()))?;
    let deployed = api.client().deploy(component, &params, activate).await?;
    println!(
        "stored module {} ({} bytes, validated in {} ms)",
        deployed.module_digest, deployed.size, deployed.validate_ms
    );
    if let Some(version) = &deployed.activated {
        print_version("activated", version);
    }
    Ok(())
}

pub async fn versions(args: Versions) -> anyhow::Result<()> {
    let answer = args.api.client().versions().await?;
    for v in &answer.versions {
        let active = if v.active { "  (active)" } else { "" };
        println!(
            "v{:<4} module {}  params {}{active}",
            v.version, v.module_digest, v.params
        );
    }
    Ok(())
}

pub async fn activate(args: Activate) -> anyhow::Result<()> {
    let version = args
        .api
        .client()
        .activate(&args.module_digest, &args.params)
        .await?;
    print_version("activated", &version);
    Ok(())
}

pub async fn rollback(args: Rollback) -> anyhow::Result<()> {
    let version = args.api.client().rollback().await?;
    print_version("rolled back: activated", &version);
    Ok(())
}

pub async fn status(args: Status) -> anyhow::Result<()> {
    let status = args.api.client().status().await?;
    println!("{}", serde_json::to_string_pretty(&status)?);
    Ok(())
}

pub async fn logs(args: Logs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let client = args.api.client();
    print_logs(
        &client,
        args.batch.as_deref(),
        args.follow,
        args.json,
        shutdown,
    )
    .await
}

/// `sluice logs`: pages through the host's kept lines; with `follow`,
/// asks again every half second for the lines after the last one printed.
async fn print_logs(
    client: &sluice::control::ControlClient,
    batch: Option<&str>,
    follow: bool,
    json: bool,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        let page = client.logs(after, batch).await?;
        if page.last_seq < after {
            // Numbers restart with the host: read the new one from its start.
            eprintln!("(the host restarted: its lines from the start follow)");
            after = 0;
            continue;
        }
        if page.missed > 0 {
            eprintln!(
                "({} older lines are gone from the host's buffer)",
                page.missed
            );
        }
        for line in &page.lines {
            if json {
                println!("{}", serde_json::to_string(line)?);
            } else {
                println!("{}  {:<5}  {}", line.batch_id, line.level, line.message);
            }
        }
        after = match page.lines.last() {
            Some(last) => last.seq,
            None => page.last_seq.max(after),
        };
        if page.lines.is_empty() && !follow {
            return Ok(());
        }
        if page.lines.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            }
        }
    }
}

fn print_version(what: &str, v: &sluice::store::Version) {
    println!(
        "{what} version {} of pipeline `{}`: module {} params {}",
        v.version, v.pipeline, v.module_digest, v.params
    );
}

//! The `sluice` commands, one file per family: each owns its arguments
//! (clap), what it prints and the parsing of its own specs; `main.rs` only
//! lists and dispatches them. They print and parse; they must not hold
//! pipeline logic (that is the `sluice` library's).

pub mod control;
pub mod dead_letters;
pub mod progress;
pub mod project;
pub mod replay;
pub mod reset;
pub mod run;
pub mod state;
pub mod topic;

use tokio_util::sync::CancellationToken;

/// Cancels `shutdown` on SIGINT or SIGTERM (the batch in flight is
/// finished first).
pub async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stop requested: finishing the batch in flight");
    shutdown.cancel();
}

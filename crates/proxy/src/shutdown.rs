//! Shutdown: SIGTERM or SIGINT cancels a token; the listener stops
//! accepting, connections stop reading new calls, and calls in flight get
//! the drain deadline to finish and send their replies.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Cancels `token` on the first SIGTERM or SIGINT.
pub fn cancel_on_signals(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = token.cancelled() => return,
        }
        token.cancel();
    });
    Ok(())
}

/// Waits up to `deadline` for every task in `tasks`; returns false if some
/// were still running when it passed.
pub async fn drain(tasks: &TaskTracker, deadline: Duration) -> bool {
    tasks.close();
    let drained = tokio::time::timeout(deadline, tasks.wait()).await.is_ok();
    if !drained {
        tracing::warn!(
            remaining = tasks.len(),
            "calls still in flight after {deadline:?}; exiting anyway"
        );
    }
    drained
}

//! Shutdown: SIGTERM or SIGINT cancels a token; the listener stops
//! accepting, connections stop reading new calls, and calls in flight get
//! the drain deadline to finish and send their replies. Then
//! [`write_back_and_close`] walks the stack: a last write-back job within
//! its deadline, each layer closed top first, the metadata index flushed.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::CacheSettings;
use crate::stack::Stack;
use crate::writeback::{JobKind, Jobs};

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

/// On exit, once the calls are drained: with a block cache (`cache`), and
/// unless configured not to, a write-back job within its deadline (what is
/// left stays dirty for the next start); then every layer is closed, top
/// first (the block cache syncs and marks its banks closed cleanly), and
/// the metadata index is flushed, so records written lazily (a fetched
/// file's) survive a clean stop.
pub async fn write_back_and_close(stack: &Stack, jobs: &Arc<Jobs>, cache: Option<&CacheSettings>) {
    if let Some(settings) = cache {
        let deadline = settings.exit_writeback_timeout;
        if settings.writeback_on_exit && jobs.backlog().is_dirty() {
            let _ = jobs.wait(deadline).await;
            let _ = jobs.start(JobKind::WriteBack);
            if !jobs.wait(deadline).await {
                tracing::warn!(
                    dirty_bytes = jobs.backlog().dirty_bytes,
                    "write-back on exit did not finish in {deadline:?}; the rest stays in the cache"
                );
            }
        }
    }
    close(stack).await;
}

/// Closes every layer and flushes the metadata index, with no write-back
/// (a paused mount's next proxy owns the cache and its dirty data).
pub async fn close(stack: &Stack) {
    for layer in stack.top_down() {
        if let Err(e) = layer.close() {
            tracing::error!(error = %e, "closing the {}", layer.name());
        }
    }
    if let Some(index) = stack.index.clone() {
        match tokio::task::spawn_blocking(move || index.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "flushing the metadata index"),
            Err(e) => tracing::error!(error = %e, "flushing the metadata index"),
        }
    }
}

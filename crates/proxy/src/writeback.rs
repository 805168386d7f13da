//! Write-back jobs: `gvfsctl writeback` / `flush`, SIGUSR1 / SIGUSR2, and
//! the write-back on exit, all run the block cache's write-back through one
//! [`Jobs`] so that at most one runs at a time and its progress can be shown.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gvfs_cache::CacheLayer;
use gvfs_nfs::layer::lock;
use serde_json::{Value, json};

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Write dirty data upstream, keep the cache.
    WriteBack,
    /// Write back, then drop cached data.
    Flush,
}

impl JobKind {
    fn name(self) -> &'static str {
        match self {
            Self::WriteBack => "writeback",
            Self::Flush => "flush",
        }
    }
}

/// The one write-back job that may run, and how the last one ended.
#[derive(Debug, Default)]
pub struct Jobs {
    running: AtomicBool,
    kind: Mutex<Option<JobKind>>,
    done: AtomicU64,
    total: AtomicU64,
    finished: AtomicU64,
    last: Mutex<Option<Value>>,
    /// Whose file cache is written back first (compress-and-copy files).
    meta: Mutex<Option<Arc<gvfs_meta::MetaLayer>>>,
    /// Emptied when a job ends: what it wrote changed attributes upstream.
    attrs: Mutex<Option<Arc<gvfs_attrcache::AttrCache>>>,
}

impl Jobs {
    /// Also writes back `meta`'s file cache (first) in every job.
    pub fn with_file_cache(&self, meta: Arc<gvfs_meta::MetaLayer>) {
        *lock(&self.meta) = Some(meta);
    }

    /// Empties `attrs` at the end of every job.
    pub fn with_attr_cache(&self, attrs: Arc<gvfs_attrcache::AttrCache>) {
        *lock(&self.attrs) = Some(attrs);
    }

    /// Starts a job unless one is running; says which is running either way.
    pub fn start(self: &Arc<Self>, cache: &Arc<CacheLayer>, kind: JobKind) -> Value {
        if self.running.swap(true, Ordering::AcqRel) {
            return json!({"started": false, "job": self.state()});
        }
        *lock(&self.kind) = Some(kind);
        self.done.store(0, Ordering::Relaxed);
        self.total.store(cache.dirty_bytes(), Ordering::Relaxed);
        // Taken before the job can finish, so `finished` counts the jobs
        // before this one: a waiter waits until it grows.
        let before = self.state();
        let (jobs, cache) = (self.clone(), cache.clone());
        let meta = lock(&self.meta).clone();
        let attrs = lock(&self.attrs).clone();
        tokio::spawn(async move {
            tracing::info!(job = kind.name(), "write-back started");
            let progress = |done: u64, total: u64| {
                jobs.done.store(done, Ordering::Relaxed);
                jobs.total.store(total, Ordering::Relaxed);
            };
            let files = match &meta {
                Some(m) => m.write_back().await,
                None => Ok(0),
            };
            // Files written back whole are let go by the metadata layer:
            // their attributes from before the writes must not be answered
            // while the block cache writes back (and again after it).
            if let Some(a) = &attrs {
                a.invalidate();
            }
            // A file held whole that could not be written back (a
            // conflict at the origin, say) keeps its writes; the block
            // cache's dirty data still goes, and the job reports the
            // failure.
            let blocks = match kind {
                JobKind::WriteBack => cache.write_back(&progress).await,
                JobKind::Flush => cache.flush().await,
            };
            let result = match (files, blocks) {
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                (Ok(_), Ok(r)) => Ok((r, files_bytes(&meta))),
            };
            let outcome = match result {
                Ok((report, files)) => {
                    tracing::info!(
                        job = kind.name(),
                        ?report,
                        file_cache_bytes = files,
                        "write-back finished"
                    );
                    json!({"job": kind.name(), "ok": true, "report": report, "file_cache_bytes": files})
                }
                Err(e) => {
                    tracing::error!(job = kind.name(), error = %e, "write-back failed; dirty data stays in the cache");
                    json!({"job": kind.name(), "ok": false, "error": e.to_string()})
                }
            };
            if let Some(a) = &attrs {
                a.invalidate();
            }
            *lock(&jobs.last) = Some(outcome);
            jobs.finished.fetch_add(1, Ordering::AcqRel);
            jobs.running.store(false, Ordering::Release);
        });
        json!({"started": true, "job": before})
    }

    /// The job's state for `gvfsctl`: running, progress, the last outcome.
    pub fn state(&self) -> JobState {
        JobState {
            running: self.running.load(Ordering::Acquire),
            kind: lock(&self.kind).map(|k| k.name().to_string()),
            done_bytes: self.done.load(Ordering::Relaxed),
            total_bytes: self.total.load(Ordering::Relaxed),
            finished: self.finished.load(Ordering::Acquire),
            last: lock(&self.last).clone(),
        }
    }

    /// Waits for a running job to end, at most `deadline`.
    pub async fn wait(&self, deadline: Duration) -> bool {
        let wait = async {
            while self.running.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(deadline, wait).await.is_ok()
    }
}

/// File bytes the file cache has written back so far.
fn files_bytes(meta: &Option<Arc<gvfs_meta::MetaLayer>>) -> u64 {
    meta.as_ref().map_or(0, |m| m.written_back_bytes())
}

/// The write-back job, as `gvfsctl stats` shows it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct JobState {
    /// A job is running.
    pub running: bool,
    /// Its kind (`writeback` or `flush`), or the last one's.
    pub kind: Option<String>,
    /// Bytes written back so far.
    pub done_bytes: u64,
    /// Bytes it has to write back.
    pub total_bytes: u64,
    /// Jobs finished since start.
    pub finished: u64,
    /// How the last job ended.
    pub last: Option<Value>,
}

/// Starts a write-back on SIGUSR1 and a flush on SIGUSR2, for as long as
/// the runtime lives.
pub fn on_signals(jobs: Arc<Jobs>, cache: Arc<CacheLayer>) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    tokio::spawn(async move {
        loop {
            let kind = tokio::select! {
                Some(()) = usr1.recv() => JobKind::WriteBack,
                Some(()) = usr2.recv() => JobKind::Flush,
                else => return,
            };
            tracing::info!(job = kind.name(), "signal: starting");
            let _ = jobs.start(&cache, kind);
        }
    });
    Ok(())
}

//! Write-back jobs: `gvfsctl writeback` / `flush`, SIGUSR1 / SIGUSR2, and
//! the write-back on exit, all run through one [`Jobs`] so that at most one
//! runs at a time and its progress can be shown.
//!
//! A job walks the stack's layers top first ([`Stack::top_down`]) through
//! their [`Lifecycle`]: each layer that holds writes writes them back (the
//! metadata layer its files held whole, then the block cache its dirty
//! blocks), and after each, every layer forgets answers kept from before
//! (the attribute cache): what was written changed files below without a
//! call through them. A layer that fails does not stop the ones below; the
//! job reports the first failure.
//!
//! [`Stack::top_down`]: crate::stack::Stack::top_down

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gvfs_nfs::layer::{Backlog, Lifecycle, WriteBackReport, lock};
use serde_json::{Value, json};

/// What a job does.
pub use gvfs_nfs::layer::WriteBackKind as JobKind;

/// The job's name, as `gvfsctl` shows it.
fn job_name(kind: JobKind) -> &'static str {
    match kind {
        JobKind::WriteBack => "writeback",
        JobKind::Flush => "flush",
    }
}

/// The one write-back job that may run, and how the last one ended.
pub struct Jobs {
    running: AtomicBool,
    kind: Mutex<Option<JobKind>>,
    done: AtomicU64,
    total: AtomicU64,
    finished: AtomicU64,
    last: Mutex<Option<Value>>,
    /// The stack's layers, top first.
    layers: Vec<Arc<dyn Lifecycle>>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("state", &self.state())
            .field(
                "layers",
                &self.layers.iter().map(|l| l.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Jobs {
    /// Jobs over `layers`, top first.
    pub fn new(layers: Vec<Arc<dyn Lifecycle>>) -> Self {
        Self {
            running: AtomicBool::new(false),
            kind: Mutex::new(None),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            last: Mutex::new(None),
            layers,
        }
    }

    /// What the layers hold for the layers below, and have sent them.
    pub fn backlog(&self) -> Backlog {
        backlog(&self.layers)
    }

    /// Starts a job unless one is running; says which is running either way.
    pub fn start(self: &Arc<Self>, kind: JobKind) -> Value {
        if self.running.swap(true, Ordering::AcqRel) {
            return json!({"started": false, "job": self.state()});
        }
        *lock(&self.kind) = Some(kind);
        self.done.store(0, Ordering::Relaxed);
        self.total
            .store(self.backlog().dirty_bytes, Ordering::Relaxed);
        // Taken before the job can finish, so `finished` counts the jobs
        // before this one: a waiter waits until it grows.
        let before = self.state();
        let jobs = self.clone();
        tokio::spawn(async move {
            tracing::info!(job = job_name(kind), "write-back started");
            let progress = |done: u64, total: u64| {
                jobs.done.store(done, Ordering::Relaxed);
                jobs.total.store(total, Ordering::Relaxed);
            };
            let result = walk(&jobs.layers, kind, &progress)
                .await
                .map(|report| (report, backlog(&jobs.layers).file_bytes_written_back));
            let outcome = match result {
                Ok((report, files)) => {
                    tracing::info!(
                        job = job_name(kind),
                        ?report,
                        file_cache_bytes = files,
                        "write-back finished"
                    );
                    json!({"job": job_name(kind), "ok": true, "report": report, "file_cache_bytes": files})
                }
                Err(e) => {
                    tracing::error!(job = job_name(kind), error = %e, "write-back failed; dirty data stays in the cache");
                    json!({"job": job_name(kind), "ok": false, "error": e.to_string()})
                }
            };
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
            kind: lock(&self.kind).map(|k| job_name(k).to_string()),
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

/// The sum of the backlogs of `layers`.
fn backlog(layers: &[Arc<dyn Lifecycle>]) -> Backlog {
    let mut sum = Backlog::default();
    for l in layers {
        sum += l.backlog();
    }
    sum
}

/// One job's walk over `layers` (top first): each layer that holds writes
/// writes them back, then every layer invalidates. A failure does not stop
/// the layers below; the first is returned, else the reports summed.
async fn walk(
    layers: &[Arc<dyn Lifecycle>],
    kind: JobKind,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
) -> Result<WriteBackReport, gvfs_nfs::ServiceError> {
    let mut report = WriteBackReport::default();
    let mut failed = None;
    for layer in layers {
        let Some(job) = layer.write_back(kind, progress) else {
            continue;
        };
        match job.await {
            Ok(r) => report += r,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        // Files written back whole are let go by the metadata layer: their
        // attributes from before the writes must not be answered while the
        // layers below write back (and again after them).
        for l in layers {
            l.invalidate();
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(report),
    }
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
pub fn on_signals(jobs: Arc<Jobs>) -> std::io::Result<()> {
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
            tracing::info!(job = job_name(kind), "signal: starting");
            let _ = jobs.start(kind);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gvfs_nfs::{BoxFuture, ServiceError};

    type Log = Arc<Mutex<Vec<String>>>;

    /// A layer that notes what it is asked; `writes` says whether it holds
    /// writes, `fails` whether its write-back fails.
    struct Noted {
        name: &'static str,
        log: Log,
        writes: bool,
        fails: bool,
    }

    impl Lifecycle for Noted {
        fn name(&self) -> &'static str {
            self.name
        }

        fn write_back<'a>(
            &'a self,
            kind: JobKind,
            _progress: gvfs_nfs::layer::Progress<'a>,
        ) -> Option<BoxFuture<'a, Result<WriteBackReport, ServiceError>>> {
            if !self.writes {
                return None;
            }
            Some(Box::pin(async move {
                lock(&self.log).push(format!("{} {}", self.name, job_name(kind)));
                if self.fails {
                    return Err(ServiceError::UpstreamProtocol {
                        upstream: self.name.into(),
                        reason: "refused".into(),
                    });
                }
                Ok(WriteBackReport {
                    blocks: 1,
                    ..WriteBackReport::default()
                })
            }))
        }

        fn invalidate(&self) {
            lock(&self.log).push(format!("{} invalidate", self.name));
        }

        fn backlog(&self) -> Backlog {
            Backlog {
                dirty_bytes: u64::from(self.writes),
                ..Backlog::default()
            }
        }
    }

    /// The metadata layer, attribute cache and block cache as [`Noted`]
    /// layers, top first.
    fn stack(log: &Log, meta_fails: bool) -> Vec<Arc<dyn Lifecycle>> {
        let layer = |name, writes, fails| {
            Arc::new(Noted {
                name,
                log: log.clone(),
                writes,
                fails,
            }) as Arc<dyn Lifecycle>
        };
        vec![
            layer("meta", true, meta_fails),
            layer("attrs", false, false),
            layer("cache", true, false),
        ]
    }

    #[tokio::test]
    async fn a_job_writes_back_top_first_and_invalidates_after_each() {
        let log = Log::default();
        let jobs = Arc::new(Jobs::new(stack(&log, false)));
        assert_eq!(jobs.backlog().dirty_bytes, 2);
        let started = jobs.start(JobKind::Flush);
        assert_eq!(started["started"], true);
        assert!(jobs.wait(Duration::from_secs(10)).await);
        let inv = ["meta invalidate", "attrs invalidate", "cache invalidate"];
        let mut expect = vec!["meta flush"];
        expect.extend(inv);
        expect.push("cache flush");
        expect.extend(inv);
        assert_eq!(*lock(&log), expect);
        let last = jobs.state().last.unwrap();
        assert_eq!(last["ok"], true);
        assert_eq!(last["report"]["blocks"], 2);
        assert_eq!(last["job"], "flush");
    }

    #[tokio::test]
    async fn a_failed_layer_does_not_stop_the_ones_below() {
        let log = Log::default();
        let jobs = Arc::new(Jobs::new(stack(&log, true)));
        jobs.start(JobKind::WriteBack);
        assert!(jobs.wait(Duration::from_secs(10)).await);
        assert!(lock(&log).contains(&"cache writeback".to_string()));
        let last = jobs.state().last.unwrap();
        assert_eq!(last["ok"], false);
        assert!(last["error"].as_str().unwrap().contains("refused"));
    }
}

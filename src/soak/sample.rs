//! The soak's sampler: every interval, CPU time and RSS of each process it
//! watches (`/proc/PID/stat`, `/proc/PID/status`), the operations done so
//! far, the machine's busy CPU time and load average, so a report can show
//! resources over time and how much of the machine others used.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bench::{ProcUsage, children_cpu_secs, machine_busy_secs, proc_usage};

/// One look at everything the sampler watches.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the sampler started.
    pub secs: f64,
    /// Operations of all clients so far.
    pub ops: u64,
    /// Each watched process, in the order given (default when it could not
    /// be read).
    pub procs: Vec<ProcUsage>,
    /// Busy CPU seconds of the whole machine so far.
    pub machine_busy: f64,
    /// CPU seconds of this process and its reaped children (the libnfs
    /// tools) so far.
    pub harness_cpu: f64,
    /// The 1-minute load average.
    pub load1: f64,
}

/// A thread taking [`Sample`]s until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<Vec<Sample>>>,
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn take(start: Instant, pids: &[u32], ops: &AtomicU64) -> Sample {
    let own = proc_usage(std::process::id())
        .map(|u| u.cpu_secs)
        .unwrap_or(f64::NAN);
    Sample {
        secs: start.elapsed().as_secs_f64(),
        ops: ops.load(Ordering::Relaxed),
        procs: pids
            .iter()
            .map(|&p| proc_usage(p).unwrap_or_default())
            .collect(),
        machine_busy: machine_busy_secs().map(|(b, _)| b).unwrap_or(f64::NAN),
        harness_cpu: own + children_cpu_secs(),
        load1: load1(),
    }
}

impl Sampler {
    /// Starts sampling `pids` every `every`; `ops` is the clients' shared
    /// operation counter.
    pub fn start(pids: Vec<u32>, every: Duration, ops: Arc<AtomicU64>) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("soak-sampler".into())
            .spawn(move || {
                let start = Instant::now();
                let mut samples = vec![take(start, &pids, &ops)];
                let mut next = start + every;
                while !flag.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now >= next {
                        samples.push(take(start, &pids, &ops));
                        next += every;
                    }
                    thread::sleep(
                        (next.saturating_duration_since(now)).min(Duration::from_millis(100)),
                    );
                }
                samples.push(take(start, &pids, &ops));
                samples
            })?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops it (after a last sample) and returns every sample.
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

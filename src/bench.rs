//! Small helpers the benchmarks share.

use anyhow::{Context, Result};

/// The first three fields of /proc/loadavg: other load on the machine
/// skews the figures, so the benchmarks report it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// A temporary directory in `/dev/shm` (tmpfs) when there is one, so local
/// copies made by a benchmark do not time the local disk.
pub fn shm_tempdir() -> Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    let b = {
        let mut b = tempfile::Builder::new();
        b.prefix("gvfs-bench-");
        b
    };
    Ok(if shm.is_dir() {
        b.tempdir_in(shm)?
    } else {
        b.tempdir()?
    })
}

/// A number from the environment variable `key`, or `default` when unset.
pub fn env_u64(key: &str, default: u64) -> Result<u64> {
    match std::env::var(key) {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("{key}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// What `/proc` says about one process so far (proc(5)), all threads
/// included.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcUsage {
    /// CPU seconds, user + system (`stat` fields 14 and 15).
    pub cpu_secs: f64,
    /// Minor page faults (`stat` field 10).
    pub minor_faults: u64,
    /// Resident set size in bytes (`status` VmRSS).
    pub rss_bytes: u64,
}

/// The usage of process `pid` so far, from `/proc/PID/stat` and
/// `/proc/PID/status`.
pub fn proc_usage(pid: u32) -> Result<ProcUsage> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) may contain spaces; it ends at the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("odd {path}"))?;
    // `rest` starts at field 3 (state).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("no field {n} in {path}"))
    };
    let status_path = format!("/proc/{pid}/status");
    let status =
        std::fs::read_to_string(&status_path).with_context(|| format!("reading {status_path}"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .with_context(|| format!("no VmRSS in {status_path}"))?;
    Ok(ProcUsage {
        cpu_secs: (field(14)? + field(15)?) as f64 / clock_ticks(),
        minor_faults: field(10)?,
        rss_bytes: rss_kib * 1024,
    })
}

/// The machine's CPU time so far, from `/proc/stat`'s first line: seconds
/// busy (every state but idle and iowait) and in all, summed over cores.
pub fn machine_cpu() -> Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("no cpu line in /proc/stat")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().context("odd /proc/stat"))
        .collect::<Result<_>>()?;
    // user nice system idle iowait irq softirq steal (guest times are in
    // user and nice already).
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    let hz = clock_ticks();
    Ok(((all - idle) as f64 / hz, all as f64 / hz))
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of CPU times
/// in `/proc`.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU seconds the whole machine has spent busy (all CPUs; every state of
/// the `cpu` line of `/proc/stat` but idle and iowait) and the number of
/// CPUs: compared with the processes a benchmark owns, it tells how much
/// others used the machine meanwhile.
pub fn machine_busy_secs() -> Result<(f64, usize)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let mut cpus = 0;
    let mut busy = None;
    for line in stat.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("cpu") => {
                let v: Vec<u64> = words.filter_map(|w| w.parse().ok()).collect();
                // user nice system idle iowait irq softirq steal (guest* are
                // already counted in user and nice)
                let sum: u64 = v.iter().take(8).sum();
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                busy = Some((sum - idle) as f64 / clock_ticks());
            }
            Some(w) if w.starts_with("cpu") => cpus += 1,
            _ => {}
        }
    }
    Ok((busy.context("no cpu line in /proc/stat")?, cpus.max(1)))
}

/// CPU seconds used by reaped children of this process so far
/// (getrusage `RUSAGE_CHILDREN`).
pub fn children_cpu_secs() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

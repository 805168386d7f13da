//! Lazy storms: many nodes behind one LAN proxy resume the same learned
//! image at once.
//!
//! QEMU cannot run 64 guests on one machine, so a storm replays what one
//! guest did ([`trace`](super::trace)): lazy WAN-S1's first clone, recorded
//! by its node's FUSE mount. Once the image server holds the working-set
//! profile lazy WAN-S1's node learned, a storm of N starts a fresh WAN
//! link, a fresh LAN proxy and N fresh nodes, each with its own
//! certificate (`node1`..), mapped to its own identity at the LAN proxy
//! and the image server, a FUSE mount at `--mount-readahead 0`, 32 MiB of
//! buffer memory and a 512 MiB cache. N processes ([`replay`]) map `mem`
//! on their node's mount and replay the trace at once.
//!
//! **Records**: one per replay, as a clone: time to running and to answer
//! are the replay's marks plus the recorded clone's time before resume
//! (copies, overlay, loading the device state: not replayed); WAN bytes at
//! each mark are the shared link's. **Notes**: the LAN proxy's counters,
//! its CPU seconds per clone, and the WAN MiB to the last answer.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::bench::{Bench, Node, wire};
use super::guest::MEM;
use super::images::image_dir;
use super::replay::{ChildLine, MEM_ENV, Passed, TRACE_ENV, read_child};
use super::report::{CloneRecord, NodeFetch};
use super::scenario::{Dedup, MIB, Scenario};
use super::trace::Trace;
use crate::bench::{machine_cpu, proc_usage};
use crate::site::node_name;

/// How long the replay children may take to map `mem` and say so.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What one replay reported, and the shared link's bytes then.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    running: Option<(f64, u64)>,
    answered: Option<(f64, u64)>,
    done: bool,
}

/// Child processes killed when dropped (a failed storm leaves none).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Bench<'_> {
    /// Runs storm `scenario` on `trace` (saved at `trace_path`); returns its
    /// records, notes, and the wire bytes its LAN proxy fetched as profile
    /// and demand (the working set crossing the WAN).
    pub(super) fn run_storm(
        &self,
        scenario: Scenario,
        trace: &Trace,
        trace_path: &Path,
    ) -> Result<(Vec<CloneRecord>, Vec<String>, u64)> {
        let n = scenario
            .storm_size()
            .with_context(|| format!("{} is not a storm", scenario.label()))?;
        let names: Vec<String> = (0..n).map(node_name).collect();
        let wan = self.wan()?;
        let (lan, lan_url) = self.lan_tls(&wan, &names)?;
        let nodes = names
            .iter()
            .map(|name| {
                let cert = (name.as_str(), "512M");
                self.node_as(None, lan_url.clone(), true, Dedup::Off, cert, |a| {
                    a.buffer_memory("32M")
                })
            })
            .collect::<Result<Vec<Node>>>()?;
        let lan_pid = lan.proxy.pid().context("the LAN proxy's pid")?;
        let node_pids = nodes
            .iter()
            .map(|n| n.proxy.pid().context("a node proxy's pid"))
            .collect::<Result<Vec<u32>>>()?;
        let nodes_cpu = |pids: &[u32]| -> Result<f64> {
            pids.iter().map(|&p| Ok(proc_usage(p)?.cpu_secs)).sum()
        };
        let cpu_before = proc_usage(lan_pid)?.cpu_secs;
        let nodes_cpu_before = nodes_cpu(&node_pids)?;
        let machine_before = machine_cpu()?;
        let lan_before = lan.proxy.stats()?;
        let fetch_before = nodes
            .iter()
            .map(|node| Ok(NodeFetch::from_stats(&node.proxy.stats()?)))
            .collect::<Result<Vec<_>>>()?;
        let wan_before = wire(&wan);

        let mut children = Children(Vec::new());
        for node in &nodes {
            let mem = node
                .mount_path()
                .context("a storm node has a mount")?
                .join(image_dir(1))
                .join(MEM);
            let child = Command::new(std::env::current_exe()?)
                .args(&self.settings.replay_args)
                .env(TRACE_ENV, trace_path)
                .env(MEM_ENV, &mem)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting a replay child")?;
            children.0.push(child);
        }
        let marks: Vec<Mutex<Marks>> = (0..n).map(|_| Mutex::new(Marks::default())).collect();
        let (ready_tx, ready_rx) = mpsc::channel();
        let timeout = self.settings.clone_timeout;
        std::thread::scope(|scope| -> Result<()> {
            for (i, child) in children.0.iter_mut().enumerate() {
                let out = child.stdout.take().context("a replay child's stdout")?;
                let (marks, wan, ready) = (&marks[i], &wan, ready_tx.clone());
                scope.spawn(move || {
                    read_child(out, |line| {
                        let bytes = wire(wan).saturating_sub(wan_before);
                        let mut m = lock(marks);
                        match line {
                            ChildLine::Ready => {
                                let _ = ready.send(());
                            }
                            ChildLine::Passed(Passed::Running, at) => m.running = Some((at, bytes)),
                            ChildLine::Passed(Passed::Answered, at) => {
                                m.answered = Some((at, bytes));
                            }
                            ChildLine::Done => m.done = true,
                        }
                    });
                });
            }
            drop(ready_tx);
            let ran = go_and_wait(&mut children.0, &ready_rx, timeout);
            if ran.is_err() {
                // The readers end when the children's output does.
                for c in &mut children.0 {
                    let _ = c.kill();
                }
            }
            ran
        })?;
        let wan_all = wire(&wan).saturating_sub(wan_before);
        let cpu = proc_usage(lan_pid)?.cpu_secs - cpu_before;
        let cpu_nodes = nodes_cpu(&node_pids)? - nodes_cpu_before;
        let machine_after = machine_cpu()?;
        let busy = machine_after.0 - machine_before.0;
        let machine_all = (machine_after.1 - machine_before.1).max(1e-9);
        let lan_after = lan.proxy.stats()?;

        let before = trace.before_resume.as_secs_f64();
        let label = scenario.label();
        let mut records = Vec::new();
        for (i, (m, node)) in marks.iter().zip(&nodes).enumerate() {
            let m = *lock(m);
            let (Some(running), Some(answered), true) = (m.running, m.answered, m.done) else {
                bail!("{label}: replay {} did not pass its marks: {m:?}", i + 1);
            };
            let fetch = NodeFetch::from_stats(&node.proxy.stats()?).since(&fetch_before[i]);
            records.push(CloneRecord {
                scenario: label.to_owned(),
                clone: i + 1,
                image: 1,
                total_secs: before + running.0,
                copy_secs: before,
                overlay_secs: 0.0,
                resume_secs: running.0,
                wan_bytes: wan_all / n as u64,
                responsive_secs: Some(before + answered.0),
                wan_running_bytes: Some(running.1),
                wan_responsive_bytes: Some(answered.1),
                whole_local_secs: None,
                fetch: Some(fetch),
            });
        }
        let last = records
            .iter()
            .filter_map(|r| r.responsive_secs)
            .fold(0.0, f64::max);
        let to_last_answer = records
            .iter()
            .filter_map(|r| r.wan_responsive_bytes)
            .max()
            .unwrap_or(0);
        eprintln!(
            "{label}: {n} replays at once, the last answering after {last:.2} s, {:.1} MiB over \
             the WAN to then ({:.1} MiB in all)",
            to_last_answer as f64 / MIB as f64,
            wan_all as f64 / MIB as f64
        );
        let mut notes = vec![format!(
            "{label}: {n} replays of the recorded clone ({} reads, {:.1} MiB of `mem`, {:.2} s of \
             the guest's own time to its answer) at once through {n} nodes behind a fresh LAN \
             proxy; the last answered after {last:.2} s; {:.1} MiB crossed the WAN until then, \
             {:.1} MiB in all. The LAN proxy used {:.2} CPU seconds, {:.3} per clone.",
            trace.entries.len(),
            trace.bytes() as f64 / MIB as f64,
            trace.think_to_answer().as_secs_f64(),
            to_last_answer as f64 / MIB as f64,
            wan_all as f64 / MIB as f64,
            cpu,
            cpu / n as f64
        )];
        notes.push(format!(
            "{label}: the machine's {cores} cores were {:.0}% busy from the replays' start to \
             their end ({busy:.1} CPU seconds: the LAN proxy {cpu:.1}, the {n} node proxies \
             {cpu_nodes:.1}, the rest {:.1}: the replays, the WAN link, the image server); at \
             a site each node has CPUs of its own, here they share {cores}.",
            100.0 * busy / machine_all,
            busy - cpu - cpu_nodes,
            cores = std::thread::available_parallelism().map_or(1, |c| c.get()),
        ));
        notes.push(lan_counters_note(label, &lan_before, &lan_after));
        let of = |s: &crate::Stats, key: &str| {
            s.json()["file_cache"]
                .get(key)
                .and_then(|v| v.as_u64())
                .unwrap_or(0)
        };
        let working_set = ["profile_wire_bytes", "demand_wire_bytes"]
            .iter()
            .map(|k| of(&lan_after, k).saturating_sub(of(&lan_before, k)))
            .sum();
        Ok((records, notes, working_set))
    }
}

/// Waits for every child to be ready, gives them the go, and waits (at most
/// `timeout`) for each to exit 0.
fn go_and_wait(
    children: &mut [Child],
    ready: &mpsc::Receiver<()>,
    timeout: Duration,
) -> Result<()> {
    for _ in 0..children.len() {
        ready
            .recv_timeout(READY_TIMEOUT)
            .context("a replay child did not map mem in time")?;
    }
    for child in children.iter_mut() {
        let stdin = child.stdin.as_mut().context("a replay child's stdin")?;
        stdin.write_all(b"g")?;
        stdin.flush()?;
    }
    let deadline = Instant::now() + timeout;
    for child in children.iter_mut() {
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("a replay child exited {status}");
                }
                break;
            }
            if Instant::now() >= deadline {
                bail!("a replay did not finish within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// The LAN proxy's `ext` and `file_cache` counters over a storm, by name
/// from its JSON (counters it does not have are left out).
fn lan_counters_note(label: &str, before: &crate::Stats, after: &crate::Stats) -> String {
    let mut parts = Vec::new();
    for (section, keys) in [
        (
            "ext",
            &[
                "fetch_calls",
                "from_file_cache",
                "forwarded",
                "class_calls_demand",
                "class_calls_profile",
                "class_calls_background",
                "class_calls_bulk",
            ][..],
        ),
        (
            "file_cache",
            &[
                "chunks_fetched",
                "wire_bytes",
                "demand_wire_bytes",
                "profile_wire_bytes",
                "background_wire_bytes",
                "frames_made",
                "frames_reused",
                "coalesced_fetches",
            ][..],
        ),
    ] {
        for key in keys {
            let of = |s: &crate::Stats| s.json()[section].get(*key).and_then(|v| v.as_u64());
            if let Some(now) = of(after) {
                let d = now.saturating_sub(of(before).unwrap_or(0));
                if key.ends_with("_bytes") {
                    parts.push(format!("{section}.{key} {:.1} MiB", d as f64 / MIB as f64));
                } else {
                    parts.push(format!("{section}.{key} {d}"));
                }
            }
        }
    }
    format!("{label}'s LAN proxy over the storm: {}.", parts.join(", "))
}

//! Restarts under lazy clones: guests cloned lazily through a node's FUSE
//! mount keep running while the proxies under them are restarted, as a
//! supervisor, an operator or a crash does it.
//!
//! "lazy restart": a LAN proxy in front of a fresh WAN link (slowed to
//! [`RestartPlan::mbit`], so the node is still fetching the memory image
//! when the first restarts come), a node behind it, and
//! [`RestartPlan::guests`] lazy clones of image 1 through the node's mount,
//! all left running; while they are cloned and resumed, the node proxy is
//! killed -9 and started again [`RestartPlan::early_kills`] times (its
//! fetches under way). Then, each after a wait drawn from the plan's seed:
//! the node proxy killed -9 and the same command started again
//! ([`RestartPlan::kills`] times), stopped with SIGTERM and started again
//! (`stops`), replaced by `gvfs-proxy --take-over` (`upgrades`; from the
//! binary `GVFS_PREV_BIN` names, when set, for the first one: the test
//! script builds the previous code commit's, `scripts/build-prev.sh`), the LAN
//! proxy killed -9 and started again on the same port (`lan_kills`), and
//! the image server's proxy likewise (`server_kills`).
//!
//! **What is measured** per restart ([`RestartStep`]): a thread per guest
//! stamps each `tick N MD5` line of its serial log as it appears (every
//! 20 ms); the longest gap between two ticks of any guest from the last
//! tick before the restart until every guest has ticked twice after it is
//! the stall the guests saw. A guest whose QEMU exited is lost; a tick with
//! a digest the disk does not have, or out of order, is wrong. After each
//! restart every guest answers a request (the digest of its `boot/` files,
//! read from its memory). Over the whole scenario: the bytes the node and
//! the LAN proxy fetched again of pieces a progress log had kept
//! (`file_cache.refetched_bytes`, summed over their processes), what the
//! logs kept (`kept_bytes`), and the WAN's bytes against the memory
//! image's compressed size.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};

use super::bench::{Bench, Restart, at_once, node_ip, wire};
use super::guest::{MEM, STATE, Watch, serial_ticks};
use super::images::zstd_size;
use super::procedure::{LiveClone, Procedure, Timing, clone_live};
use super::report::CloneRecord;
use super::scenario::{Dedup, MIB, RestartPlan, Scenario};
use crate::Stats;

/// How often a guest's serial log is read for new ticks.
const TICK_POLL: Duration = Duration::from_millis(20);

/// How long after a restart the guests may take to tick on before the
/// run fails.
const TICK_ON_TIMEOUT: Duration = Duration::from_secs(120);

/// How long after the clones start the first early kill may come: past
/// their copies of small files from the mount.
const EARLY_KILL_AFTER: Duration = Duration::from_secs(2);

/// How long a guest may take to answer a request after a restart.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// The restarts of `plan`, in the order they run.
fn actions(plan: &RestartPlan) -> Vec<Action> {
    let prev = std::env::var_os("GVFS_PREV_BIN").map(PathBuf::from);
    let mut out = Vec::new();
    out.extend(std::iter::repeat_n(Action::KillNode, plan.kills));
    out.extend(std::iter::repeat_n(Action::StopNode, plan.stops));
    for i in 0..plan.upgrades {
        out.push(Action::UpgradeNode(prev.clone().filter(|_| i == 0)));
    }
    out.extend(std::iter::repeat_n(Action::KillLan, plan.lan_kills));
    out.extend(std::iter::repeat_n(Action::KillServer, plan.server_kills));
    out
}

/// One restart.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    KillNode,
    StopNode,
    /// A hot upgrade, from the given binary when there is one (the node
    /// then runs it from the scenario's start).
    UpgradeNode(Option<PathBuf>),
    KillLan,
    KillServer,
}

impl Action {
    fn label(&self) -> &'static str {
        match self {
            Action::KillNode => "node kill -9",
            Action::StopNode => "node SIGTERM",
            Action::UpgradeNode(Some(_)) => "node hot upgrade from GVFS_PREV_BIN",
            Action::UpgradeNode(None) => "node hot upgrade",
            Action::KillLan => "LAN kill -9",
            Action::KillServer => "image server kill -9",
        }
    }
}

/// One restart, as the guests saw it.
#[derive(Debug, Clone)]
pub struct RestartStep {
    /// What was restarted, and how.
    pub action: String,
    /// Seconds waited since the previous restart settled.
    pub waited_secs: f64,
    /// What the node had received for the memory image and device state
    /// when it began (over all its processes), in percent of their
    /// compressed size: under 100, its fetch was under way.
    pub fetched_pct: f64,
    /// Seconds the restart took: from the signal to the new proxy ready.
    pub restart_secs: f64,
    /// The longest gap between two ticks of any guest across it, seconds.
    pub stall_secs: f64,
    /// Guests whose QEMU exited.
    pub lost: usize,
    /// Ticks with a wrong digest or out of order.
    pub wrong: usize,
    /// Guests that answered their request after it.
    pub answered: usize,
}

/// What the scenario found over all its restarts.
#[derive(Debug, Clone, Default)]
pub struct RestartTotals {
    /// Bytes the node fetched again of pieces its progress logs had kept
    /// (summed over its processes).
    pub node_refetched: u64,
    /// Bytes the node's progress logs kept across its restarts.
    pub node_kept: u64,
    /// The same for the LAN proxy.
    pub lan_refetched: u64,
    /// The same for the LAN proxy.
    pub lan_kept: u64,
    /// Bytes the node's file cache received (compressed), summed over its
    /// processes: the memory image and device state, and what was
    /// fetched again.
    pub node_wire: u64,
    /// The memory image and device state compressed (zstd -3): what one
    /// whole fetch of them moves, about.
    pub image_zstd: u64,
    /// Bytes across the WAN over the whole scenario.
    pub wan_bytes: u64,
    /// The median gap between two ticks while nothing restarted, seconds.
    pub quiet_gap_secs: f64,
    /// The kill -9s of the node while the guests were being cloned: how
    /// long each restart took, seconds.
    pub early_kills: Vec<f64>,
}

/// Stamps a guest's ticks as they appear in its serial log.
struct TickLog {
    serial: PathBuf,
    /// The digest of each `run/` file, by tick number modulo their count.
    run_sums: Vec<String>,
    /// (tick, right digest, when seen).
    seen: Mutex<Vec<(u64, bool, Instant)>>,
}

impl TickLog {
    fn new(guest: &LiveClone) -> Self {
        Self {
            serial: guest.dir.path().join("serial.log"),
            run_sums: guest.guest.run_sums().to_vec(),
            seen: Mutex::new(Vec::new()),
        }
    }

    fn right(&self, n: u64, sum: &str) -> bool {
        let i = (n % self.run_sums.len().max(1) as u64) as usize;
        self.run_sums.get(i).is_some_and(|want| want == sum)
    }

    fn watch(&self, stop: &AtomicBool) {
        let mut offset = 0;
        while !stop.load(Ordering::Relaxed) {
            let (ticks, next) = serial_ticks(&self.serial, offset);
            offset = next;
            if !ticks.is_empty() {
                let now = Instant::now();
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                for (n, sum) in ticks {
                    let in_order = seen.last().is_none_or(|l| n > l.0);
                    let right = in_order && self.right(n, &sum);
                    seen.push((n, right, now));
                }
            }
            std::thread::sleep(TICK_POLL);
        }
    }

    fn snapshot(&self) -> Vec<(u64, bool, Instant)> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Bench<'_> {
    /// Lazy restart: its clones, restarts and totals.
    pub(super) fn run_lazy_restart(
        &mut self,
    ) -> Result<(Vec<CloneRecord>, Vec<RestartStep>, RestartTotals)> {
        let plan = &self.settings.restart;
        ensure!(plan.guests >= 1, "lazy restart needs a guest");
        let actions = actions(plan);
        let link = self.settings.link_config_at(plan.mbit);
        let wan = self.link_with(link)?;
        let mut lan = self.node(None, Self::gvfs_url(&wan), Dedup::Off)?;
        let prev = actions.iter().find_map(|a| match a {
            Action::UpgradeNode(Some(bin)) => Some(bin.clone()),
            _ => None,
        });
        let mut node = self.node_as(
            Some(node_ip(0)),
            lan.proxy.upstream_url(),
            true,
            Dedup::Off,
            ("node", "2G"),
            |a| match &prev {
                Some(bin) => a.binary(bin.clone()),
                None => a,
            },
        )?;
        let label = Scenario::LazyRestart.label();
        let golden = self.golden(1);
        let mut totals = RestartTotals {
            image_zstd: zstd_size(&golden.join(MEM))? + zstd_size(&golden.join(STATE))?,
            ..RestartTotals::default()
        };
        let mut draw = 0;
        // The guests start while the node is killed -9 (the early kills):
        // their resumes and the node's fetches are under way.
        let procedure = node.lazy(1)?;
        let (started, early) = {
            let this = &*self;
            std::thread::scope(|scope| {
                let clones = scope.spawn(|| this.start_guests(&procedure, plan.guests, &wan));
                let mut early = Vec::new();
                for _ in 0..plan.early_kills {
                    // Past the clones' copies from the mount: this process
                    // must hold no file of a mount its next proxy serves
                    // when it starts that proxy (its exec would wait).
                    std::thread::sleep(EARLY_KILL_AFTER + wait_before(plan, draw));
                    draw += 1;
                    if clones.is_finished() {
                        break;
                    }
                    add_node(&mut totals, &node.proxy.stats());
                    let began = Instant::now();
                    if let Err(e) = node.restart(Restart::Kill) {
                        early.push(Err(e));
                        break;
                    }
                    early.push(Ok(began.elapsed().as_secs_f64()));
                }
                let started = clones
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the clones' thread panicked")));
                (started, early)
            })
        };
        let (timings, mut guests) = started?;
        totals.early_kills = early.into_iter().collect::<Result<Vec<_>>>()?;
        let mut records = Vec::new();
        for (i, t) in timings.iter().enumerate() {
            t.log(label, i + 1, 1, wire(&wan));
            records.push(t.record(label, i + 1, 1, wire(&wan)));
        }
        let logs: Vec<TickLog> = guests.iter().map(TickLog::new).collect();
        let stop = AtomicBool::new(false);
        let mut steps = Vec::new();
        let result = std::thread::scope(|scope| {
            for log in &logs {
                let stop = &stop;
                scope.spawn(move || log.watch(stop));
            }
            let steps_run = (|| {
                let mut quiet = Vec::new();
                for action in &actions {
                    let wait = wait_before(plan, draw);
                    draw += 1;
                    let waited = Instant::now();
                    std::thread::sleep(wait);
                    quiet.extend(gaps_between(&logs, waited, Instant::now()));
                    let now = node.proxy.stats();
                    let fetched = totals.node_wire + count(&now, "wire_bytes");
                    let fetched_pct = 100.0 * fetched as f64 / totals.image_zstd.max(1) as f64;
                    // Each process counts from its start: add what the one
                    // about to go counted.
                    match action {
                        Action::KillLan => add_lan(&mut totals, &lan.proxy.stats()),
                        Action::KillServer => {}
                        _ => add_node(&mut totals, &now),
                    }
                    let began = Instant::now();
                    match action {
                        Action::KillNode => node.restart(Restart::Kill)?,
                        Action::StopNode => node.restart(Restart::Stop)?,
                        Action::UpgradeNode(_) => node.restart(Restart::Upgrade)?,
                        Action::KillLan => lan.restart(Restart::Kill)?,
                        Action::KillServer => self.restart_image_server()?,
                    }
                    let ready = Instant::now();
                    let settled = tick_on(&logs, ready)?;
                    let stall = longest_gap(&logs, began, settled);
                    let mut step = RestartStep {
                        action: action.label().to_owned(),
                        waited_secs: wait.as_secs_f64(),
                        fetched_pct,
                        restart_secs: (ready - began).as_secs_f64(),
                        stall_secs: stall.as_secs_f64(),
                        lost: 0,
                        wrong: 0,
                        answered: 0,
                    };
                    for g in guests.iter_mut() {
                        if g.guest.check_alive().is_err() {
                            step.lost += 1;
                        } else if g.guest.ask(ANSWER_TIMEOUT).is_ok() {
                            step.answered += 1;
                        }
                    }
                    step.wrong = logs
                        .iter()
                        .map(|l| l.snapshot().iter().filter(|t| !t.1).count())
                        .sum::<usize>()
                        - steps.iter().map(|s: &RestartStep| s.wrong).sum::<usize>();
                    eprintln!(
                        "{label}: {} after {:.1} s (the node had {:.0}% of the image): ready in \
                         {:.2} s, longest tick gap {:.2} s, {} lost, {} wrong ticks, {}/{} answered",
                        step.action,
                        step.waited_secs,
                        step.fetched_pct,
                        step.restart_secs,
                        step.stall_secs,
                        step.lost,
                        step.wrong,
                        step.answered,
                        plan.guests
                    );
                    steps.push(step);
                }
                quiet.sort_by(|a, b| a.total_cmp(b));
                totals.quiet_gap_secs = quiet.get(quiet.len() / 2).copied().unwrap_or(0.0);
                Ok::<_, anyhow::Error>(())
            })();
            stop.store(true, Ordering::Relaxed);
            steps_run
        });
        add_node(&mut totals, &node.proxy.stats());
        add_lan(&mut totals, &lan.proxy.stats());
        totals.wan_bytes = wire(&wan);
        for g in guests {
            g.guest.quit();
        }
        result?;
        Ok((records, steps, totals))
    }

    /// `n` lazy clones as `procedure` says, at once, left running.
    fn start_guests(
        &self,
        procedure: &Procedure,
        n: usize,
        wan: &gvfs_wanlink::WanLink,
    ) -> Result<(Vec<Timing>, Vec<LiveClone>)> {
        let timeout = self.settings.clone_timeout;
        let bytes = || wire(wan);
        let guests: Vec<usize> = (0..n).collect();
        let started = at_once(&guests, |_| {
            let watch = Watch {
                bytes: Some(&bytes),
                ..Watch::default()
            };
            clone_live(&self.kit, procedure, self.work.path(), timeout, watch)
        })?;
        let (timings, live) = started.into_iter().unzip();
        Ok((timings, live))
    }
}

/// The wait before restart `i`: from 0.2 s to the plan's longest, drawn
/// from its seed (splitmix64).
fn wait_before(plan: &RestartPlan, i: u64) -> Duration {
    let mut z = plan
        .seed
        .wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    Duration::from_secs_f64(0.2 + unit * (plan.max_wait.as_secs_f64() - 0.2).max(0.0))
}

/// The counter `key` of a proxy's file cache in `stats` (0 without).
fn count(stats: &Result<Stats>, key: &str) -> u64 {
    stats
        .as_ref()
        .ok()
        .and_then(|v| v.json()["file_cache"][key].as_u64())
        .unwrap_or(0)
}

/// Adds what a node process counted from its start (read just before it
/// is replaced, and at the end) to the totals.
fn add_node(totals: &mut RestartTotals, node: &Result<Stats>) {
    totals.node_refetched += count(node, "refetched_bytes");
    totals.node_kept += count(node, "kept_bytes");
    totals.node_wire += count(node, "wire_bytes");
}

/// The same for a LAN proxy process.
fn add_lan(totals: &mut RestartTotals, lan: &Result<Stats>) {
    totals.lan_refetched += count(lan, "refetched_bytes");
    totals.lan_kept += count(lan, "kept_bytes");
}

/// Waits until every guest has ticked twice since `ready` (and one
/// second has passed); returns when. Fails after [`TICK_ON_TIMEOUT`].
fn tick_on(logs: &[TickLog], ready: Instant) -> Result<Instant> {
    let deadline = ready + TICK_ON_TIMEOUT;
    loop {
        let now = Instant::now();
        let ticked = logs
            .iter()
            .all(|l| l.snapshot().iter().filter(|t| t.2 > ready).count() >= 2);
        if ticked && now >= ready + Duration::from_secs(1) {
            return Ok(now);
        }
        if now >= deadline {
            bail!("a guest did not tick on within {TICK_ON_TIMEOUT:?} of a restart");
        }
        std::thread::sleep(TICK_POLL);
    }
}

/// The longest gap between two ticks of one guest from the last tick
/// before `from` to the last before `to`.
fn longest_gap(logs: &[TickLog], from: Instant, to: Instant) -> Duration {
    logs.iter()
        .map(|l| {
            let seen = l.snapshot();
            let start = seen.iter().rposition(|t| t.2 <= from).unwrap_or(0);
            seen[start..]
                .iter()
                .filter(|t| t.2 <= to)
                .collect::<Vec<_>>()
                .windows(2)
                .map(|w| w[1].2 - w[0].2)
                .max()
                .unwrap_or_default()
        })
        .max()
        .unwrap_or_default()
}

/// Gaps between the ticks each guest printed from `from` to `to`, seconds.
fn gaps_between(logs: &[TickLog], from: Instant, to: Instant) -> Vec<f64> {
    let mut out = Vec::new();
    for l in logs {
        let seen: Vec<Instant> = l
            .snapshot()
            .into_iter()
            .map(|t| t.2)
            .filter(|&at| at >= from && at <= to)
            .collect();
        out.extend(seen.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()));
    }
    out
}

/// The restarts as a report section.
pub fn restarts_markdown(steps: &[RestartStep], totals: &RestartTotals) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nRestarts under running lazy clones (`src/clone/restart.rs`; stall: the longest gap \
         between two ticks of any guest across the restart):\n\n\
         | restart | waited s | node had fetched | ready s | stall s | lost | wrong ticks | answered |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in steps {
        out += &format!(
            "| {} | {:.1} | {:.0}% | {:.2} | {:.2} | {} | {} | {} |\n",
            s.action,
            s.waited_secs,
            s.fetched_pct,
            s.restart_secs,
            s.stall_secs,
            s.lost,
            s.wrong,
            s.answered
        );
    }
    let m = |n: u64| n as f64 / MIB as f64;
    if !totals.early_kills.is_empty() {
        let longest = totals.early_kills.iter().copied().fold(0.0, f64::max);
        out += &format!(
            "\nBefore these, the node was killed -9 {} times while the guests were being cloned \
             and resumed (its fetches under way), each started again at once (the longest \
             restart {longest:.2} s); every clone ran and answered (the clone rows).\n",
            totals.early_kills.len()
        );
    }
    out += &format!(
        "\nA tick every {:.2} s (median) while nothing restarted. The node received {:.1} MiB \
         for the memory image and device state over all its processes ({:.2}x their {:.1} MiB \
         compressed). Kept by the progress logs at the restarts (summed over processes): node \
         {:.1} MiB, LAN {:.1} MiB; fetched again although kept: node {:.2} MiB, LAN {:.2} MiB; \
         {:.1} MiB across the WAN in all.\n",
        totals.quiet_gap_secs,
        m(totals.node_wire),
        totals.node_wire as f64 / totals.image_zstd.max(1) as f64,
        m(totals.image_zstd),
        m(totals.node_kept),
        m(totals.lan_kept),
        m(totals.node_refetched),
        m(totals.lan_refetched),
        m(totals.wan_bytes)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_runs_its_restarts_in_order() {
        let plan = RestartPlan::quick();
        let labels: Vec<&str> = actions(&plan).iter().map(Action::label).collect();
        assert_eq!(labels.len(), 5);
        assert_eq!(labels[0], "node kill -9");
        assert_eq!(labels[1], "node SIGTERM");
        assert!(labels[2].starts_with("node hot upgrade"));
        assert_eq!(labels[3], "LAN kill -9");
        assert_eq!(labels[4], "image server kill -9");
        let bench = RestartPlan::bench();
        assert_eq!(actions(&bench).len(), 10 + 10 + 1 + 1 + 1);
    }

    #[test]
    fn the_longest_gap_spans_the_restart() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let log = TickLog {
            serial: PathBuf::new(),
            run_sums: Vec::new(),
            seen: Mutex::new(vec![
                (1, true, at(0)),
                (2, true, at(100)),
                (3, true, at(900)),
                (4, true, at(1000)),
            ]),
        };
        // The restart began at 150 ms: the gap from tick 2 to tick 3.
        assert_eq!(
            longest_gap(std::slice::from_ref(&log), at(150), at(2000)),
            Duration::from_millis(800)
        );
        assert_eq!(
            gaps_between(std::slice::from_ref(&log), at(850), at(2000)),
            vec![0.1]
        );
    }
}

//! A clone's resume: QEMU started with `-incoming defer` on the clone's
//! files, the device state loaded, the guest continued, and the clone
//! timed to verified running (the tick after the golden one's last, with
//! the right disk digest) and to responsive (its answer to a request, with
//! the digest of the `boot/` files read from its memory).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::json;

use super::golden::{CONFIG, DISK, STATE, VmConfig};
use super::kit::GuestKit;
use super::limits::QMP_TIMEOUT;
use super::qemu::{Machine, Qemu, Qmp, RamMapping};

/// What the harness watches while a clone resumes; every part optional.
#[derive(Default, Clone, Copy)]
pub struct Watch<'a> {
    /// Bytes moved so far (across the WAN), read the moment the guest is
    /// verified running and the moment it has answered its request.
    pub bytes: Option<&'a (dyn Fn() -> u64 + Sync)>,
    /// Called right before `cont` (the device state is loaded).
    pub resuming: Option<&'a (dyn Fn() + Sync)>,
}

/// A clone's resume, as measured.
#[derive(Debug, Clone, Copy)]
pub struct Resumed {
    /// QEMU start to the device state loaded, seconds.
    pub incoming_secs: f64,
    /// `cont` to the first verified tick, seconds.
    pub run_secs: f64,
    /// When the guest was verified running.
    pub running: Instant,
    /// When it had answered its request with the right digest.
    pub answered: Instant,
    /// [`Watch::bytes`] at `running` (0 without it).
    pub bytes_running: u64,
    /// [`Watch::bytes`] at `answered` (0 without it).
    pub bytes_answered: u64,
}

/// Resumes a clone whose files are in `dir` (`vm.json` and `state` copied
/// there, and `disk.qcow2` the overlay) with its RAM in `ram`, mapped as
/// `mapping` says (`dir/mem` copied there, shared; or a golden `mem`,
/// private): starts QEMU with `-incoming defer`, loads the state,
/// continues it, and waits until the guest prints the tick after the golden
/// one's last with the right digest (verified running). Then sends it a
/// request and waits for the answer with the digest of the `boot/` files
/// (responsive), and quits it.
pub fn resume_clone(
    kit: &GuestKit,
    dir: &Path,
    ram: &Path,
    mapping: RamMapping,
    timeout: Duration,
    watch: Watch<'_>,
) -> Result<Resumed> {
    let (resumed, live) = resume_live(kit, dir, ram, mapping, timeout, watch)?;
    live.quit();
    Ok(resumed)
}

/// [`resume_clone`], leaving the guest running.
pub fn resume_live(
    kit: &GuestKit,
    dir: &Path,
    ram: &Path,
    mapping: RamMapping,
    timeout: Duration,
    watch: Watch<'_>,
) -> Result<(Resumed, Live)> {
    let config = VmConfig::load(&dir.join(CONFIG))?;
    let start = Instant::now();
    let machine = Machine {
        kit,
        ram_mib: config.ram_mib,
        cmdline: &config.cmdline,
        mem: ram,
        mapping,
        disk: &dir.join(DISK),
        incoming: true,
    };
    let mut vm = Qemu::start(&machine, dir)?;
    let mut qmp = vm.qmp()?;
    qmp.ignore_shared()?;
    qmp.execute(
        "migrate-incoming",
        Some(json!({"uri": format!("exec:cat '{}'", dir.join(STATE).display())})),
    )?;
    qmp.wait_migration("migrate-incoming", QMP_TIMEOUT)?;
    let incoming_secs = start.elapsed().as_secs_f64();
    if let Some(resuming) = watch.resuming {
        resuming();
    }
    let cont = Instant::now();
    qmp.execute("cont", None)?;
    let last = config.last_tick;
    let remaining = timeout.saturating_sub(start.elapsed());
    let tick = vm.wait_for_tick(|n| n > last, remaining)?;
    let running = Instant::now();
    let bytes_running = watch.bytes.map_or(0, |b| b());
    let run_secs = cont.elapsed().as_secs_f64();
    let (n, sum) = vm
        .ticks()?
        .into_iter()
        .find(|t| t.0 == tick)
        .context("the tick line went away")?;
    // The first line may finish one the golden guest had begun.
    ensure!(
        n <= last + 2,
        "{}: the clone printed tick {n} after the golden image's {last}: it did not resume \
         from the saved state",
        config.name
    );
    let mut live = Live { vm, qmp, config };
    live.check_tick(n, &sum)?;
    live.ask(timeout.saturating_sub(start.elapsed()))?;
    let answered = Instant::now();
    let bytes_answered = watch.bytes.map_or(0, |b| b());
    Ok((
        Resumed {
            incoming_secs,
            run_secs,
            running,
            answered,
            bytes_running,
            bytes_answered,
        },
        live,
    ))
}

/// A resumed clone left running: its ticks can be read and checked, and
/// it can be asked to answer again. Killed on drop.
pub struct Live {
    vm: Qemu,
    qmp: Qmp,
    config: VmConfig,
}

impl Live {
    /// Complete `tick N MD5` lines printed so far.
    pub fn ticks(&self) -> Result<Vec<(u64, String)>> {
        self.vm.ticks()
    }

    /// The digest of each `run/` file, by tick number modulo their count.
    pub fn run_sums(&self) -> &[String] {
        &self.config.run_sums
    }

    /// Fails unless tick `n` read the digest the disk has for it.
    pub fn check_tick(&self, n: u64, sum: &str) -> Result<()> {
        let sums = &self.config.run_sums;
        let want = &sums[(n % sums.len() as u64) as usize];
        ensure!(
            sum == want,
            "{}: tick {n} read run/{} with MD5 {sum}, the disk has {want}",
            self.config.name,
            n % sums.len() as u64
        );
        Ok(())
    }

    /// Sends a request and waits (at most `timeout`) for its answer, which
    /// must carry the digest of the `boot/` files.
    pub fn ask(&mut self, timeout: Duration) -> Result<()> {
        let id = format!(
            "r{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let sum = self.vm.request(&id, timeout)?;
        ensure!(
            sum == self.config.boot_sum,
            "{}: request {id} was answered with MD5 {sum}, the boot/ files have {}",
            self.config.name,
            self.config.boot_sum
        );
        Ok(())
    }

    /// Fails if QEMU has exited, with its log.
    pub fn check_alive(&mut self) -> Result<()> {
        self.vm.check_alive()
    }

    /// Asks QEMU to quit, and waits for it (killing it if it does not).
    pub fn quit(mut self) {
        self.qmp.execute("quit", None).ok();
        self.vm.wait_exit(QMP_TIMEOUT).ok();
    }
}

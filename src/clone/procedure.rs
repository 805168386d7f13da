//! One clone: where its files come from, how it gets its memory image,
//! and how long its parts took.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::console::log_errors;
use super::guest::{self, CONFIG, DISK, GuestKit, MEM, RamMapping, Resumed, STATE, Watch};
use super::report::{CloneRecord, NodeFetch};
use super::scenario::MIB;
use crate::libnfs::{CopyClient, nfs_url};

/// Where a clone's files come from.
#[derive(Debug, Clone)]
pub(super) enum Source {
    /// A local directory; the golden disk is used in place as the backing file.
    Local(PathBuf),
    /// Over NFS: `nfs-cp` copies from `host` (with these ports), and QEMU's
    /// `nfs://host/...` finds the server through PORTMAP on `host:111`.
    Nfs {
        host: IpAddr,
        nfs_port: u16,
        mount_port: u16,
        export: String,
        dir: String,
    },
}

impl Source {
    pub(super) fn copy(&self, name: &str, to: &Path, timeout: Duration) -> Result<()> {
        match self {
            Source::Local(dir) => {
                std::fs::copy(dir.join(name), to)
                    .with_context(|| format!("copying {name} from {}", dir.display()))?;
            }
            Source::Nfs { .. } => {
                CopyClient::NfsCp.copy(&self.url(name), &to.display().to_string(), timeout)?;
            }
        }
        Ok(())
    }

    pub(super) fn url(&self, name: &str) -> String {
        match self {
            Source::Local(dir) => dir.join(name).display().to_string(),
            Source::Nfs {
                host,
                nfs_port,
                mount_port,
                export,
                dir,
            } => nfs_url(
                *host,
                *nfs_port,
                *mount_port,
                export,
                &format!("{dir}/{name}"),
            ),
        }
    }

    /// The golden disk as QEMU names it.
    pub(super) fn backing(&self) -> String {
        match self {
            Source::Local(dir) => dir.join(DISK).display().to_string(),
            Source::Nfs {
                host, export, dir, ..
            } => format!("nfs://{host}{export}/{dir}/{DISK}"),
        }
    }
}

/// How a clone gets its memory image.
#[derive(Debug, Clone)]
pub(super) enum Procedure {
    /// The paper's: copy `vm.json`, `mem` and `state` from the source and
    /// map the copy of `mem` shared.
    CopyFirst(Source),
    /// Copy `vm.json` and `state` from `files` (plain file copies: a
    /// directory, or a node's FUSE mount) and map `files/mem` itself,
    /// private and read-only; the overlay's backing file is `backing`.
    Lazy { files: PathBuf, backing: String },
}

/// How long the parts of one clone took, and what crossed the WAN.
#[derive(Debug, Clone)]
pub(super) struct Timing {
    /// When the clone started (its first copy).
    pub(super) start: Instant,
    pub(super) copy: f64,
    pub(super) overlay: f64,
    /// QEMU start to the guest verified running.
    pub(super) resume: f64,
    /// Start to the guest's answer to its request.
    pub(super) responsive: f64,
    /// WAN bytes since the start when the guest was verified running, and
    /// when it answered (`None` without a WAN).
    pub(super) wan_running: Option<u64>,
    pub(super) wan_responsive: Option<u64>,
    /// Lazy clones: start to the node holding the whole memory image.
    pub(super) whole_local: Option<f64>,
    /// Lazy clones: the node's file-cache counters over the clone.
    pub(super) fetch: Option<NodeFetch>,
    /// Error lines of the guest's console and QEMU's log
    /// ([`console_errors`](super::cut::console_errors)).
    pub(super) errors: Vec<String>,
}

impl Timing {
    /// From a clone's instants: its start, copies done, overlay made, and
    /// its resume; `wan` when its watch read the WAN's bytes.
    pub(super) fn new(
        start: Instant,
        copied: Instant,
        overlaid: Instant,
        r: &Resumed,
        wan: bool,
    ) -> Self {
        Self {
            start,
            copy: (copied - start).as_secs_f64(),
            overlay: (overlaid - copied).as_secs_f64(),
            resume: r.running.saturating_duration_since(overlaid).as_secs_f64(),
            responsive: r.answered.saturating_duration_since(start).as_secs_f64(),
            wan_running: wan.then_some(r.bytes_running),
            wan_responsive: wan.then_some(r.bytes_answered),
            whole_local: None,
            fetch: None,
            errors: Vec::new(),
        }
    }

    /// Start to the guest verified running: the clone time.
    pub(super) fn total(&self) -> f64 {
        self.copy + self.overlay + self.resume
    }

    /// The same clone started `secs` earlier (a full copy's stream first).
    pub(super) fn after(mut self, secs: f64) -> Self {
        self.copy += secs;
        self.responsive += secs;
        self
    }

    /// Its record; `wan` the bytes across the WAN for the whole clone.
    pub(super) fn record(
        &self,
        scenario: &str,
        clone: usize,
        image: usize,
        wan: u64,
    ) -> CloneRecord {
        CloneRecord {
            scenario: scenario.to_owned(),
            clone,
            image,
            total_secs: self.total(),
            copy_secs: self.copy,
            overlay_secs: self.overlay,
            resume_secs: self.resume,
            wan_bytes: wan,
            responsive_secs: Some(self.responsive),
            wan_running_bytes: self.wan_running,
            wan_responsive_bytes: self.wan_responsive,
            whole_local_secs: self.whole_local,
            fetch: self.fetch,
        }
    }

    /// Says what the clone took on stderr.
    pub(super) fn log(&self, scenario: &str, clone: usize, image: usize, wan: u64) {
        let wan_at =
            |b: Option<u64>| b.map_or("-".to_owned(), |b| format!("{:.1}", b as f64 / MIB as f64));
        eprintln!(
            "{scenario} clone {clone} (image {image}): {:.2} s (copy {:.2}, overlay {:.2}, resume {:.2}), \
             answered at {:.2} s, {:.1} MiB over the WAN ({} MiB when running, {} when answered){}",
            self.total(),
            self.copy,
            self.overlay,
            self.resume,
            self.responsive,
            wan as f64 / MIB as f64,
            wan_at(self.wan_running),
            wan_at(self.wan_responsive),
            self.whole_local.map_or(String::new(), |w| format!(
                ", memory image whole on the node at {w:.2} s"
            ))
        );
        for e in &self.errors {
            eprintln!("{scenario} clone {clone}: {e}");
        }
    }
}

/// Clones as `procedure` says into a fresh directory under `work` and
/// resumes it (watched by `watch`). Timed from the first copy.
pub(super) fn clone_one(
    kit: &GuestKit,
    procedure: &Procedure,
    work: &Path,
    timeout: Duration,
    watch: Watch<'_>,
) -> Result<Timing> {
    let (mut timing, live) = clone_live(kit, procedure, work, timeout, watch)?;
    live.guest.quit();
    timing.errors = log_errors(live.dir.path());
    Ok(timing)
}

/// A clone left running, and its directory.
pub(super) struct LiveClone {
    pub(super) guest: guest::Live,
    pub(super) dir: tempfile::TempDir,
}

/// [`clone_one`], leaving the guest running.
pub(super) fn clone_live(
    kit: &GuestKit,
    procedure: &Procedure,
    work: &Path,
    timeout: Duration,
    watch: Watch<'_>,
) -> Result<(Timing, LiveClone)> {
    let dir = tempfile::Builder::new()
        .prefix("clone-")
        .tempdir_in(work)
        .context("clone directory")?;
    let start = Instant::now();
    let (ram, mapping, copied, overlaid) = match procedure {
        Procedure::CopyFirst(source) => {
            for name in [CONFIG, MEM, STATE] {
                source.copy(name, &dir.path().join(name), timeout)?;
            }
            let copied = Instant::now();
            guest::create_overlay(&source.backing(), &dir.path().join(DISK))?;
            (
                dir.path().join(MEM),
                RamMapping::Shared,
                copied,
                Instant::now(),
            )
        }
        Procedure::Lazy { files, backing } => {
            // The overlay is made while the two small files are copied.
            let (copied, overlaid) = std::thread::scope(|scope| {
                let overlay = scope.spawn(|| {
                    guest::create_overlay(backing, &dir.path().join(DISK))?;
                    Ok::<_, anyhow::Error>(Instant::now())
                });
                let copies = [CONFIG, STATE].map(|name| {
                    let (from, to) = (files.join(name), dir.path().join(name));
                    scope.spawn(move || {
                        std::fs::copy(&from, &to)
                            .with_context(|| format!("copying {name} from {}", files.display()))
                    })
                });
                for c in copies {
                    c.join().map_err(|_| anyhow::anyhow!("a copy panicked"))??;
                }
                let copied = Instant::now();
                let overlaid = overlay
                    .join()
                    .map_err(|_| anyhow::anyhow!("qemu-img panicked"))??;
                Ok::<_, anyhow::Error>((copied, overlaid.max(copied)))
            })?;
            (files.join(MEM), RamMapping::Private, copied, overlaid)
        }
    };
    let (resumed, guest) = guest::resume_live(
        kit,
        dir.path(),
        &ram,
        mapping,
        timeout.saturating_sub(start.elapsed()),
        watch,
    )?;
    let timing = Timing::new(start, copied, overlaid, &resumed, watch.bytes.is_some());
    Ok((timing, LiveClone { guest, dir }))
}

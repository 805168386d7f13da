//! `gvfsctl vm clone`: an unmodified QEMU started from a golden image,
//! lazily (its memory image mapped from a gvfs mount, private and
//! read-only) or after copying the memory image.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::json;

use super::files::{copy_sparse, run_tool};
use super::machine::{DISK, MEM, Machine, STATE, qmp_socket};
use gvfs_proxy::qmp::{Qmp, exec_uri};

/// How long QEMU may take to make its QMP socket.
const QMP_START: Duration = Duration::from_secs(30);

/// How long the device state may take to load.
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// The oldest QEMU that maps a memory file private and read-only
/// (`memory-backend-file` with `readonly=on` and `share=off`).
const LAZY_QEMU: (u32, u32) = (8, 2);

/// How a lazy clone maps the golden memory image.
const LAZY_MAPPING: &str = "share=off,readonly=on,rom=off";

/// How a copy-first clone maps its own copy.
const COPY_MAPPING: &str = "share=on";

/// What `gvfsctl vm clone` was asked.
pub(super) struct CloneArgs {
    pub(super) dir: PathBuf,
    pub(super) copy: bool,
    pub(super) work: Option<PathBuf>,
    pub(super) detach: bool,
    pub(super) extra: Vec<OsString>,
}

/// Starts a clone of the golden image `a.dir` and resumes it; then waits
/// for QEMU and exits with its status, or (detached) leaves it running.
pub(super) fn clone(a: CloneArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let dir = std::path::absolute(&a.dir)?;
    let machine = Machine::load(&dir)?;
    let qemu = qemu_program(&machine.qemu)?;
    if !a.copy {
        lazy_possible(&dir, &qemu)?;
    }
    let work = work_dir(a.work.as_deref(), &dir)?;
    std::fs::copy(dir.join(STATE), work.join(STATE))
        .with_context(|| format!("copying {}", dir.join(STATE).display()))?;
    let (mem, mapping) = if a.copy {
        copy_sparse(&dir.join(MEM), &work.join(MEM))?;
        (work.join(MEM), COPY_MAPPING)
    } else {
        (dir.join(MEM), LAZY_MAPPING)
    };
    let disk = work.join(DISK);
    if let Some(d) = &machine.disk {
        let backing = d
            .kept
            .clone()
            .unwrap_or_else(|| dir.join(DISK).display().to_string());
        run_tool(
            Command::new("qemu-img")
                .args([
                    "create", "-q", "-f", "qcow2", "-F", &d.format, "-b", &backing,
                ])
                .arg(&disk),
            "qemu-img create (apt-get install qemu-utils)",
        )?;
    }
    let mut args = machine.clone_args(&mem, mapping, &disk, &work)?;
    let qmp_path = match qmp_socket(&args) {
        Some(p) => p,
        None => {
            let p = work.join("qmp.sock");
            args.push("-qmp".into());
            args.push(format!("unix:{},server=on,wait=off", p.display()));
            p
        }
    };
    args.extend(["-incoming".into(), "defer".into()]);
    let mut cmd = if a.copy {
        Command::new(&qemu)
    } else {
        // QEMU's huge-page advice would make Linux read the mapped image
        // 4 MiB around each first fault.
        let mut c = Command::new(std::env::current_exe()?);
        c.args(["no-huge-pages", "--"]).arg(&qemu);
        c
    };
    let log = std::fs::File::create(work.join("qemu.log"))?;
    cmd.args(&args)
        .args(&a.extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut qemu = cmd.spawn().with_context(|| format!("starting {qemu}"))?;
    let resumed = (|| {
        let log = || std::fs::read_to_string(work.join("qemu.log")).unwrap_or_default();
        let mut qmp = Qmp::connect_within(&qmp_path, QMP_START, || match qemu.try_wait()? {
            Some(status) => bail!("QEMU exited ({status}): {}", log()),
            None => Ok(()),
        })?;
        qmp.ignore_shared()?;
        qmp.execute(
            "migrate-incoming",
            Some(json!({ "uri": exec_uri("cat", &work.join(STATE))? })),
        )?;
        qmp.wait_migration("loading the device state", LOAD_TIMEOUT)?;
        qmp.execute("cont", None)?;
        let status = qmp.execute("query-status", None)?;
        ensure!(
            status["running"].as_bool() == Some(true),
            "the clone does not run after cont: {status}; QEMU: {}",
            log()
        );
        anyhow::Ok(())
    })();
    if let Err(e) = resumed {
        let _ = qemu.kill();
        let _ = qemu.wait();
        return Err(e.context(format!(
            "resuming the clone (its files: {})",
            work.display()
        )));
    }
    println!(
        "clone of {} running ({}) in {:.2} s: QEMU pid {}, QMP {}, files in {}",
        dir.display(),
        if a.copy { "copy-first" } else { "lazy" },
        start.elapsed().as_secs_f64(),
        qemu.id(),
        qmp_path.display(),
        work.display()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if a.detach {
        return Ok(ExitCode::SUCCESS);
    }
    let status = qemu.wait()?;
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// The program a clone runs for the golden VM's `qemu`: a golden image
/// comes from an image server, so only its name is taken, and only a
/// `qemu-system-*` one, found on this host's PATH (never a path the image
/// names).
fn qemu_program(qemu: &str) -> anyhow::Result<String> {
    let name = Path::new(qemu)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    ensure!(
        name.starts_with("qemu-system-")
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "the golden image names {qemu:?} as its QEMU: a clone runs only a qemu-system-* \
         program from PATH"
    );
    Ok(name.to_string())
}

/// Fails, saying what to do, unless a lazy clone of `dir` can be made:
/// it is on a gvfs FUSE mount, and `qemu` maps a memory file private and
/// read-only.
fn lazy_possible(dir: &Path, qemu: &str) -> anyhow::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let on_gvfs = gvfs_mount_of(&mountinfo, dir).is_some();
    ensure!(
        on_gvfs,
        "{} is not on a gvfs mount: a lazy clone maps its memory image from a node proxy's FUSE \
         mount, which fetches pages as the guest touches them. Start one (gvfs-proxy --upstream \
         ... --mount MNT --mount-readahead 0) and clone MNT/NAME, or pass --copy to copy the \
         memory image first",
        dir.display()
    );
    let out = Command::new(qemu)
        .arg("--version")
        .output()
        .with_context(|| format!("running {qemu} --version"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .and_then(|v| {
            let mut n = v.split('.').map(|x| x.parse::<u32>().ok());
            Some((n.next()??, n.next()??))
        });
    match version {
        Some(v) if v >= LAZY_QEMU => Ok(()),
        Some((major, minor)) => bail!(
            "{qemu} is QEMU {major}.{minor}: a lazy clone needs QEMU {}.{} or later (a memory \
             file mapped private and read-only); pass --copy to copy the memory image first",
            LAZY_QEMU.0,
            LAZY_QEMU.1
        ),
        None => bail!("cannot tell {qemu}'s version from {text:?}"),
    }
}

/// The gvfs mount (source `gvfs:...`) `path` is on, from `mountinfo`
/// text: the mount point of the longest matching line.
fn gvfs_mount_of(mountinfo: &str, path: &Path) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = PathBuf::from(fields.get(4)?.replace("\\040", " "));
            let sep = fields.iter().position(|f| *f == "-")?;
            let source = fields.get(sep + 2)?;
            path.starts_with(&point)
                .then_some((point, source.starts_with("gvfs:")))
        })
        .max_by_key(|(point, _)| point.as_os_str().len())
        .and_then(|(point, gvfs)| gvfs.then_some(point))
}

/// The clone's directory: `given` (made if missing, and empty), else a
/// new one under `$XDG_RUNTIME_DIR` (or /tmp) named after the image.
fn work_dir(given: Option<&Path>, image: &Path) -> anyhow::Result<PathBuf> {
    if let Some(dir) = given {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        ensure!(
            std::fs::read_dir(dir)?.next().is_none(),
            "--work {}: not empty (a clone's files go in a directory of their own)",
            dir.display()
        );
        return std::path::absolute(dir).map_err(Into::into);
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let name = image
        .file_name()
        .map_or_else(|| "vm".into(), |n| n.to_string_lossy().into_owned());
    let dir = tempfile::Builder::new()
        .prefix(&format!("gvfs-clone-{name}-"))
        .tempdir_in(&base)
        .with_context(|| format!("making a clone directory in {}", base.display()))?;
    Ok(dir.keep())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_runs_only_a_qemu_system_program_by_name() {
        assert_eq!(
            qemu_program("/usr/bin/qemu-system-x86_64").unwrap(),
            "qemu-system-x86_64"
        );
        assert!(qemu_program("/bin/sh").is_err());
        assert!(qemu_program("qemu-system-x86_64;rm").is_err());
    }

    #[test]
    fn a_path_is_on_the_gvfs_mount_it_is_under() {
        let info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    40 22 0:50 / /mnt/gvfs rw,nosuid - fuse gvfs:nfs://x/export rw\n\
                    41 40 0:51 / /mnt/gvfs/inner rw - tmpfs tmpfs rw\n";
        assert_eq!(
            gvfs_mount_of(info, Path::new("/mnt/gvfs/vm1")),
            Some(PathBuf::from("/mnt/gvfs"))
        );
        assert_eq!(gvfs_mount_of(info, Path::new("/srv/vm1")), None);
        assert_eq!(gvfs_mount_of(info, Path::new("/mnt/gvfs/inner/vm")), None);
    }
}

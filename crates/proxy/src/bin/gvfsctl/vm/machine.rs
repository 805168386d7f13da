//! A golden image's machine (`machine.json`): the QEMU binary and the
//! command line the golden VM ran with, its host-side paths turned into
//! placeholders a clone fills in: `{mem}` for the memory image (the clone
//! adds how it is mapped), `{disk}` for its disk (the clone's overlay) and
//! `{work}` for the directory of the clone's own files (sockets and logs
//! of its character devices, under their own names).
//!
//! Only the options that name host files are rewritten; every other
//! argument is kept as it was, so the clone's devices are the golden's
//! (the device state loads only into the same machine).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};

/// The machine's file in a golden image directory.
pub(super) const MACHINE: &str = "machine.json";
/// The memory image.
pub(super) const MEM: &str = "mem";
/// The device state.
pub(super) const STATE: &str = "state";
/// The disk, when copied.
pub(super) const DISK: &str = "disk.qcow2";

/// The format of `machine.json` this build writes and reads.
const FORMAT: u32 = 1;

/// The largest `machine.json` read.
const MAX_MACHINE_BYTES: u64 = 1 << 20;

/// What a clone needs to start the golden VM's machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Machine {
    /// [`FORMAT`].
    pub(super) format: u32,
    /// The QEMU binary the golden VM ran.
    pub(super) qemu: String,
    /// Its arguments, with the placeholders.
    pub(super) args: Vec<String>,
    /// Guest RAM: the memory backend's size.
    pub(super) ram_bytes: u64,
    /// The disk, when the golden VM had one.
    pub(super) disk: Option<Disk>,
    /// When it was saved (Unix seconds).
    pub(super) saved_at: u64,
}

/// The golden image's disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Disk {
    /// Where it is when it was not copied into the image (`--disk keep`):
    /// clones' overlays sit on this path.
    pub(super) kept: Option<String>,
    /// Its format (`qcow2` when copied).
    pub(super) format: String,
}

/// The golden VM's command line, read: the machine, and the host files
/// it names.
#[derive(Debug)]
pub(super) struct Parsed {
    pub(super) machine: Machine,
    /// The memory backend's file.
    pub(super) mem_path: PathBuf,
    /// Whether it is mapped shared (its writes land in the file).
    pub(super) shared: bool,
    /// The disk's file, when there is one.
    pub(super) disk_path: Option<PathBuf>,
}

/// Options whose value names a character device's host side.
const CHARDEV_OPTIONS: [&str; 5] = ["qmp", "qmp-pretty", "monitor", "serial", "parallel"];

/// Options a clone must not inherit, with a value.
const DROPPED_WITH_VALUE: [&str; 3] = ["incoming", "pidfile", "loadvm"];

/// Options a clone must not inherit, alone.
const DROPPED: [&str; 2] = ["S", "daemonize"];

impl Machine {
    /// Reads the machine of the golden image in `dir`.
    pub(super) fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(MACHINE);
        let file = std::fs::File::open(&path).with_context(|| {
            format!(
                "{}: not a golden image (no {MACHINE}; `gvfsctl vm save` makes one)",
                dir.display()
            )
        })?;
        let len = file.metadata()?.len();
        ensure!(
            len <= MAX_MACHINE_BYTES,
            "{}: {len} bytes, more than a machine description holds",
            path.display()
        );
        let m: Machine = serde_json::from_reader(std::io::BufReader::new(file))
            .with_context(|| format!("reading {}", path.display()))?;
        ensure!(
            m.format == FORMAT,
            "{}: format {}, this gvfsctl reads format {FORMAT}",
            path.display(),
            m.format
        );
        Ok(m)
    }

    /// Writes it into `dir` (whole: a reader never sees part of it).
    pub(super) fn store(&self, dir: &Path) -> anyhow::Result<()> {
        let tmp = dir.join(format!(".{MACHINE}.tmp"));
        std::fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(MACHINE))?;
        Ok(())
    }

    /// The clone's arguments: `mem` mapped as `mapping` (memory-backend
    /// options), the disk `disk`, host files under `work`.
    pub(super) fn clone_args(
        &self,
        mem: &Path,
        mapping: &str,
        disk: &Path,
        work: &Path,
    ) -> anyhow::Result<Vec<String>> {
        let [mem, disk, work] = [mem, disk, work].map(|p| p.display().to_string());
        for p in [&mem, &disk, &work] {
            ensure!(
                !p.contains(','),
                "{p}: QEMU cannot take a path with a comma in its options"
            );
        }
        Ok(self
            .args
            .iter()
            .map(|a| {
                a.replace("mem-path={mem}", &format!("mem-path={mem},{mapping}"))
                    .replace("{disk}", &disk)
                    .replace("{work}", &work)
            })
            .collect())
    }
}

/// The QMP socket a clone's arguments name (`-qmp unix:PATH,...`).
pub(super) fn qmp_socket(args: &[String]) -> Option<PathBuf> {
    args.windows(2)
        .find(|w| option_name(&w[0]) == Some("qmp"))
        .and_then(|w| w[1].strip_prefix("unix:"))
        .map(|v| PathBuf::from(v.split(',').next().unwrap_or(v)))
}

/// `-NAME` or `--NAME` as NAME.
fn option_name(arg: &str) -> Option<&str> {
    let name = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    (!name.is_empty()).then_some(name)
}

/// Reads the golden VM's command line `argv` (without the program), run
/// by `qemu`. `copy_disk`: the disk is copied into the image (as qcow2);
/// else it is kept where it is.
pub(super) fn parse(qemu: &str, argv: &[String], copy_disk: bool) -> anyhow::Result<Parsed> {
    let mut args = Vec::with_capacity(argv.len());
    let mut mem = None;
    let mut disk: Option<(PathBuf, String)> = None;
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        let value = argv.get(i + 1);
        i += 1;
        let Some(name) = option_name(arg) else {
            args.push(arg.clone());
            continue;
        };
        if DROPPED.contains(&name) {
            continue;
        }
        if DROPPED_WITH_VALUE.contains(&name) {
            i += 1;
            continue;
        }
        // A flag (no value) is followed by the next option, or nothing.
        let Some(value) = value.filter(|v| option_name(v).is_none()) else {
            args.push(arg.clone());
            continue;
        };
        let rewritten = match name {
            "object" if value.starts_with("memory-backend-file") => {
                ensure!(mem.is_none(), "more than one memory-backend-file");
                let (v, found) = memory_backend(value)?;
                mem = Some(found);
                v
            }
            "drive"
                if option(value, "file").is_some() && option(value, "media") != Some("cdrom") =>
            {
                ensure!(
                    disk.is_none(),
                    "more than one -drive with a file: gvfsctl vm saves one disk"
                );
                let (v, path, format) = drive(value, copy_disk)?;
                disk = Some((path, format));
                v
            }
            "blockdev" if value.contains("filename") => bail!(
                "a -blockdev disk ({value}): gvfsctl vm saves a disk given with -drive file=PATH"
            ),
            "chardev" => host_paths(value, &["path", "logfile"]),
            n if CHARDEV_OPTIONS.contains(&n) => chardev_backend(value),
            _ => value.clone(),
        };
        args.push(arg.clone());
        args.push(rewritten);
        i += 1;
    }
    let Some((mem_path, shared, ram_bytes)) = mem else {
        bail!(
            "QEMU's RAM is not a file: start the golden VM with -object \
             memory-backend-file,id=ram,size=SIZE,mem-path=FILE,share=on -machine memory-backend=ram"
        );
    };
    let (disk_path, disk) = match disk {
        Some((path, format)) => (
            Some(path.clone()),
            Some(Disk {
                kept: (!copy_disk).then(|| path.display().to_string()),
                format: if copy_disk { "qcow2".into() } else { format },
            }),
        ),
        None => (None, None),
    };
    Ok(Parsed {
        machine: Machine {
            format: FORMAT,
            qemu: qemu.to_string(),
            args,
            ram_bytes,
            disk,
            saved_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        },
        mem_path,
        shared,
        disk_path,
    })
}

/// The value of `key=` in a comma-separated option list.
fn option<'a>(value: &'a str, key: &str) -> Option<&'a str> {
    value
        .split(',')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// A memory-backend-file object without its file and mapping: `mem-path`
/// becomes `{mem}`; returns it with the file, whether it was shared, and
/// its size.
fn memory_backend(value: &str) -> anyhow::Result<(String, (PathBuf, bool, u64))> {
    let path = option(value, "mem-path").context("a memory-backend-file without mem-path")?;
    let shared = option(value, "share").is_some_and(|s| matches!(s, "on" | "yes" | "true"));
    let size = option(value, "size").context("a memory-backend-file without size")?;
    let size = gvfs_proxy::config::parse_size(size)
        .ok()
        .with_context(|| format!("memory-backend-file size {size:?}"))?;
    let kept: Vec<&str> = value
        .split(',')
        .filter(|kv| {
            let key = kv.split('=').next().unwrap_or(kv);
            !matches!(
                key,
                "mem-path" | "share" | "readonly" | "rom" | "prealloc" | "discard-data"
            )
        })
        .collect();
    Ok((
        format!("{},mem-path={{mem}}", kept.join(",")),
        (PathBuf::from(path), shared, size),
    ))
}

/// A -drive with its file as `{disk}` (and format qcow2 when the disk is
/// copied); returns it with the file and its format.
fn drive(value: &str, copy_disk: bool) -> anyhow::Result<(String, PathBuf, String)> {
    let file = option(value, "file").context("a -drive without file")?;
    ensure!(
        !file.contains(':') || file.starts_with('/'),
        "-drive file={file}: gvfsctl vm saves a disk that is a local file"
    );
    let format = option(value, "format").unwrap_or("raw").to_string();
    let parts: Vec<String> = value
        .split(',')
        .map(|kv| {
            if kv.starts_with("file=") {
                "file={disk}".to_string()
            } else if copy_disk && kv.starts_with("format=") {
                "format=qcow2".to_string()
            } else {
                kv.to_string()
            }
        })
        .collect();
    let mut v = parts.join(",");
    if copy_disk && option(value, "format").is_none() {
        v += ",format=qcow2";
    }
    Ok((v, PathBuf::from(file), format))
}

/// A character device backend (`unix:PATH,...`, `file:PATH`) with its
/// path in the clone's work directory.
fn chardev_backend(value: &str) -> String {
    for prefix in ["unix:", "file:", "pipe:"] {
        if let Some(rest) = value.strip_prefix(prefix) {
            let (path, opts) = rest.split_once(',').unwrap_or((rest, ""));
            let mut v = format!("{prefix}{}", in_work(path));
            if !opts.is_empty() {
                v = format!("{v},{opts}");
            }
            return v;
        }
    }
    value.to_string()
}

/// `-chardev` options with the paths of `keys` in the clone's work
/// directory.
fn host_paths(value: &str, keys: &[&str]) -> String {
    value
        .split(',')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if keys.contains(&k) => format!("{k}={}", in_work(v)),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `{work}/NAME` for a host path ending in NAME.
fn in_work(path: &str) -> String {
    let name = Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
    format!("{{work}}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn a_golden_command_line_becomes_a_clone_s() {
        let golden = argv(
            "-machine q35,memory-backend=ram -m 128M -nographic \
             -object memory-backend-file,id=ram,size=128M,mem-path=/srv/g/ram,share=on \
             -drive file=/srv/g/disk.qcow2,format=qcow2,if=virtio,id=disk0 \
             -qmp unix:/tmp/g/qmp.sock,server=on,wait=off \
             -chardev socket,id=req,path=/tmp/g/req.sock,server=on,wait=off \
             -serial file:/tmp/g/serial.log -serial chardev:req -S -incoming defer -daemonize",
        );
        let p = parse("qemu-system-x86_64", &golden, true).unwrap();
        assert_eq!(p.mem_path, PathBuf::from("/srv/g/ram"));
        assert!(p.shared);
        assert_eq!(p.machine.ram_bytes, 128 << 20);
        assert_eq!(p.disk_path, Some(PathBuf::from("/srv/g/disk.qcow2")));
        let a = &p.machine.args;
        assert!(a.contains(&"memory-backend-file,id=ram,size=128M,mem-path={mem}".to_string()));
        assert!(a.contains(&"file={disk},format=qcow2,if=virtio,id=disk0".to_string()));
        assert!(a.contains(&"unix:{work}/qmp.sock,server=on,wait=off".to_string()));
        assert!(a.contains(&"socket,id=req,path={work}/req.sock,server=on,wait=off".to_string()));
        assert!(a.contains(&"file:{work}/serial.log".to_string()));
        for gone in ["-S", "-incoming", "defer", "-daemonize"] {
            assert!(!a.iter().any(|x| x == gone), "{gone} kept: {a:?}");
        }
        let clone = p
            .machine
            .clone_args(
                Path::new("/mnt/gvfs/g/mem"),
                "share=off,readonly=on,rom=off",
                Path::new("/run/c1/disk.qcow2"),
                Path::new("/run/c1"),
            )
            .unwrap();
        assert!(clone.contains(
            &"memory-backend-file,id=ram,size=128M,mem-path=/mnt/gvfs/g/mem,share=off,readonly=on,rom=off"
                .to_string()
        ));
        assert!(clone.contains(&"file:/run/c1/serial.log".to_string()));
        assert_eq!(qmp_socket(&clone), Some(PathBuf::from("/run/c1/qmp.sock")));
    }

    #[test]
    fn a_command_line_that_cannot_be_cloned_says_why() {
        let no_file = parse("q", &argv("-m 1G -nographic"), true).unwrap_err();
        assert!(
            no_file.to_string().contains("memory-backend-file"),
            "{no_file}"
        );
        let blockdev = parse(
            "q",
            &argv("-object memory-backend-file,id=r,size=1G,mem-path=/r,share=on -blockdev driver=file,filename=/d"),
            true,
        )
        .unwrap_err();
        assert!(blockdev.to_string().contains("-drive file="), "{blockdev}");
        let comma = Machine {
            format: FORMAT,
            qemu: "q".into(),
            args: vec![],
            ram_bytes: 0,
            disk: None,
            saved_at: 0,
        }
        .clone_args(Path::new("/a,b"), "", Path::new("/d"), Path::new("/w"));
        assert!(comma.is_err());
    }
}

//! QEMU under the harness: a `qemu-system-x86_64` started for a machine
//! (TCG, RAM from a memory file mapped as [`RamMapping`] says, the disk on
//! virtio, the console to a log and requests on a second serial port),
//! its serial lines read back, and its QMP socket ([`Qmp`]).

use std::fs::File;
use std::io::{Read as _, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::kit::GuestKit;
use super::limits::QMP_TIMEOUT;
use crate::process;
pub use gvfs_proxy::qmp::Qmp;

/// How QEMU maps guest RAM from its memory file
/// (`memory-backend-file`'s options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamMapping {
    /// `share=on`: the file is the guest's RAM, its writes land there (a
    /// golden guest being built, a copy-first clone's own copy).
    Shared,
    /// `share=off,readonly=on,rom=off`: the file (a golden image's) is
    /// opened read-only and mapped private and writable: pages are read
    /// when the guest first touches them and its writes stay in QEMU (a
    /// lazy clone). QEMU 8.2 or later.
    Private,
}

impl RamMapping {
    fn options(self) -> &'static str {
        match self {
            RamMapping::Shared => "share=on",
            RamMapping::Private => "share=off,readonly=on,rom=off",
        }
    }
}

/// What QEMU is started with.
pub(super) struct Machine<'a> {
    pub(super) kit: &'a GuestKit,
    pub(super) ram_mib: u64,
    pub(super) cmdline: &'a str,
    pub(super) mem: &'a Path,
    pub(super) mapping: RamMapping,
    pub(super) disk: &'a Path,
    pub(super) incoming: bool,
}

/// A running `qemu-system-x86_64`, killed on drop.
pub(super) struct Qemu {
    child: Child,
    qmp: PathBuf,
    serial: PathBuf,
    /// The second serial port's socket: requests to the guest.
    requests: PathBuf,
    log: PathBuf,
}

impl Qemu {
    pub(super) fn start(m: &Machine<'_>, dir: &Path) -> Result<Self> {
        let qmp = dir.join("qmp.sock");
        let serial = dir.join("serial.log");
        let requests = dir.join("req.sock");
        let log = dir.join("qemu.log");
        std::fs::remove_file(&qmp).ok();
        std::fs::remove_file(&requests).ok();
        // A lazy clone's QEMU runs under `gvfsctl no-huge-pages`: its
        // huge-page advice on guest RAM would make Linux read the mapped
        // memory image 4 MiB around each first fault.
        let mut cmd = if m.mapping == RamMapping::Private {
            let mut c = Command::new(crate::proxy::gvfsctl_binary()?);
            c.args(["no-huge-pages", "--", "qemu-system-x86_64"]);
            c
        } else {
            Command::new("qemu-system-x86_64")
        };
        cmd.args(["-accel", "tcg", "-machine", "pc,memory-backend=mem"])
            .args(["-m", &format!("{}M", m.ram_mib), "-smp", "1"])
            .args(["-display", "none", "-monitor", "none", "-nodefaults"])
            .args(["-no-user-config", "-no-reboot"])
            .arg("-kernel")
            .arg(&m.kit.kernel)
            .arg("-initrd")
            .arg(&m.kit.initrd)
            .args(["-append", m.cmdline])
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=mem,size={}M,mem-path={},{}",
                m.ram_mib,
                m.mem.display(),
                m.mapping.options()
            ))
            .arg("-drive")
            .arg(format!(
                "file={},format=qcow2,if=virtio,id=disk0",
                m.disk.display()
            ))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .arg("-chardev")
            .arg(format!(
                "socket,id=req,path={},server=on,wait=off",
                requests.display()
            ))
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .args(["-serial", "chardev:req"]);
        if m.incoming {
            cmd.args(["-incoming", "defer"]);
        }
        let out = File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
        Ok(Self {
            child,
            qmp,
            serial,
            requests,
            log,
        })
    }

    /// Its QMP socket's path.
    pub(super) fn qmp_path(&self) -> &Path {
        &self.qmp
    }

    /// Connects to its QMP socket (QEMU creates it as it starts).
    pub(super) fn qmp(&mut self) -> Result<Qmp> {
        let path = self.qmp.clone();
        Qmp::connect_within(&path, QMP_TIMEOUT, || self.check_alive())
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("QEMU exited ({status}): {}", self.log_text());
        }
        Ok(())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Complete `WORD A MD5` lines printed so far, as (A, MD5).
    fn lines_of(&self, word: &str) -> Vec<(String, String)> {
        let text = std::fs::read(&self.serial).unwrap_or_default();
        serial_lines(&String::from_utf8_lossy(&text), word)
    }

    /// Complete `tick N MD5` lines printed so far.
    pub(super) fn ticks(&self) -> Result<Vec<(u64, String)>> {
        Ok(self
            .lines_of("tick")
            .into_iter()
            .filter_map(|(n, sum)| Some((n.parse().ok()?, sum)))
            .collect())
    }

    /// Sends request `id` (no spaces) to the guest on its second serial
    /// port and waits for its `answer ID MD5` line; returns MD5.
    pub(super) fn request(&mut self, id: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut port = UnixStream::connect(&self.requests)
            .with_context(|| format!("connecting to {}", self.requests.display()))?;
        port.write_all(format!("{id}\n").as_bytes())
            .context("writing a request to the guest")?;
        loop {
            if let Some((_, sum)) = self.lines_of("answer").into_iter().find(|a| a.0 == id) {
                return Ok(sum);
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                let serial = std::fs::read(&self.serial).unwrap_or_default();
                bail!(
                    "the guest did not answer request {id} within {timeout:?}; serial:\n{}\nQEMU:\n{}",
                    String::from_utf8_lossy(&serial),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for a tick line whose number satisfies `pred`; returns it.
    pub(super) fn wait_for_tick(
        &mut self,
        pred: impl Fn(u64) -> bool,
        timeout: Duration,
    ) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = self.ticks()?.into_iter().find(|t| pred(t.0)) {
                return Ok(t.0);
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                let serial = std::fs::read(&self.serial).unwrap_or_default();
                bail!(
                    "the guest did not tick on within {timeout:?}; serial:\n{}\nQEMU:\n{}",
                    String::from_utf8_lossy(&serial),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(super) fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        if process::wait_timeout(&mut self.child, timeout)?.is_none() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
        Ok(())
    }
}

/// The complete `tick N MD5` lines of the serial log at `path` from byte
/// `offset` on, and the offset after the last complete line (a line still
/// being written is read next time).
pub fn serial_ticks(path: &Path, offset: u64) -> (Vec<(u64, String)>, u64) {
    use std::io::{Seek, SeekFrom};
    let mut text = Vec::new();
    let read = File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        f.read_to_end(&mut text)
    });
    if read.is_err() {
        return (Vec::new(), offset);
    }
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let ticks = serial_lines(&String::from_utf8_lossy(&text[..complete]), "tick")
        .into_iter()
        .filter_map(|(n, sum)| Some((n.parse().ok()?, sum)))
        .collect();
    (ticks, offset + complete as u64)
}

/// The complete lines of `text` (a serial log) that are `WORD A MD5`, as
/// (A, MD5); the part after the last newline is not complete.
fn serial_lines(text: &str, word: &str) -> Vec<(String, String)> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop();
    lines
        .into_iter()
        .filter_map(|l| {
            let mut w = l.trim_end_matches('\r').split(' ');
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some(first), Some(a), Some(sum), None) if first == word && sum.len() == 32 => {
                    Some((a.to_owned(), sum.to_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_lines_are_complete_three_word_lines() {
        let log = "tick 41 0123456789abcdef0123456789abcdef\r\n\
                   answer r7 fedcba9876543210fedcba9876543210\r\n\
                   gvfs-guest ready runs=8\n\
                   tick 42 0123456789abcdef0123456789abcdef extra\n\
                   answer r8 fedcba98765432";
        assert_eq!(
            serial_lines(log, "tick"),
            [(
                "41".to_owned(),
                "0123456789abcdef0123456789abcdef".to_owned()
            )]
        );
        assert_eq!(
            serial_lines(log, "answer"),
            [(
                "r7".to_owned(),
                "fedcba9876543210fedcba9876543210".to_owned()
            )]
        );
    }
}

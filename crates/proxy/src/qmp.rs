//! A QMP client: QEMU's JSON monitor on a Unix socket, one command per
//! line, events skipped (`gvfsctl vm`, and the clone harness). Every read and write has a timeout, and a reply
//! line is read at most 1 MiB long.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

/// How long one command may take to be answered.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest reply line read.
const MAX_LINE: u64 = 1 << 20;

/// A QMP connection in command mode.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to the QMP socket at `path` and enters command mode.
    pub fn connect(path: &Path) -> anyhow::Result<Self> {
        let stream = UnixStream::connect(path)
            .with_context(|| format!("connecting to QEMU's QMP socket {}", path.display()))?;
        Self::handshake(stream)
    }

    /// Connects to `path` once QEMU has made it, within `within`;
    /// `alive` says whether QEMU still runs.
    pub fn connect_within(
        path: &Path,
        within: Duration,
        mut alive: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(s) = UnixStream::connect(path) {
                return Self::handshake(s);
            }
            alive()?;
            ensure!(
                Instant::now() < deadline,
                "QEMU made no QMP socket at {} within {within:?}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Reads QEMU's greeting on `stream` (a connected QMP socket) and
    /// enters command mode.
    pub fn handshake(stream: UnixStream) -> anyhow::Result<Self> {
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let writer = stream.try_clone()?;
        let mut qmp = Self {
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read_message()?;
        ensure!(
            greeting.get("QMP").is_some(),
            "not a QMP greeting: {greeting}"
        );
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// The pid of the process on the other end (QEMU).
    pub fn peer_pid(&self) -> anyhow::Result<i32> {
        let cred = rustix::net::sockopt::socket_peercred(&self.writer)
            .context("asking the QMP socket for QEMU's pid")?;
        Ok(cred.pid.as_raw_nonzero().get())
    }

    fn read_message(&mut self) -> anyhow::Result<Value> {
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(MAX_LINE)
            .read_line(&mut line)
            .context("reading from QMP")?;
        ensure!(n > 0, "QEMU closed its QMP socket");
        serde_json::from_str(&line).with_context(|| format!("QMP sent {line:?}"))
    }

    /// Runs `command`; returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> anyhow::Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        writeln!(self.writer, "{msg}").context("writing to QMP")?;
        loop {
            let reply = self.read_message()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                bail!("QMP {command}: {e}");
            }
        }
    }

    /// Leaves shared RAM (the memory file) out of migration streams.
    pub fn ignore_shared(&mut self) -> anyhow::Result<()> {
        self.execute(
            "migrate-set-capabilities",
            Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]})),
        )?;
        Ok(())
    }

    /// Waits (at most `within`) until the migration under way completes.
    pub fn wait_migration(&mut self, what: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let r = self.execute("query-migrate", None)?;
            match r["status"].as_str() {
                Some("completed") => return Ok(()),
                Some("failed" | "cancelled") => bail!("{what} failed: {r}"),
                _ => {}
            }
            ensure!(
                Instant::now() < deadline,
                "{what} did not complete in {within:?}: {r}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `exec:` migration URI text for `cmd PATH`, the path quoted for the
/// shell QEMU runs it with.
pub fn exec_uri(cmd: &str, path: &Path) -> anyhow::Result<String> {
    let p = path.display().to_string();
    ensure!(
        !p.contains('\''),
        "{p}: a path with a quote cannot be given to QEMU"
    );
    Ok(format!("exec:{cmd} '{p}'"))
}

//! libnfs-utils (`nfs-cp`, `nfs-cat`, `nfs-ls`) and `qemu-img` as real NFS
//! clients for tests.
//!
//! Each wrapper runs the tool with a timeout ([`TOOL_TIMEOUT`]; the child is
//! killed after it) and turns a failure into an error that quotes stderr.
//!
//! URL rules of libnfs 4.0 (see [`nfs_url`]):
//! - `?version=3&nfsport=N&mountport=M`: with both ports given no
//!   portmapper is asked; without them libnfs asks HOST:111.
//! - For a file URL, everything up to the last `/` is the path that is
//!   mounted and the rest is the file, so an export named `/` needs a
//!   double slash (`nfs://127.0.0.2//file`).
//! - `nfs-cp` refuses to overwrite an existing file (exclusive create,
//!   NFS3ERR_EXIST).
//!
//! - `nfs-ls` prints no `.` and `..`, even though ganesha sends them.
//! - A missing file gives exit status 10 and `NFS3ERR_NOENT` on stderr.
//!
//! QEMU's NFS URLs (`qemu-img ... nfs://HOST/export/file`) accept no ports:
//! QEMU (through libnfs) connects to HOST:111 over TCP and asks PORTMAP v2
//! GETPORT for MOUNT v3 and NFS v3 on every open. Against a single
//! [`Ganesha`](crate::Ganesha) on 127.0.0.1 that just works, since ganesha
//! registers with our [`Portmapper`](crate::Portmapper).

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process;

/// Longest any one tool run may take before it is killed.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// A libnfs URL for `path` inside `export` on `host`, with explicit ports:
/// `nfs://HOST/EXPORT/PATH?version=3&nfsport=PORT&mountport=MOUNT_PORT`.
///
/// `export` starts with `/`; an export named `/` gives `nfs://HOST//PATH`,
/// which libnfs needs to mount `/`. An empty `path` names the export's root
/// (for `nfs-ls`). IPv6 hosts are bracketed.
pub fn nfs_url(host: IpAddr, port: u16, mount_port: u16, export: &str, path: &str) -> String {
    let host = match host {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    let export = format!("/{}", export.trim_start_matches('/'));
    let path = path.trim_start_matches('/');
    let location = match (export.as_str(), path.is_empty()) {
        ("/", true) => "/".to_owned(),
        (_, true) => export,
        ("/", false) => format!("//{path}"),
        (_, false) => format!("{}/{path}", export.trim_end_matches('/')),
    };
    format!("nfs://{host}{location}?version=3&nfsport={port}&mountport={mount_port}")
}

/// `nfs-cp SRC DST`: each side a local path or an `nfs://` URL.
pub fn nfs_cp(src: &str, dst: &str) -> Result<()> {
    process::run_ok(Command::new("nfs-cp").arg(src).arg(dst), TOOL_TIMEOUT)
        .context("nfs-cp (apt-get install libnfs-utils)")?;
    Ok(())
}

/// `nfs-cat URL`: the whole file.
pub fn nfs_cat(url: &str) -> Result<Vec<u8>> {
    let out = process::run_ok(Command::new("nfs-cat").arg(url), TOOL_TIMEOUT)
        .context("nfs-cat (apt-get install libnfs-utils)")?;
    Ok(out.stdout)
}

/// `nfs-ls URL`: the listing as printed.
///
/// Lines look like `-rw-r--r--  1     0     0          5242880 name`
/// (mode, nlink, uid, gid, size, name); see [`parse_ls`].
pub fn nfs_ls(url: &str) -> Result<String> {
    let out = process::run_ok(Command::new("nfs-ls").arg(url), TOOL_TIMEOUT)
        .context("nfs-ls (apt-get install libnfs-utils)")?;
    Ok(out.stdout_text())
}

/// `nfs-ls URL` parsed into entries.
pub fn nfs_ls_entries(url: &str) -> Result<Vec<LsEntry>> {
    Ok(parse_ls(&nfs_ls(url)?))
}

/// The names `nfs-ls URL` lists, in its order (`.` and `..` included when
/// the server returns them).
pub fn nfs_ls_names(url: &str) -> Result<Vec<String>> {
    Ok(nfs_ls_entries(url)?.into_iter().map(|e| e.name).collect())
}

/// One line of `nfs-ls` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LsEntry {
    /// `ls -l` style mode string, e.g. `-rw-r--r--` or `drwxr-xr-x`.
    pub mode: String,
    /// Size in bytes.
    pub size: u64,
    /// Name (may contain spaces).
    pub name: String,
}

impl LsEntry {
    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.mode.starts_with('d')
    }
}

/// Parses `nfs-ls` output; lines that do not have the expected six fields
/// are skipped.
pub fn parse_ls(text: &str) -> Vec<LsEntry> {
    text.lines()
        .filter_map(|line| {
            let mut rest = line.trim_start();
            let mut fields = Vec::with_capacity(5);
            for _ in 0..5 {
                let end = rest.find(char::is_whitespace)?;
                fields.push(&rest[..end]);
                rest = rest[end..].trim_start();
            }
            if rest.is_empty() {
                return None;
            }
            Some(LsEntry {
                mode: fields[0].to_owned(),
                size: fields[4].parse().ok()?,
                name: rest.to_owned(),
            })
        })
        .collect()
}

/// `qemu-img ARGS...`; returns stdout.
pub fn qemu_img(args: &[&str]) -> Result<String> {
    let out = process::run_ok(Command::new("qemu-img").args(args), TOOL_TIMEOUT)
        .context("qemu-img (apt-get install qemu-utils qemu-block-extra)")?;
    Ok(out.stdout_text())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn urls() {
        let h = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let q = "?version=3&nfsport=2049&mountport=20048";
        assert_eq!(
            nfs_url(h, 2049, 20048, "/export", "f"),
            format!("nfs://127.0.0.1/export/f{q}")
        );
        assert_eq!(
            nfs_url(h, 2049, 20048, "/export", "/a/b"),
            format!("nfs://127.0.0.1/export/a/b{q}")
        );
        assert_eq!(
            nfs_url(h, 2049, 20048, "/export", ""),
            format!("nfs://127.0.0.1/export{q}")
        );
        assert_eq!(
            nfs_url(h, 2049, 20048, "/", "f"),
            format!("nfs://127.0.0.1//f{q}")
        );
        assert_eq!(
            nfs_url(h, 2049, 20048, "/", ""),
            format!("nfs://127.0.0.1/{q}")
        );
        let h6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        assert_eq!(
            nfs_url(h6, 2049, 20048, "/x", "f"),
            format!("nfs://[::1]/x/f{q}")
        );
    }

    #[test]
    fn ls_lines() {
        let text = "-rw-r--r--  1     0     0          5242880 big file\n\
                    drwxr-xr-x  2     0     0             4096 dir\nnoise\n";
        let e = parse_ls(text);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "big file");
        assert_eq!(e[0].size, 5_242_880);
        assert!(!e[0].is_dir());
        assert!(e[1].is_dir());
    }
}

/// A real NFS client that copies whole files, for benchmarks: the two ways a
/// user moves an image, one call at a time or several in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyClient {
    /// libnfs' `nfs-cp`: one 1 MiB call in flight at a time.
    NfsCp,
    /// `qemu-img convert -W -m 8`: QEMU's block layer over libnfs with
    /// several requests in flight, the way a VMM reads and writes images.
    /// Its `nfs://` URLs take no port (see the module docs).
    Qemu,
}

impl CopyClient {
    /// The client as tables name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::NfsCp => "nfs-cp",
            Self::Qemu => "qemu-img convert -W -m 8",
        }
    }

    /// Parses `nfs-cp` or `qemu` (`qemu-img`).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim() {
            "nfs-cp" => Ok(Self::NfsCp),
            "qemu" | "qemu-img" => Ok(Self::Qemu),
            other => anyhow::bail!("unknown client {other:?} (nfs-cp, qemu)"),
        }
    }

    /// Copies `from` to `to` (each a local path or this client's URL),
    /// killed after `timeout`.
    pub fn copy(self, from: &str, to: &str, timeout: Duration) -> Result<()> {
        let mut cmd = match self {
            Self::NfsCp => {
                let mut c = Command::new("nfs-cp");
                c.args([from, to]);
                c
            }
            Self::Qemu => {
                let mut c = Command::new("qemu-img");
                c.args([
                    "convert", "-f", "raw", "-O", "raw", "-W", "-m", "8", from, to,
                ]);
                c
            }
        };
        process::run_ok(&mut cmd, timeout).with_context(|| {
            format!(
                "{} (apt-get install libnfs-utils qemu-utils qemu-block-extra)",
                self.label()
            )
        })?;
        Ok(())
    }
}

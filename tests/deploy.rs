//! The files an operator installs, in examples/deploy/: every TOML config
//! passes `gvfs-proxy --config FILE --check` with the current binary and
//! describes its role's stack; broken ones fail with exit status 2 and
//! the reason; every systemd unit starts its role's config, checked
//! first, as `Type=notify`; and gvfs-proxy does send systemd `READY=1`
//! once it serves and `STOPPING=1` when it stops. (prometheus.yml's
//! metrics are checked against a running site in tests/examples.rs.)

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::process::{self, Output};
use gvfs_testbed::proxy::{Proxy, ProxyArgs, proxy_binary};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/deploy")
}

/// The files in examples/deploy/ whose names end in `ext`, sorted.
fn files(ext: &str) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(deploy_dir())?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    out.retain(|p| p.extension().is_some_and(|e| e == ext));
    out.sort();
    Ok(out)
}

fn check(config: &Path) -> Result<Output> {
    process::run(
        Command::new(proxy_binary()?)
            .arg("--config")
            .arg(config)
            .arg("--check"),
        Duration::from_secs(30),
    )
}

#[test]
fn every_example_config_passes_check_with_its_roles_stack() -> Result<()> {
    let configs = files("toml")?;
    let names: Vec<String> = configs
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    ensure!(
        names == ["image-server.toml", "lan-proxy.toml", "node.toml"],
        "examples/deploy/ has {names:?}"
    );
    for config in &configs {
        let out = check(config)?;
        let text = out.stdout_text();
        ensure!(
            out.status.success() && text.contains("configuration OK"),
            "{}: {}\n{text}{}",
            config.display(),
            out.status,
            out.stderr_text()
        );
        let role = config.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        // What each role is: the image server has no cache and takes TLS
        // peers; the LAN proxy caches and takes them; a node caches and
        // takes none.
        let (cache, peers) = match role {
            "image-server" => (false, true),
            "lan-proxy" => (true, true),
            _ => (true, false),
        };
        ensure!(
            text.contains("  block cache ") == cache
                && text.contains("gvfs:// peers on ") == peers
                && text.contains("  metadata layer ")
                && text.contains("  metrics          http://127.0.0.1:"),
            "{role}'s stack:\n{text}"
        );
    }
    Ok(())
}

#[test]
fn a_broken_config_fails_check_with_exit_status_2_and_the_reason() -> Result<()> {
    let node = std::fs::read_to_string(deploy_dir().join("node.toml"))?;
    let dir = tempfile::tempdir()?;
    for (broken, says) in [
        (
            format!("{node}\ncache_sise = \"1G\"\n"),
            "unknown field `cache_sise`",
        ),
        (
            node.replace("cache_size = \"8G\"", "cache_size = \"8 gigs\""),
            "bad size \"8 gigs\"",
        ),
        (
            node.replace("cache_dir = ", "# cache_dir = "),
            "(cache_size in the file) is set but there is no cache",
        ),
        (
            node.replace("listen = \"127.0.0.2:111\"", "listen = \"10.0.0.2:111\""),
            "refusing to listen on 10.0.0.2:111",
        ),
        (format!("{node}\n[peers\n"), "bad config file"),
    ] {
        ensure!(broken != node, "nothing was broken for {says:?}");
        let path = dir.path().join("node.toml");
        std::fs::write(&path, &broken)?;
        let out = check(&path)?;
        let err = out.stderr_text();
        ensure!(
            out.status.code() == Some(2)
                && err.contains(says)
                && err.starts_with("gvfs-proxy: error: ")
                && !out.stdout_text().contains("configuration OK"),
            "expected exit 2 and {says:?}, got {}: {err}{}",
            out.status,
            out.stdout_text()
        );
    }
    Ok(())
}

#[test]
fn every_unit_starts_its_roles_checked_config_as_type_notify() -> Result<()> {
    let units = files("service")?;
    ensure!(units.len() == 3, "units: {units:?}");
    for unit in &units {
        let text = std::fs::read_to_string(unit)?;
        let settings: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .collect();
        let value = |key: &str| {
            settings
                .iter()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .with_context(|| format!("{} has no {key}=", unit.display()))
        };
        let start = value("ExecStart")?;
        let config = start
            .split_once("--config ")
            .map(|(_, c)| c.trim())
            .with_context(|| format!("{}: ExecStart has no --config", unit.display()))?;
        let name = Path::new(config)
            .file_name()
            .context("a config file name")?;
        ensure!(
            deploy_dir().join(name).is_file(),
            "{} starts {config}, which examples/deploy/ does not have",
            unit.display()
        );
        ensure!(
            value("ExecStartPre")? == format!("{start} --check")
                && value("Type")? == "notify"
                && value("Restart")? == "on-failure"
                && value("RestartPreventExitStatus")? == "2",
            "{}: {settings:?}",
            unit.display()
        );
        // gvfs-proxy has no reload: a unit that claimed one would lie.
        ensure!(
            value("ExecReload").is_err(),
            "{} has an ExecReload",
            unit.display()
        );
        // A node's FUSE mount outlives the proxy: systemd's fd store holds
        // its connection (across a stop too), and without the store a
        // keeper, which a stop must not kill.
        if unit.file_name().is_some_and(|n| n == "gvfs-node.service") {
            ensure!(
                value("FileDescriptorStoreMax")?.parse::<u32>()? > 0
                    && value("FileDescriptorStorePreserve")? == "yes"
                    && value("KillMode")? == "process",
                "{}: {settings:?}",
                unit.display()
            );
        }
    }
    Ok(())
}

#[test]
fn gvfs_proxy_tells_systemd_when_it_is_ready_and_when_it_stops() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let origin = dir.path().join("origin");
    std::fs::create_dir(&origin)?;
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path)?;
    socket.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut proxy = Proxy::spawn(
        ProxyArgs::dir(&origin).env("NOTIFY_SOCKET", socket_path.display().to_string()),
    )?;
    let next = || -> Result<String> {
        let mut buf = [0u8; 4096];
        let n = socket
            .recv(&mut buf)
            .context("no message on the notify socket")?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let ready = next()?;
    ensure!(
        ready.starts_with("READY=1\n") && ready.contains("STATUS=serving "),
        "first message: {ready:?}"
    );
    let status = proxy.terminate()?;
    ensure!(status.success(), "{status}");
    let stopping = next()?;
    ensure!(
        stopping.trim_end() == "STOPPING=1",
        "after SIGTERM: {stopping:?}"
    );
    Ok(())
}

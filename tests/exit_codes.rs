//! `gvfs-proxy`'s exit codes (`gvfs_proxy::exit::ExitCode`): a supervisor
//! tells a configuration to fix from an upstream to wait for, and from a
//! local resource in the way, by the code alone. Only 127.0.0.1 is dialled.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_proxy::exit::ExitCode;
use gvfs_testbed::proxy::{proxy_binary, unreachable_upstream_args};

/// Runs gvfs-proxy with `args` (its control socket in `dir`) and checks
/// that it exits at once with `want`.
fn exits_with(dir: &Path, args: &[&str], want: ExitCode) -> Result<()> {
    let mut cmd = Command::new(proxy_binary()?);
    cmd.arg("--control").arg(dir.join("ctl.sock")).args(args);
    let out = gvfs_testbed::process::run(&mut cmd, Duration::from_secs(30))?;
    let code = out.status.code().context("killed by a signal")?;
    ensure!(
        code == i32::from(want.code()),
        "gvfs-proxy {args:?} exited {code}, not {} ({want:?}); stderr: {}",
        want.code(),
        out.stderr_text()
    );
    Ok(())
}

#[test]
fn a_bad_config_file_exits_2() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "listen = 5\n")?;
    exits_with(
        dir.path(),
        &["--config", &cfg.display().to_string()],
        ExitCode::Config,
    )?;
    // A value the file parses but validation refuses, likewise.
    std::fs::write(&cfg, "listen = \"not-an-address\"\n")?;
    exits_with(
        dir.path(),
        &["--config", &cfg.display().to_string()],
        ExitCode::Config,
    )
}

#[test]
fn an_unreachable_upstream_exits_3() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let unreachable = unreachable_upstream_args()?;
    let args: Vec<&str> = unreachable.iter().map(String::as_str).collect();
    exits_with(dir.path(), &args, ExitCode::Upstream)
}

#[test]
fn a_listen_address_in_use_exits_4() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    exits_with(
        dir.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &format!("dir:{}", dir.path().display()),
        ],
        ExitCode::LocalResource,
    )
}

#[test]
fn help_lists_the_exit_codes() -> Result<()> {
    let out = gvfs_testbed::process::run(
        Command::new(proxy_binary()?).arg("--help"),
        Duration::from_secs(30),
    )?;
    let help = out.stdout_text();
    ensure!(out.status.success(), "--help failed: {}", out.stderr_text());
    for c in ExitCode::ALL {
        let line = format!("  {}  {}", c.code(), c.meaning());
        ensure!(help.contains(&line), "--help lacks {line:?}:\n{help}");
    }
    Ok(())
}

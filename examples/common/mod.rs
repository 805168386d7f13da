//! What the examples share: the `gvfs-proxy` and `gvfsctl` binaries they
//! run, and stopping on Ctrl-C.
//!
//! `cargo run --example NAME` builds the example, not the binaries of the
//! `gvfs-proxy` package, which it runs through the test harness
//! (`gvfs_testbed::proxy`, which looks for them beside the example, in
//! `target/<profile>/`). So an example first runs `cargo build
//! --workspace --bins` in the same profile, as CI and the guide do (a
//! no-op when they are up to date; building only `-p gvfs-proxy` would
//! unify features differently and rebuild them each time). `GVFS_EXAMPLE_BUILD=0` skips that and uses the binaries already
//! there (the tests do: CI builds them first).

// Each example uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Builds `gvfs-proxy` and `gvfsctl` for the profile this example was
/// built in, unless `GVFS_EXAMPLE_BUILD=0`.
pub(crate) fn build_binaries() -> Result<()> {
    if std::env::var("GVFS_EXAMPLE_BUILD").as_deref() == Ok("0") {
        gvfs_testbed::proxy::gvfsctl_binary()?;
        return Ok(());
    }
    let exe = std::env::current_exe().context("locating this example")?;
    // target/<profile dir>/examples/NAME
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .context("this example is not in target/<profile>/examples/")?;
    let profile = match profile_dir {
        "debug" => "dev",
        other => other,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    eprintln!(
        "building gvfs-proxy and gvfsctl: cargo build --workspace --bins --profile {profile}"
    );
    let status = Command::new(&cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["--workspace", "--bins", "--profile", profile])
        .status()
        .with_context(|| format!("running {}", Path::new(&cargo).display()))?;
    if !status.success() {
        bail!("cargo build --workspace --bins failed ({status})");
    }
    // Fails, saying what to do, when they landed elsewhere (a --target
    // build, another target directory).
    gvfs_testbed::proxy::gvfsctl_binary()?;
    Ok(())
}

/// Set once SIGINT (Ctrl-C) or SIGTERM arrived.
static STOP: AtomicBool = AtomicBool::new(false);

/// From now on SIGINT and SIGTERM no longer kill this process: they set a
/// flag that [`stop_requested`] and [`wait_for_stop`] read, so the example
/// can stop its proxies itself.
pub(crate) fn catch_stop_signals() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("a runtime for the signal handlers")?;
    // Made here, so the handlers are in place when this returns.
    let (mut int, mut term) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    std::thread::spawn(move || {
        rt.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        STOP.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// Fails with "interrupted" once a stop signal arrived.
pub(crate) fn stop_requested() -> Result<()> {
    if STOP.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Returns once a stop signal arrives.
pub(crate) fn wait_for_stop() {
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

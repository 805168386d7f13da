//! Running the proxy the way a person does: the README's first command (no
//! arguments: the sample directory on 127.0.0.1:2049), `gvfsctl` over the
//! control socket, and a graceful stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::libnfs::{nfs_cat, nfs_ls_names};
use gvfs_testbed::proxy::{gvfsctl, proxy_binary};
use gvfs_testbed::{Proxy, ProxyArgs};

#[test]
fn with_no_arguments_the_proxy_serves_the_sample_and_says_how_to_use_it() -> Result<()> {
    let cwd = tempfile::tempdir()?;
    let control = cwd.path().join("ctl.sock");
    let mut child = Command::new(proxy_binary()?)
        .current_dir(cwd.path())
        .args(["--control", &control.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut printed = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        let done = line.starts_with("Stop with");
        printed.push(line);
        if done {
            break;
        }
    }
    let text = printed.join("\n");
    let result = (|| -> Result<()> {
        ensure!(
            text.contains("listening on 127.0.0.1:2049"),
            "banner: {text}"
        );
        ensure!(
            text.contains(
                "mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,nolock 127.0.0.1:/export"
            ),
            "banner: {text}"
        );
        let ls_line = text
            .lines()
            .find(|l| l.contains("nfs-ls '"))
            .context("no nfs-ls line")?;
        let url = ls_line
            .split('\'')
            .nth(1)
            .context("no URL in the nfs-ls line")?;
        let mut names = nfs_ls_names(url)?;
        names.sort();
        ensure!(
            names == ["README.txt", "images"],
            "sample listing: {names:?}"
        );
        let readme =
            nfs_cat("nfs://127.0.0.1/export/README.txt?version=3&nfsport=2049&mountport=2049")?;
        ensure!(readme.starts_with(b"This directory is served by gvfs-proxy"));
        ensure!(cwd.path().join("gvfs-sample/images/sample.img").is_file());
        let out = gvfsctl(&control, &["status"])?;
        ensure!(
            out.status.success(),
            "gvfsctl status: {}",
            out.stderr_text()
        );
        let status = out.stdout_text();
        ensure!(
            status.contains("export /export") && status.contains("gvfs-sample"),
            "gvfsctl status: {status}"
        );
        ensure!(
            status.contains("READDIRPLUS") || status.contains("READDIR"),
            "no calls counted: {status}"
        );
        Ok(())
    })();
    sigterm(child.id());
    let exit = gvfs_testbed::process::wait_timeout(&mut child, Duration::from_secs(15))?;
    if exit.is_none() {
        let _ = child.kill();
    }
    result?;
    ensure!(exit.is_some_and(|s| s.success()), "SIGTERM exit: {exit:?}");
    ensure!(!control.exists(), "the control socket was left behind");
    Ok(())
}

fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
}

#[test]
fn gvfsctl_reports_counters_and_clear_errors() -> Result<()> {
    let origin = tempfile::tempdir()?;
    std::fs::write(origin.path().join("f"), b"0123456789")?;
    let mut p = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    ensure!(nfs_cat(&p.url("f"))? == b"0123456789");
    let st = p.status()?;
    ensure!(st.front.read_bytes == 10, "status: {st:?}");
    ensure!(
        st.nfs_calls.get("READ").copied().unwrap_or(0) >= 1,
        "status: {st:?}"
    );
    ensure!(st.front.mount_calls >= 1, "status: {st:?}");
    ensure!(st.upstream.starts_with("dir:"), "status: {st:?}");
    ensure!(st.connections.counts.accepted >= 1, "status: {st:?}");
    // A socket nobody listens on: a one-line error and a non-zero exit.
    let out = gvfsctl(&origin.path().join("nope.sock"), &["status"])?;
    ensure!(!out.status.success());
    ensure!(
        out.stderr_text().contains("cannot reach a proxy"),
        "stderr: {}",
        out.stderr_text()
    );
    // SIGTERM: exits 0 and removes its control socket.
    let control = p.control_path().to_path_buf();
    let status = p.terminate()?;
    ensure!(status.success(), "exit status {status:?}");
    ensure!(!control.exists(), "control socket left behind");
    Ok(())
}

#[test]
fn a_second_proxy_refuses_a_control_socket_in_use() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let sock = origin.path().join("shared.sock");
    let _first = Proxy::spawn(ProxyArgs::dir(origin.path()).control(&sock))?;
    let second = Proxy::spawn(ProxyArgs::dir(origin.path()).control(&sock));
    let err = format!("{:#}", second.err().context("the second proxy started")?);
    ensure!(err.contains("in use by another running proxy"), "{err}");
    Ok(())
}

/// `gvfsctl learned` asks a proxy to end its learnings of working sets: a
/// proxy with no file cache says it has none, and an unknown command's
/// error lists `learned` among those it knows.
#[test]
fn learned_without_a_file_cache_is_refused() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    for args in [&["learned"][..], &["learned", "mem", "--wait"]] {
        let out = gvfsctl(p.control_path(), args)?;
        ensure!(!out.status.success(), "gvfsctl {args:?} succeeded");
        ensure!(
            out.stderr_text()
                .contains("this proxy holds no whole files (start it with --cache-dir"),
            "gvfsctl {args:?}: {}",
            out.stderr_text()
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let err = rt
        .block_on(gvfs_proxy::control::request(
            p.control_path(),
            &serde_json::json!({ "cmd": "learn" }),
        ))
        .err()
        .context("an unknown command was answered")?
        .to_string();
    ensure!(err.contains("held_blocks, learned"), "{err}");
    Ok(())
}

#[test]
fn a_log_written_to_a_pipe_carries_no_colour_codes() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::dir(origin.path()).env("RUST_LOG", "info"))?;
    let log = p.output();
    ensure!(log.contains("serving"), "no log line: {log}");
    ensure!(!log.contains('\u{1b}'), "escape codes in the log: {log:?}");
    Ok(())
}

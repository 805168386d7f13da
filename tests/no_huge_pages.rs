//! `gvfsctl no-huge-pages -- COMMAND`: COMMAND's `madvise(MADV_HUGEPAGE)`
//! succeeds and does nothing (its mapping is not flagged for huge pages,
//! so Linux does not read a mapped file 4 MiB around each first fault),
//! other advice still works, and COMMAND's exit status is gvfsctl's.
//!
//! COMMAND is this test executable itself, running [`probe`].

use std::process::Command;

use anyhow::{Context, Result, ensure};

const PROBE: &str = "GVFS_MADVISE_PROBE";

/// Not a test on its own: run as a child by the test below (with `PROBE`
/// set), it maps a file privately, advises huge pages and random access,
/// and writes what madvise returned and the mapping's flags in smaps to
/// the file `PROBE` names.
#[test]
fn probe() {
    let Some(report) = std::env::var_os(PROBE) else {
        return;
    };
    let len = 4usize << 20;
    let file = tempfile::tempfile().expect("a file");
    file.set_len(len as u64).expect("its size");
    use std::os::fd::AsRawFd;
    // SAFETY: a new private mapping of a file of `len` bytes, unmapped
    // below and never touched.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mmap");
    // SAFETY: advice on the mapping just made.
    let huge = unsafe { libc::madvise(addr, len, libc::MADV_HUGEPAGE) };
    // SAFETY: as above.
    let random = unsafe { libc::madvise(addr, len, libc::MADV_RANDOM) };
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let start = format!("{:x}-", addr as usize);
    let flags = smaps
        .split_inclusive('\n')
        .skip_while(|l| !l.starts_with(&start))
        .find_map(|l| l.strip_prefix("VmFlags:"))
        .expect("the mapping's VmFlags")
        .split_whitespace()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    let line = format!(
        "PROBE madvise_huge={huge} madvise_random={random} hg={} rr={}",
        flags.iter().any(|f| f == "hg"),
        flags.iter().any(|f| f == "rr")
    );
    std::fs::write(report, line).expect("the report");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(addr, len) };
    std::process::exit(7);
}

/// Runs [`probe`] in a child, under `gvfsctl no-huge-pages` or not; its
/// report and exit status.
fn run_probe(filtered: bool) -> Result<(String, Option<i32>)> {
    let me = std::env::current_exe()?;
    let mut cmd = if filtered {
        let mut c = Command::new(gvfs_testbed::proxy::gvfsctl_binary()?);
        c.args(["no-huge-pages", "--"]).arg(&me);
        c
    } else {
        Command::new(&me)
    };
    let dir = tempfile::tempdir()?;
    let report = dir.path().join("probe");
    let out = cmd
        .args(["--exact", "probe", "--test-threads=1"])
        .env(PROBE, &report)
        .output()
        .context("running the probe")?;
    let line = std::fs::read_to_string(&report).with_context(|| {
        format!(
            "no report from the probe ({:?}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((line.to_owned(), out.status.code()))
}

#[test]
fn huge_page_advice_is_a_no_op_under_gvfsctl_no_huge_pages() -> Result<()> {
    let (plain, _) = run_probe(false)?;
    if !plain.contains("madvise_huge=0 ") {
        eprintln!("skipping: this kernel refuses MADV_HUGEPAGE itself ({plain})");
        return Ok(());
    }
    ensure!(
        plain.contains("hg=true"),
        "without the filter the advice should flag the mapping: {plain}"
    );
    let (filtered, status) = run_probe(true)?;
    ensure!(
        filtered == "PROBE madvise_huge=0 madvise_random=0 hg=false rr=true",
        "under gvfsctl no-huge-pages: {filtered}"
    );
    ensure!(
        status == Some(7),
        "the command's exit status is not gvfsctl's: {status:?}"
    );
    Ok(())
}

#[test]
fn a_command_that_cannot_run_is_a_clear_error() -> Result<()> {
    let out = Command::new(gvfs_testbed::proxy::gvfsctl_binary()?)
        .args(["no-huge-pages", "--", "/nonexistent/vmm"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1)
            && err.contains("running /nonexistent/vmm")
            && err.contains("No such file"),
        "{:?}: {err}",
        out.status
    );
    Ok(())
}

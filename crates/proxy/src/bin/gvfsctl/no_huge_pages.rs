//! gvfsctl no-huge-pages: runs a command with `madvise(MADV_HUGEPAGE)`
//! made a no-op, for a VM monitor whose guest RAM is a lazy clone's memory
//! image mapped from a gvfs mount.

use anyhow::Context;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// The filter: `madvise(_, _, MADV_HUGEPAGE)` returns 0 and does nothing;
/// every other call is allowed.
fn filter() -> anyhow::Result<BpfProgram> {
    let advice = SeccompCondition::new(
        2,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::MADV_HUGEPAGE as u64,
    )?;
    let filter = SeccompFilter::new(
        [(libc::SYS_madvise, vec![SeccompRule::new(vec![advice])?])]
            .into_iter()
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(0),
        std::env::consts::ARCH
            .try_into()
            .context("seccomp filters for this architecture")?,
    )?;
    Ok(filter.try_into()?)
}

/// Installs the filter on this (single) thread and becomes `command`;
/// returns only on failure.
pub(super) fn exec(command: &[OsString]) -> anyhow::Result<()> {
    let (program, args) = command.split_first().context("no command given")?;
    let filter = filter()?;
    // Sets no_new_privs: the command gains no privileges through exec
    // (setuid bits), which a seccomp filter needs without CAP_SYS_ADMIN.
    seccompiler::apply_filter(&filter).context("installing the seccomp filter")?;
    let e = std::process::Command::new(program).args(args).exec();
    Err(e).with_context(|| format!("running {}", program.to_string_lossy()))
}

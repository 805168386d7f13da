//! `gvfsctl learned [NAME] [--wait]`: tells a node proxy that its lazy
//! clone's guest is ready, so the working sets it is learning are
//! published now rather than when their window closes; with `--wait`,
//! says what became of them.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gvfs_filecache::FileCacheCounts;
use gvfs_proxy::status::Stats;
use serde_json::{Value, json};

use crate::show::NOT_UNDERSTOOD;

/// How long `--wait` waits for the learnings it ended to be published:
/// a profile goes upstream within `PROFILE_WAIT` (5 s).
pub(super) const LEARNED_WAIT: Duration = Duration::from_secs(10);

/// What became of ended learnings, as counted by the file cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Outcomes {
    sent: u64,
    refused: u64,
    unchanged: u64,
    copy: u64,
    too_big: u64,
    nothing: u64,
}

impl Outcomes {
    fn of(c: &FileCacheCounts) -> Self {
        Self {
            sent: c.profiles_sent,
            refused: c.profiles_refused,
            unchanged: c.profiles_unchanged,
            copy: c.profiles_discarded,
            too_big: c.profiles_too_big,
            nothing: c.learned_nothing,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            sent: self.sent.saturating_sub(before.sent),
            refused: self.refused.saturating_sub(before.refused),
            unchanged: self.unchanged.saturating_sub(before.unchanged),
            copy: self.copy.saturating_sub(before.copy),
            too_big: self.too_big.saturating_sub(before.too_big),
            nothing: self.nothing.saturating_sub(before.nothing),
        }
    }

    fn total(self) -> u64 {
        self.sent + self.refused + self.unchanged + self.copy + self.too_big + self.nothing
    }

    /// One line per outcome that happened.
    fn lines(self) -> Vec<String> {
        [
            (self.sent, "profile kept here and sent upstream"),
            (
                self.refused,
                "profile kept here, but upstream did not take it (see the proxy's log)",
            ),
            (
                self.unchanged,
                "nothing new: the profile the fetch started with",
            ),
            (
                self.copy,
                "not kept: the file was read in order (a copy, not a working set)",
            ),
            (
                self.too_big,
                "not kept: the guest touched most of the image",
            ),
            (self.nothing, "nothing touched, nothing learned"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("  {n:>4}  {what}"))
        .collect()
    }
}

/// The file cache's outcomes now.
fn outcomes(ask: &dyn Fn(&Value) -> anyhow::Result<Value>) -> anyhow::Result<Outcomes> {
    let stats: Stats =
        serde_json::from_value(ask(&json!({ "cmd": "stats" }))?).context(NOT_UNDERSTOOD)?;
    let files = stats
        .file_cache
        .context("this proxy holds no whole files (start it with --cache-dir and metadata on)")?;
    Ok(Outcomes::of(&files.counts))
}

/// Ends the learnings of `name` (every file without one); with `wait`,
/// waits up to [`LEARNED_WAIT`] for them to be published and says how.
pub(super) fn learned(
    ask: &dyn Fn(&Value) -> anyhow::Result<Value>,
    name: Option<&str>,
    wait: bool,
) -> anyhow::Result<()> {
    let before = if wait { Some(outcomes(ask)?) } else { None };
    let mut req = json!({ "cmd": "learned" });
    if let Some(n) = name {
        req["name"] = json!(n);
    }
    let ended = ask(&req)?["ended"].as_u64().context(NOT_UNDERSTOOD)?;
    let what = name.map_or_else(String::new, |n| format!(" of {n:?}"));
    if ended == 0 {
        println!("no learning{what} under way (ended already, or never started here)");
        return Ok(());
    }
    println!("ended {ended} learning(s){what}");
    let Some(before) = before else {
        println!("their working-set profiles are published now (`gvfsctl stats` counts them)");
        return Ok(());
    };
    let started = Instant::now();
    let seen = loop {
        let seen = outcomes(ask)?.since(before);
        if seen.total() >= ended || started.elapsed() >= LEARNED_WAIT {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for line in seen.lines() {
        println!("{line}");
    }
    if seen.total() < ended {
        bail!(
            "{} of {ended} learning(s) not published within {} s (the file let go, or upstream slow; see the proxy's log)",
            ended - seen.total(),
            LEARNED_WAIT.as_secs()
        );
    }
    if seen.refused > 0 {
        bail!("upstream did not take {} profile(s)", seen.refused);
    }
    Ok(())
}

//! The log: to stderr, filtered by `--log` or `RUST_LOG`, with colours
//! only on a terminal and never when `NO_COLOR` is set (no-color.org), so
//! a log written to a file or the journal carries no escape codes.

use std::io::IsTerminal;

/// Whether the log may use colours: stderr is a terminal and `NO_COLOR`
/// is unset or empty.
pub fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Sets up the process's log at `filter` (an `EnvFilter` directive).
pub fn init(filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(colours())
        .init();
}

//! How `gvfs-proxy` exits: one code per kind of failure, so that whatever
//! runs it (systemd, a script, an orchestrator) can tell a configuration to
//! fix from an upstream to wait for without reading the message, as
//! firecracker's `FcExitCode` does. [`ProxyError::exit_code`] maps a
//! start-up failure to its code; `gvfs-proxy --help` lists them.
//!
//! [`ProxyError::exit_code`]: crate::ProxyError::exit_code

/// The exit codes of `gvfs-proxy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum ExitCode {
    /// Stopped when told to (SIGTERM, SIGINT).
    Ok = 0,
    /// Failed while serving, or for a reason not listed here.
    Failure = 1,
    /// A bad command line or configuration (clap's code for usage errors).
    Config = 2,
    /// The upstream is unreachable or refused the export at start-up (or a
    /// `dir:` upstream's directory cannot be opened).
    Upstream = 3,
    /// A local resource is unusable: the listen address (in use, not this
    /// host's, a privileged port), the control socket, the cache directory
    /// (in use, unreadable) or its disk (too small for the cache).
    LocalResource = 4,
    /// TLS: this node's certificate, key or CA cannot be used, or the peer
    /// refused ours.
    Tls = 5,
}

impl ExitCode {
    /// Every code, in order.
    pub const ALL: [ExitCode; 6] = [
        Self::Ok,
        Self::Failure,
        Self::Config,
        Self::Upstream,
        Self::LocalResource,
        Self::Tls,
    ];

    /// The code's number.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// What the code means, in a line.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Ok => "stopped when told to (SIGTERM, SIGINT)",
            Self::Failure => "failed while serving, or for a reason not listed here",
            Self::Config => "bad command line or configuration",
            Self::Upstream => "the upstream is unreachable or refused the export at start-up",
            Self::LocalResource => {
                "a listen address, the control socket, the cache directory or its disk is unusable"
            }
            Self::Tls => "TLS: the certificate, key or CA is unusable, or the peer refused ours",
        }
    }

    /// The codes as `gvfs-proxy --help` lists them.
    pub fn help() -> String {
        let mut out = String::from("EXIT STATUS:");
        for c in Self::ALL {
            out.push_str(&format!("\n  {}  {}", c.code(), c.meaning()));
        }
        out
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        Self::from(c.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_listed_in_order() {
        let codes: Vec<u8> = ExitCode::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5]);
        let help = ExitCode::help();
        for c in ExitCode::ALL {
            assert!(help.contains(&format!("  {}  {}", c.code(), c.meaning())));
        }
    }
}

//! The line protocol the `gvfs-wanlink` binary reads on stdin, so a test
//! script can cut and restore the link while traffic flows.
//!
//! One command per line, one acknowledgement line back:
//!
//! | command                   | reply                                           |
//! |---------------------------|-------------------------------------------------|
//! | `cut`, `cut reset`, `cut blackhole` | `cut`                                 |
//! | `restore`                 | `restored`                                      |
//! | `stats`                   | `stats up=N down=N accepted=N active=N reset=N` |
//! | `quit`                    | `bye`                                           |
//! | `help`                    | the list of commands                            |

use std::str::FromStr;

use crate::config::CutMode;
use crate::error::Error;
use crate::link::WanLink;

const HELP: &str = "commands: cut [reset|blackhole], restore, stats, quit";

/// One control command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlCommand {
    /// Cut the link, in the given mode or else the configured one.
    Cut(Option<CutMode>),
    /// End a cut.
    Restore,
    /// Report the counters.
    Stats,
    /// Stop the link and exit.
    Quit,
    /// List the commands.
    Help,
}

impl FromStr for ControlCommand {
    type Err = Error;

    fn from_str(line: &str) -> Result<Self, Error> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["cut"] => Ok(Self::Cut(None)),
            ["cut", "reset"] => Ok(Self::Cut(Some(CutMode::Reset))),
            ["cut", "blackhole"] => Ok(Self::Cut(Some(CutMode::Blackhole))),
            ["restore"] => Ok(Self::Restore),
            ["stats"] => Ok(Self::Stats),
            ["quit" | "exit"] => Ok(Self::Quit),
            ["help"] => Ok(Self::Help),
            _ => Err(Error::UnknownCommand(line.trim().to_owned())),
        }
    }
}

impl ControlCommand {
    /// Carries the command out on `link` and returns the acknowledgement line.
    /// `Quit` only acknowledges; stopping is the caller's job.
    pub fn apply(self, link: &WanLink) -> String {
        match self {
            Self::Cut(None) => {
                link.cut();
                "cut".to_owned()
            }
            Self::Cut(Some(mode)) => {
                link.cut_with(mode);
                "cut".to_owned()
            }
            Self::Restore => {
                link.restore();
                "restored".to_owned()
            }
            Self::Stats => format!("stats {}", link.stats()),
            Self::Quit => "bye".to_owned(),
            Self::Help => HELP.to_owned(),
        }
    }
}

/// The answer to one control line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlReply {
    /// The line to print, if any (blank input gets none).
    pub line: Option<String>,
    /// Whether the caller should stop the link and exit.
    pub quit: bool,
}

/// Parses and applies one control line. Unknown commands get an `error: ...`
/// reply and change nothing.
pub fn handle_line(link: &WanLink, line: &str) -> ControlReply {
    if line.trim().is_empty() {
        return ControlReply {
            line: None,
            quit: false,
        };
    }
    match line.parse::<ControlCommand>() {
        Ok(command) => ControlReply {
            line: Some(command.apply(link)),
            quit: command == ControlCommand::Quit,
        },
        Err(error) => ControlReply {
            line: Some(format!("error: {error}")),
            quit: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_rejects_others() {
        assert_eq!(
            "cut".parse::<ControlCommand>().ok(),
            Some(ControlCommand::Cut(None))
        );
        assert_eq!(
            "  cut   blackhole ".parse::<ControlCommand>().ok(),
            Some(ControlCommand::Cut(Some(CutMode::Blackhole)))
        );
        assert_eq!(
            "restore\n".parse::<ControlCommand>().ok(),
            Some(ControlCommand::Restore)
        );
        assert_eq!(
            "stats".parse::<ControlCommand>().ok(),
            Some(ControlCommand::Stats)
        );
        assert_eq!(
            "quit".parse::<ControlCommand>().ok(),
            Some(ControlCommand::Quit)
        );
        for bad in ["cut sideways", "restor", "stats now", "CUT"] {
            assert!(bad.parse::<ControlCommand>().is_err(), "{bad:?} parsed");
        }
    }

    #[tokio::test]
    async fn lines_drive_the_link() {
        let unused_target = "127.0.0.1:9".parse().expect("addr");
        let link = WanLink::start(
            "127.0.0.1:0".parse().expect("addr"),
            unused_target,
            crate::LinkConfig::default(),
        )
        .await
        .expect("start");

        let reply = handle_line(&link, "cut blackhole");
        assert_eq!(reply.line.as_deref(), Some("cut"));
        assert_eq!(link.cut_state(), Some(CutMode::Blackhole));

        assert_eq!(
            handle_line(&link, "restore").line.as_deref(),
            Some("restored")
        );
        assert_eq!(link.cut_state(), None);

        let stats = handle_line(&link, "stats").line.expect("stats line");
        assert!(stats.starts_with("stats up=0 down=0 "), "{stats}");

        let error = handle_line(&link, "frobnicate");
        assert!(
            error
                .line
                .as_deref()
                .is_some_and(|l| l.starts_with("error: "))
        );
        assert!(!error.quit);

        assert_eq!(handle_line(&link, "   ").line, None);
        assert!(handle_line(&link, "quit").quit);
        link.shutdown().await;
    }
}

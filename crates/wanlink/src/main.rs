//! `gvfs-wanlink`: relay TCP connections through an emulated WAN link,
//! controlled by commands on stdin.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use gvfs_wanlink::control::handle_line;
use gvfs_wanlink::{CutMode, DirectionConfig, LinkConfig, WanLink};
use tokio::sync::mpsc;

/// Relay TCP connections through an emulated WAN link (delay, bandwidth
/// limit, outages) for machines without tc/netem.
///
/// Prints `listening on ADDR` once bound. Then reads one command per line
/// on stdin and acknowledges each with one line on stdout:
///   cut [reset|blackhole]  -> cut
///   restore                -> restored
///   stats                  -> stats up=BYTES down=BYTES accepted=N active=N reset=N
///   quit                   -> bye
/// Closing stdin leaves the link running until SIGINT or SIGTERM.
/// Logs go to stderr (RUST_LOG=debug for per-connection detail).
#[derive(Debug, Parser)]
#[command(name = "gvfs-wanlink", version, verbatim_doc_comment)]
struct Args {
    /// Address to accept clients on, e.g. 127.0.0.1:12049 (port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,

    /// Address every accepted connection is relayed to.
    #[arg(long, value_name = "ADDR")]
    target: SocketAddr,

    /// One-way delay in milliseconds, in each direction.
    #[arg(long, value_name = "MS", conflicts_with = "rtt_ms")]
    delay_ms: Option<f64>,

    /// Round-trip time in milliseconds: half of it is added each way.
    #[arg(long, value_name = "MS")]
    rtt_ms: Option<f64>,

    /// One-way delay client -> target in milliseconds (overrides --delay-ms/--rtt-ms).
    #[arg(long, value_name = "MS")]
    up_delay_ms: Option<f64>,

    /// One-way delay target -> client in milliseconds (overrides --delay-ms/--rtt-ms).
    #[arg(long, value_name = "MS")]
    down_delay_ms: Option<f64>,

    /// Bandwidth in Mbit/s (10^6 bits) in each direction; 0 or absent is unlimited.
    #[arg(long, value_name = "MBIT")]
    rate_mbit: Option<f64>,

    /// Bandwidth client -> target in Mbit/s (overrides --rate-mbit).
    #[arg(long, value_name = "MBIT")]
    up_rate_mbit: Option<f64>,

    /// Bandwidth target -> client in Mbit/s (overrides --rate-mbit).
    #[arg(long, value_name = "MBIT")]
    down_rate_mbit: Option<f64>,

    /// What `cut` does: reset connections, or hold their bytes until `restore`.
    #[arg(long, value_enum, default_value_t = CutModeArg::Reset)]
    cut_mode: CutModeArg,

    /// How long to wait for the target to accept each relayed connection.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    connect_timeout_ms: u64,

    /// Most connections relayed at once.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CutModeArg {
    /// Reset every connection on both sides; reset new ones until restore.
    Reset,
    /// Deliver nothing until restore, then resume where the link stopped.
    Blackhole,
}

impl Args {
    fn link_config(&self) -> anyhow::Result<LinkConfig> {
        let both_delay = match (self.delay_ms, self.rtt_ms) {
            (Some(delay), _) => delay,
            (None, Some(rtt)) => rtt / 2.0,
            (None, None) => 0.0,
        };
        let direction = |delay_ms: Option<f64>, rate_mbit: Option<f64>, name: &str| {
            let delay =
                millis(delay_ms.unwrap_or(both_delay)).with_context(|| format!("{name} delay"))?;
            let rate_bps = rate_mbit
                .or(self.rate_mbit)
                .map(mbit_to_bps)
                .transpose()
                .with_context(|| format!("{name} rate"))?;
            anyhow::Ok(DirectionConfig::new(delay, rate_bps))
        };
        Ok(LinkConfig {
            upstream: direction(self.up_delay_ms, self.up_rate_mbit, "upstream")?,
            downstream: direction(self.down_delay_ms, self.down_rate_mbit, "downstream")?,
            cut_mode: match self.cut_mode {
                CutModeArg::Reset => CutMode::Reset,
                CutModeArg::Blackhole => CutMode::Blackhole,
            },
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            max_connections: self.max_connections,
        })
    }
}

fn millis(ms: f64) -> anyhow::Result<Duration> {
    if !ms.is_finite() || ms < 0.0 {
        bail!("{ms} ms is not a delay");
    }
    Duration::try_from_secs_f64(ms / 1000.0).context("delay out of range")
}

fn mbit_to_bps(mbit: f64) -> anyhow::Result<u64> {
    if !mbit.is_finite() || mbit < 0.0 {
        bail!("{mbit} Mbit/s is not a rate");
    }
    let bps = (mbit * 1e6).round();
    if bps > u64::MAX as f64 {
        bail!("{mbit} Mbit/s is out of range");
    }
    // In range and non-negative: the cast is exact up to f64 precision.
    Ok(bps as u64)
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Colours only on a terminal, and not with NO_COLOR (no-color.org).
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colours)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gvfs-wanlink: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run(args: Args) -> anyhow::Result<()> {
    let config = args.link_config()?;
    let link = WanLink::start(args.listen, args.target, config)
        .await
        .context("starting the link")?;
    say(&format!("listening on {}", link.local_addr()))?;

    let mut commands = spawn_stdin_reader();
    let mut stdin_open = true;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            signal = &mut shutdown => {
                signal?;
                break;
            }
            line = commands.recv(), if stdin_open => match line {
                Some(line) => {
                    let reply = handle_line(&link, &line);
                    if let Some(text) = reply.line {
                        say(&text)?;
                    }
                    if reply.quit {
                        break;
                    }
                }
                None => stdin_open = false,
            },
        }
    }
    link.shutdown().await;
    Ok(())
}

/// Prints one line to stdout and flushes it, for scripts waiting on it.
fn say(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

/// Reads stdin on a plain thread: tokio's stdin cannot be cancelled and
/// would hold up shutdown until the next line.
fn spawn_stdin_reader() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate =
            signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT"),
            _ = terminate.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.context("waiting for ctrl-c")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<LinkConfig> {
        let mut argv = vec![
            "gvfs-wanlink",
            "--listen",
            "127.0.0.1:0",
            "--target",
            "127.0.0.1:1",
        ];
        argv.extend_from_slice(args);
        Args::try_parse_from(argv)?.link_config()
    }

    #[test]
    fn rtt_is_split_and_rates_are_megabits() -> anyhow::Result<()> {
        let config = parse(&[
            "--rtt-ms",
            "40",
            "--rate-mbit",
            "50",
            "--down-rate-mbit",
            "0",
        ])?;
        assert_eq!(config.upstream.delay, Duration::from_millis(20));
        assert_eq!(config.downstream.delay, Duration::from_millis(20));
        assert_eq!(config.upstream.rate_bps, Some(50_000_000));
        assert_eq!(config.downstream.effective_rate_bps(), None);
        Ok(())
    }

    #[test]
    fn per_direction_delay_overrides_both() -> anyhow::Result<()> {
        let config = parse(&[
            "--delay-ms",
            "5",
            "--down-delay-ms",
            "0.5",
            "--cut-mode",
            "blackhole",
        ])?;
        assert_eq!(config.upstream.delay, Duration::from_millis(5));
        assert_eq!(config.downstream.delay, Duration::from_micros(500));
        assert_eq!(config.cut_mode, CutMode::Blackhole);
        Ok(())
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["--delay-ms", "5", "--rtt-ms", "10"]).is_err());
        assert!(parse(&["--delay-ms", "-1"]).is_err());
        assert!(parse(&["--rate-mbit", "NaN"]).is_err());
    }
}

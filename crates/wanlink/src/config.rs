//! What the emulated link looks like: delay and bandwidth per direction, and
//! what a cut does.

use std::time::Duration;

/// Smallest read, in bytes: one Ethernet-sized TCP segment. At very low rates
/// a chunk still serialises in whole segments rather than in single bytes.
const MIN_CHUNK: usize = 1448;

/// Largest read, in bytes. Also the chunk size of an unlimited direction.
pub(crate) const MAX_CHUNK: usize = 64 * 1024;

/// How much link time one chunk should take to serialise. Smaller chunks pace
/// more smoothly but cost more wake-ups; 2 ms keeps the pacing error well
/// under a millisecond while staying around 500 chunks a second.
const CHUNK_SERIALISATION_TIME: Duration = Duration::from_millis(2);

/// Smallest in-flight budget per direction, in bytes.
const MIN_IN_FLIGHT: usize = 64 * 1024;

/// Largest in-flight budget per direction, in bytes; also the budget of an
/// unlimited direction. 16 MiB over a 20 ms delay still carries 800 MB/s.
const MAX_IN_FLIGHT: usize = 16 * 1024 * 1024;

/// One direction of the link: how long a byte takes to cross it and how fast
/// the sender may put bytes on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirectionConfig {
    /// One-way propagation delay added to every chunk.
    pub delay: Duration,
    /// Bandwidth in bits per second. `None` or `Some(0)` means unlimited.
    pub rate_bps: Option<u64>,
}

impl DirectionConfig {
    /// A direction with the given one-way delay and rate (`None` or `Some(0)`
    /// for unlimited).
    pub fn new(delay: Duration, rate_bps: Option<u64>) -> Self {
        Self { delay, rate_bps }
    }

    /// The rate in bits per second, or `None` when the direction is unlimited.
    pub fn effective_rate_bps(&self) -> Option<u64> {
        self.rate_bps.filter(|&bps| bps > 0)
    }

    /// How long `bytes` occupy the link at this direction's rate: `bytes * 8 /
    /// rate` seconds, zero when unlimited.
    pub fn serialisation_time(&self, bytes: usize) -> Duration {
        match self.effective_rate_bps() {
            None => Duration::ZERO,
            Some(bps) => {
                let nanos = (bytes as u128) * 8 * 1_000_000_000 / u128::from(bps);
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            }
        }
    }

    /// Bytes per read: what the link serialises in about 2 ms, clamped to one
    /// TCP segment below and 64 KiB above.
    pub(crate) fn read_chunk_size(&self) -> usize {
        match self.effective_rate_bps() {
            None => MAX_CHUNK,
            Some(bps) => {
                let bytes =
                    u128::from(bps) * CHUNK_SERIALISATION_TIME.as_nanos() / 8 / 1_000_000_000;
                usize::try_from(bytes)
                    .unwrap_or(MAX_CHUNK)
                    .clamp(MIN_CHUNK, MAX_CHUNK)
            }
        }
    }

    /// Bytes that may be read from the sender but not yet delivered: twice the
    /// bandwidth-delay product (the bytes on the wire plus as many queued at
    /// the bottleneck) plus four chunks, clamped to [64 KiB, 16 MiB]. A
    /// sender that outruns the link is back-pressured once this is full.
    pub(crate) fn in_flight_budget(&self) -> usize {
        let Some(bps) = self.effective_rate_bps() else {
            return MAX_IN_FLIGHT;
        };
        let bdp = u128::from(bps) * self.delay.as_nanos() / 8 / 1_000_000_000;
        let wanted = bdp * 2 + 4 * self.read_chunk_size() as u128;
        usize::try_from(wanted)
            .unwrap_or(MAX_IN_FLIGHT)
            .clamp(MIN_IN_FLIGHT, MAX_IN_FLIGHT)
    }
}

/// What [`WanLink::cut`](crate::WanLink::cut) does to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CutMode {
    /// Relayed connections are reset on both sides and new connections are
    /// accepted and reset at once, as when a router in the path reboots.
    #[default]
    Reset,
    /// Connections stay open but nothing is delivered: the link's clock stops
    /// and resumes on restore, as when a cable is pulled and plugged back in.
    /// New connections are accepted but not relayed until restore.
    Blackhole,
}

/// The whole link: both directions, the cut behaviour and connection limits.
///
/// Upstream is client to target, downstream is target to client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    /// Client to target.
    pub upstream: DirectionConfig,
    /// Target to client.
    pub downstream: DirectionConfig,
    /// What [`WanLink::cut`](crate::WanLink::cut) does.
    pub cut_mode: CutMode,
    /// How long to wait for the target to accept a relayed connection.
    pub connect_timeout: Duration,
    /// Most connections relayed at once; further clients wait in the accept
    /// backlog. Read once at [`WanLink::start`](crate::WanLink::start).
    pub max_connections: usize,
}

impl Default for LinkConfig {
    /// No delay, no rate limit, reset on cut, 5 s connect timeout, 1024
    /// connections.
    fn default() -> Self {
        Self {
            upstream: DirectionConfig::default(),
            downstream: DirectionConfig::default(),
            cut_mode: CutMode::Reset,
            connect_timeout: Duration::from_secs(5),
            max_connections: 1024,
        }
    }
}

impl LinkConfig {
    /// The same one-way delay and rate in both directions.
    pub fn symmetric(one_way_delay: Duration, rate_bps: Option<u64>) -> Self {
        let direction = DirectionConfig::new(one_way_delay, rate_bps);
        Self {
            upstream: direction,
            downstream: direction,
            ..Self::default()
        }
    }

    /// Half of `rtt` each way and the same rate in both directions.
    pub fn from_rtt(rtt: Duration, rate_bps: Option<u64>) -> Self {
        Self::symmetric(rtt / 2, rate_bps)
    }

    /// This configuration with another cut mode.
    pub fn with_cut_mode(mut self, cut_mode: CutMode) -> Self {
        self.cut_mode = cut_mode;
        self
    }

    pub(crate) fn direction(&self, direction: Direction) -> &DirectionConfig {
        match direction {
            Direction::Upstream => &self.upstream,
            Direction::Downstream => &self.downstream,
        }
    }
}

/// Which way bytes travel through the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Client to target.
    Upstream,
    /// Target to client.
    Downstream,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialisation_time_is_bits_over_rate() {
        let d = DirectionConfig::new(Duration::ZERO, Some(8_000_000));
        assert_eq!(d.serialisation_time(1_000), Duration::from_millis(1));
        let fifty = DirectionConfig::new(Duration::ZERO, Some(50_000_000));
        assert_eq!(
            fifty.serialisation_time(4 << 20),
            Duration::from_nanos(671_088_640)
        );
    }

    #[test]
    fn zero_and_none_rates_are_unlimited() {
        for rate in [None, Some(0)] {
            let d = DirectionConfig::new(Duration::from_millis(20), rate);
            assert_eq!(d.effective_rate_bps(), None);
            assert_eq!(d.serialisation_time(1 << 30), Duration::ZERO);
            assert_eq!(d.read_chunk_size(), MAX_CHUNK);
            assert_eq!(d.in_flight_budget(), MAX_IN_FLIGHT);
        }
    }

    #[test]
    fn chunk_size_follows_rate_within_bounds() {
        let slow = DirectionConfig::new(Duration::ZERO, Some(1_000));
        assert_eq!(slow.read_chunk_size(), MIN_CHUNK);
        let fifty = DirectionConfig::new(Duration::ZERO, Some(50_000_000));
        assert_eq!(fifty.read_chunk_size(), 12_500);
        let fast = DirectionConfig::new(Duration::ZERO, Some(10_000_000_000));
        assert_eq!(fast.read_chunk_size(), MAX_CHUNK);
    }

    #[test]
    fn budget_covers_twice_the_bandwidth_delay_product() {
        let d = DirectionConfig::new(Duration::from_millis(20), Some(50_000_000));
        // BDP = 125 000 bytes; 2 * BDP + 4 chunks of 12 500 bytes.
        assert_eq!(d.in_flight_budget(), 300_000);
        let tiny = DirectionConfig::new(Duration::ZERO, Some(1_000));
        assert_eq!(tiny.in_flight_budget(), MIN_IN_FLIGHT);
        let huge = DirectionConfig::new(Duration::from_secs(10), Some(10_000_000_000));
        assert_eq!(huge.in_flight_budget(), MAX_IN_FLIGHT);
    }

    #[test]
    fn budget_always_holds_a_chunk() {
        proptest::proptest!(|(bps in 0u64..100_000_000_000, delay_us in 0u64..10_000_000)| {
            let d = DirectionConfig::new(Duration::from_micros(delay_us), Some(bps));
            proptest::prop_assert!(d.in_flight_budget() >= d.read_chunk_size());
        });
    }

    #[test]
    fn from_rtt_splits_the_delay() {
        let c = LinkConfig::from_rtt(Duration::from_millis(40), Some(1));
        assert_eq!(c.upstream.delay, Duration::from_millis(20));
        assert_eq!(c.downstream, c.upstream);
    }
}

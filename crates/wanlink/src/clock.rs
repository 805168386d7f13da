//! Link time and the serialisation queue, with no I/O: every function takes
//! the current wall time as an argument so the schedule can be tested exactly.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::DirectionConfig;

/// Link time: wall time since the link started, minus the time spent
/// blackholed. It stands still during a blackhole cut, so every delay and
/// every serialisation slot in progress resumes where it stopped on restore.
#[derive(Debug, Clone)]
pub(crate) struct LinkClock {
    epoch: Instant,
    frozen_total: Duration,
    frozen_since: Option<Instant>,
}

impl LinkClock {
    pub(crate) fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            frozen_total: Duration::ZERO,
            frozen_since: None,
        }
    }

    /// Link time at wall time `wall`.
    pub(crate) fn link_time(&self, wall: Instant) -> Duration {
        let wall = self.frozen_since.unwrap_or(wall);
        wall.saturating_duration_since(self.epoch)
            .saturating_sub(self.frozen_total)
    }

    /// The wall time at which link time reaches `link`, or `None` while the
    /// clock is frozen (it reaches nothing until restored).
    pub(crate) fn wall_deadline(&self, link: Duration) -> Option<Instant> {
        match self.frozen_since {
            Some(_) => None,
            None => Some(self.epoch + self.frozen_total + link),
        }
    }

    /// Stops link time at `wall`. Freezing a frozen clock changes nothing.
    pub(crate) fn freeze(&mut self, wall: Instant) {
        if self.frozen_since.is_none() {
            self.frozen_since = Some(wall);
        }
    }

    /// Restarts link time at `wall`. Thawing a running clock changes nothing.
    pub(crate) fn thaw(&mut self, wall: Instant) {
        if let Some(since) = self.frozen_since.take() {
            self.frozen_total += wall.saturating_duration_since(since);
        }
    }
}

/// The sender side of one direction: a "link busy until" clock. A chunk
/// starts serialising when it arrives or when the previous one is done,
/// whichever is later, occupies the link for `bytes * 8 / rate`, and is
/// delivered one propagation delay after its last bit left.
#[derive(Debug, Clone, Default)]
pub(crate) struct Transmitter {
    link_free_at: Duration,
    last_delivery: Duration,
}

impl Transmitter {
    /// Schedules `bytes` arriving at link time `arrival` and returns the link
    /// time at which they may be delivered. Delivery times never decrease, so
    /// a smaller delay set at run time cannot reorder bytes.
    pub(crate) fn schedule(
        &mut self,
        arrival: Duration,
        bytes: usize,
        config: &DirectionConfig,
    ) -> Duration {
        let start = arrival.max(self.link_free_at);
        self.link_free_at = start + config.serialisation_time(bytes);
        let delivery = (self.link_free_at + config.delay).max(self.last_delivery);
        self.last_delivery = delivery;
        delivery
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn link_time_follows_wall_time_until_frozen() {
        let t0 = Instant::now();
        let mut clock = LinkClock::new(t0);
        assert_eq!(clock.link_time(t0 + 5 * MS), 5 * MS);
        assert_eq!(clock.wall_deadline(7 * MS), Some(t0 + 7 * MS));

        clock.freeze(t0 + 10 * MS);
        clock.freeze(t0 + 12 * MS);
        assert_eq!(clock.link_time(t0 + 30 * MS), 10 * MS);
        assert_eq!(clock.wall_deadline(11 * MS), None);

        clock.thaw(t0 + 40 * MS);
        clock.thaw(t0 + 45 * MS);
        assert_eq!(clock.link_time(t0 + 41 * MS), 11 * MS);
        assert_eq!(clock.wall_deadline(11 * MS), Some(t0 + 41 * MS));
    }

    #[test]
    fn idle_link_adds_only_serialisation_and_delay() {
        let config = DirectionConfig::new(20 * MS, Some(8_000_000));
        let mut tx = Transmitter::default();
        // 1000 bytes at 1 byte/us: 1 ms on the wire, then 20 ms of delay.
        assert_eq!(tx.schedule(100 * MS, 1000, &config), 121 * MS);
        // The link was free again long before this one arrived.
        assert_eq!(tx.schedule(500 * MS, 1000, &config), 521 * MS);
    }

    #[test]
    fn back_to_back_chunks_queue_behind_each_other() {
        let config = DirectionConfig::new(20 * MS, Some(8_000_000));
        let mut tx = Transmitter::default();
        let deliveries: Vec<_> = (0..4)
            .map(|_| tx.schedule(Duration::ZERO, 2000, &config))
            .collect();
        assert_eq!(deliveries, [22 * MS, 24 * MS, 26 * MS, 28 * MS]);
    }

    #[test]
    fn unlimited_rate_is_pure_delay() {
        let config = DirectionConfig::new(20 * MS, None);
        let mut tx = Transmitter::default();
        assert_eq!(tx.schedule(3 * MS, 1 << 30, &config), 23 * MS);
        assert_eq!(tx.schedule(3 * MS, 1 << 30, &config), 23 * MS);
    }

    #[test]
    fn shorter_delay_does_not_reorder() {
        let mut tx = Transmitter::default();
        let slow = DirectionConfig::new(50 * MS, None);
        let fast = DirectionConfig::new(MS, None);
        assert_eq!(tx.schedule(Duration::ZERO, 10, &slow), 50 * MS);
        assert_eq!(tx.schedule(10 * MS, 10, &fast), 50 * MS);
        assert_eq!(tx.schedule(60 * MS, 10, &fast), 61 * MS);
    }

    #[test]
    fn deliveries_are_monotonic_and_never_early() {
        proptest::proptest!(|(
            steps in proptest::collection::vec((0u64..5_000, 1usize..70_000, 0u64..50_000, 0u64..100_000_000), 1..50)
        )| {
            let mut tx = Transmitter::default();
            let mut arrival = Duration::ZERO;
            let mut last = Duration::ZERO;
            for (gap_us, bytes, delay_us, bps) in steps {
                arrival += Duration::from_micros(gap_us);
                let config = DirectionConfig::new(Duration::from_micros(delay_us), Some(bps));
                let delivery = tx.schedule(arrival, bytes, &config);
                proptest::prop_assert!(delivery >= last);
                proptest::prop_assert!(
                    delivery >= arrival + config.delay + config.serialisation_time(bytes)
                );
                last = delivery;
            }
        });
    }
}

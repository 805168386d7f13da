//! The link's shared, observable state: configuration, cut status and clock.
//! It lives in a `tokio::sync::watch` channel so every relayed connection
//! sees a cut, a restore or a new configuration as soon as it happens.

use tokio::time::Instant;

use crate::clock::LinkClock;
use crate::config::{CutMode, LinkConfig};

/// Everything a relayed connection needs to know about the link right now.
#[derive(Debug, Clone)]
pub(crate) struct LinkState {
    pub(crate) config: LinkConfig,
    /// `Some` while the link is cut, with the mode of that cut.
    pub(crate) cut: Option<CutMode>,
    /// Bumped by every reset cut. A connection resets itself when this
    /// differs from the value it started with, so a cut followed by a quick
    /// restore still kills it.
    pub(crate) reset_generation: u64,
    pub(crate) clock: LinkClock,
}

impl LinkState {
    pub(crate) fn new(config: LinkConfig, epoch: Instant) -> Self {
        Self {
            config,
            cut: None,
            reset_generation: 0,
            clock: LinkClock::new(epoch),
        }
    }

    /// Cuts the link at wall time `now`. A reset cut also ends a blackhole,
    /// since the connections whose bytes it was holding are reset.
    pub(crate) fn cut(&mut self, mode: CutMode, now: Instant) {
        match mode {
            CutMode::Reset => {
                self.reset_generation += 1;
                self.clock.thaw(now);
            }
            CutMode::Blackhole => self.clock.freeze(now),
        }
        self.cut = Some(mode);
    }

    /// Restores the link at wall time `now`.
    pub(crate) fn restore(&mut self, now: Instant) {
        self.clock.thaw(now);
        self.cut = None;
    }

    /// True while new connections must wait before being relayed.
    pub(crate) fn is_blackholed(&self) -> bool {
        self.cut == Some(CutMode::Blackhole)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn reset_cut_bumps_generation_and_restore_clears() {
        let t0 = Instant::now();
        let mut s = LinkState::new(LinkConfig::default(), t0);
        s.cut(CutMode::Reset, t0);
        s.cut(CutMode::Reset, t0);
        assert_eq!(s.reset_generation, 2);
        assert_eq!(s.cut, Some(CutMode::Reset));
        s.restore(t0);
        assert_eq!(s.cut, None);
    }

    #[test]
    fn blackhole_stops_link_time_until_restore() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut s = LinkState::new(LinkConfig::default(), t0);
        s.cut(CutMode::Blackhole, t0 + 10 * ms);
        assert!(s.is_blackholed());
        assert_eq!(s.clock.link_time(t0 + 50 * ms), 10 * ms);
        s.restore(t0 + 50 * ms);
        assert_eq!(s.clock.link_time(t0 + 60 * ms), 20 * ms);
        assert_eq!(s.reset_generation, 0);
    }

    #[test]
    fn reset_during_blackhole_restarts_the_clock() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut s = LinkState::new(LinkConfig::default(), t0);
        s.cut(CutMode::Blackhole, t0);
        s.cut(CutMode::Reset, t0 + 5 * ms);
        assert!(!s.is_blackholed());
        assert_eq!(s.clock.link_time(t0 + 6 * ms), ms);
    }
}

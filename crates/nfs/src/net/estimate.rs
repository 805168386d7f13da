//! What the link to the server can carry, measured from the calls the RPC
//! client makes, as BBR measures a TCP path: the round-trip time is the
//! least seen over the last [`RTT_WINDOW`] (queues only ever add to it),
//! the delivery rate the most seen over the last ten round trips (a sender
//! that does not fill the link only ever measures less than it could).
//! Their product is the bandwidth-delay product: the bytes in flight that
//! fill the link without queueing.
//!
//! A call is a sample: [`LinkEstimator::sent`] when its record is handed
//! to the connection, [`LinkEstimator::replied`] with the reply record's
//! length when it comes back. Its delivery-rate sample is BBR's: the bytes
//! of every reply that came in while it was out, over the time it was out.
//! Calls sent again (a timeout, a dropped connection) are not sampled:
//! which send a reply answers is unknown. The round trip includes the
//! server's own time, so a server that reads from a slow disk looks like a
//! longer link; that is what a caller waits for, too.
//!
//! Sans-IO: the caller passes the time; [`LinkHandle`] shares one
//! estimator between the client and whoever reads it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long the least round trip seen is kept (BBR's min_rtt filter).
pub const RTT_WINDOW: Duration = Duration::from_secs(10);

/// Round trips the most delivery rate seen is kept for (BBR's bandwidth
/// filter).
pub const RATE_ROUNDS: u32 = 10;

/// The shortest window of the rate filter, however short the round trip:
/// a reply takes longer than a packet, so a sub-millisecond LAN round
/// trip would otherwise keep a handful of samples.
pub const MIN_RATE_WINDOW: Duration = Duration::from_millis(100);

/// The link as measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkEstimate {
    /// The least round trip in the window.
    pub min_rtt: Duration,
    /// The most delivery rate in the window, bytes per second.
    pub rate: u64,
}

impl LinkEstimate {
    /// The bandwidth-delay product: `rate × min_rtt`, in bytes.
    pub fn bdp(&self) -> u64 {
        let bytes = u128::from(self.rate) * self.min_rtt.as_micros() / 1_000_000;
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }
}

/// One value of a windowed filter and when it was seen.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    value: u64,
}

/// The best (least or most) value seen within a sliding time window, kept
/// in three samples: the best, the best since a quarter of the window, and
/// the best since half of it (Kathleen Nichols' algorithm, as Linux's
/// `lib/win_minmax.c`). Constant space, however many samples come.
#[derive(Debug, Clone)]
struct Windowed {
    s: Option<[Sample; 3]>,
    /// `true`: keeps the most; `false`: the least.
    max: bool,
}

impl Windowed {
    fn new(max: bool) -> Self {
        Self { s: None, max }
    }

    fn best(&self) -> Option<u64> {
        self.s.map(|s| s[0].value)
    }

    /// Takes `value` seen at `at`; samples older than `window` leave.
    fn update(&mut self, at: Instant, value: u64, window: Duration) {
        let new = Sample { at, value };
        let max = self.max;
        let beats = |a: u64, b: u64| if max { a >= b } else { a <= b };
        let Some(s) = self.s.as_mut() else {
            self.s = Some([new; 3]);
            return;
        };
        let since = |t: Instant| at.saturating_duration_since(t);
        if beats(value, s[0].value) || since(s[2].at) > window {
            // A new best, or nothing left in the window: start over.
            *s = [new; 3];
            return;
        }
        if beats(value, s[1].value) {
            s[1] = new;
            s[2] = new;
        } else if beats(value, s[2].value) {
            s[2] = new;
        }
        // Age the sub-windows.
        let dt = since(s[0].at);
        if dt > window {
            s[0] = s[1];
            s[1] = s[2];
            s[2] = new;
            if since(s[0].at) > window {
                s[0] = s[1];
                s[1] = s[2];
                s[2] = new;
            }
        } else if s[1].at == s[0].at && dt > window / 4 {
            s[1] = new;
            s[2] = new;
        } else if s[2].at == s[1].at && dt > window / 2 {
            s[2] = new;
        }
    }
}

/// A call out on the link: when it was sent and the bytes delivered
/// before it.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    at: Instant,
    delivered: u64,
}

/// The link's round trip and delivery rate, from the calls on it.
#[derive(Debug, Clone)]
pub struct LinkEstimator {
    min_rtt: Windowed,
    rate: Windowed,
    /// Reply bytes delivered so far.
    delivered: u64,
    /// Calls a client waits for in flight (not the estimate's: what a
    /// scheduler of the link's other traffic makes way for), and when
    /// one last began or ended.
    foreground: usize,
    foreground_seen: Option<Instant>,
}

impl Default for LinkEstimator {
    fn default() -> Self {
        Self::new()
    }
}

impl LinkEstimator {
    /// Nothing measured yet.
    pub fn new() -> Self {
        Self {
            min_rtt: Windowed::new(false),
            rate: Windowed::new(true),
            delivered: 0,
            foreground: 0,
            foreground_seen: None,
        }
    }

    /// A call a client waits for leaves now (see [`LinkHandle::foreground`]).
    pub fn foreground_began(&mut self, now: Instant) {
        self.foreground += 1;
        self.foreground_seen = Some(now);
    }

    /// Such a call ended now.
    pub fn foreground_ended(&mut self, now: Instant) {
        self.foreground = self.foreground.saturating_sub(1);
        self.foreground_seen = Some(now);
    }

    /// Calls a client waits for in flight, and when one last began or
    /// ended.
    pub fn foreground(&self) -> (usize, Option<Instant>) {
        (self.foreground, self.foreground_seen)
    }

    /// A call leaves now.
    pub fn sent(&self, now: Instant) -> Sent {
        Sent {
            at: now,
            delivered: self.delivered,
        }
    }

    /// The call `sent` was answered now with a reply record of `bytes`.
    pub fn replied(&mut self, sent: Sent, now: Instant, bytes: u64) {
        self.delivered = self.delivered.saturating_add(bytes);
        let rtt = now.saturating_duration_since(sent.at);
        let rtt_us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
        self.min_rtt.update(now, rtt_us, RTT_WINDOW);
        // At least a microsecond: paused clocks and fast loopbacks answer
        // in no time at all.
        let interval = rtt_us.max(1);
        let bytes = self.delivered - sent.delivered;
        let rate =
            u64::try_from(u128::from(bytes) * 1_000_000 / u128::from(interval)).unwrap_or(u64::MAX);
        let window = self
            .min_rtt()
            .map_or(MIN_RATE_WINDOW, |r| (r * RATE_ROUNDS).max(MIN_RATE_WINDOW));
        self.rate.update(now, rate, window);
    }

    /// The least round trip in the window, once a call has been answered.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.best().map(Duration::from_micros)
    }

    /// The link as measured, once a call has been answered.
    pub fn estimate(&self) -> Option<LinkEstimate> {
        Some(LinkEstimate {
            min_rtt: self.min_rtt()?,
            rate: self.rate.best()?,
        })
    }
}

/// One [`LinkEstimator`] shared by the RPC client that feeds it and those
/// who read it ([`RpcClient::link`](super::client::RpcClient::link)).
/// Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct LinkHandle(Arc<Mutex<LinkEstimator>>);

impl LinkHandle {
    /// A handle on a fresh estimator.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkEstimator> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A call leaves now.
    pub fn sent(&self) -> Sent {
        self.lock().sent(Instant::now())
    }

    /// The call `sent` was answered now with a reply record of `bytes`.
    pub fn replied(&self, sent: Sent, bytes: u64) {
        self.lock().replied(sent, Instant::now(), bytes);
    }

    /// The link as measured, once a call has been answered.
    pub fn estimate(&self) -> Option<LinkEstimate> {
        self.lock().estimate()
    }

    /// Marks a call a client waits for (an NFS call passed upstream) as in
    /// flight until the guard is dropped, so that whoever schedules the
    /// link's other traffic (the extension client's gate) makes way for
    /// it.
    pub fn foreground(&self) -> Foreground {
        self.lock().foreground_began(Instant::now());
        Foreground(self.clone())
    }

    /// Calls a client waits for in flight, and when one last began or
    /// ended.
    pub fn foreground_calls(&self) -> (usize, Option<Instant>) {
        self.lock().foreground()
    }

    /// The least round trip in the window.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.lock().min_rtt()
    }

    /// The most delivery rate in the window, bytes per second.
    pub fn rate(&self) -> Option<u64> {
        self.estimate().map(|e| e.rate)
    }

    /// The bandwidth-delay product, bytes.
    pub fn bdp(&self) -> Option<u64> {
        self.estimate().map(|e| e.bdp())
    }
}

/// A call a client waits for, in flight while this lives
/// ([`LinkHandle::foreground`]).
#[derive(Debug)]
#[must_use = "the call counts as in flight only while this lives"]
pub struct Foreground(LinkHandle);

impl Drop for Foreground {
    fn drop(&mut self) {
        self.0.lock().foreground_ended(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn nothing_is_known_before_a_reply() {
        let e = LinkEstimator::new();
        let _ = e.sent(Instant::now());
        assert_eq!(e.estimate(), None);
    }

    #[test]
    fn one_call_at_a_time_gives_rtt_rate_and_bdp() {
        let t0 = Instant::now();
        let mut e = LinkEstimator::new();
        let mut t = t0;
        for rtt in [50, 40, 45, 60] {
            let s = e.sent(t);
            t += rtt * MS;
            e.replied(s, t, 64 << 10);
        }
        let got = e.estimate().unwrap();
        assert_eq!(got.min_rtt, 40 * MS);
        // 64 KiB in 40 ms.
        assert_eq!(got.rate, (64 << 10) * 25);
        assert_eq!(got.bdp(), 64 << 10);
    }

    #[test]
    fn pipelined_calls_measure_the_rate_of_the_link() {
        // 8 calls out at once on a 40 ms link that delivers one 64 KiB
        // reply every 5 ms: the last sees 8 replies in 75 ms.
        let t0 = Instant::now();
        let mut e = LinkEstimator::new();
        let sent: Vec<Sent> = (0..8).map(|_| e.sent(t0)).collect();
        for (i, s) in sent.into_iter().enumerate() {
            e.replied(s, t0 + (40 + 5 * i as u32) * MS, 64 << 10);
        }
        let got = e.estimate().unwrap();
        assert_eq!(got.min_rtt, 40 * MS);
        assert_eq!(got.rate, 8 * (64 << 10) * 1000 / 75);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let t0 = Instant::now();
        let mut e = LinkEstimator::new();
        // A short round trip and a fast sample once...
        let s = e.sent(t0);
        e.replied(s, t0 + 10 * MS, 1 << 20);
        assert_eq!(e.min_rtt(), Some(10 * MS));
        let fast = e.estimate().unwrap().rate;
        // ...then only slower, longer ones, every 100 ms for 12 s.
        let mut t = t0 + 10 * MS;
        let mut seen_fast_later = false;
        for i in 0..120u32 {
            let s = e.sent(t);
            t += 30 * MS;
            e.replied(s, t, 64 << 10);
            t += 70 * MS;
            let now = e.estimate().unwrap();
            if i == 0 {
                // Still within both windows.
                assert_eq!(now.min_rtt, 10 * MS);
                assert_eq!(now.rate, fast);
            }
            seen_fast_later |= i > 20 && now.rate == fast;
        }
        assert!(!seen_fast_later, "the fast sample outlived its window");
        let now = e.estimate().unwrap();
        // Past RTT_WINDOW the 10 ms round trip is gone.
        assert_eq!(now.min_rtt, 30 * MS);
        assert_eq!(now.rate, (64 << 10) * 1000 / 30);
    }

    #[test]
    fn a_windowed_max_keeps_the_best_of_the_window() {
        let t0 = Instant::now();
        let mut w = Windowed::new(true);
        let win = Duration::from_secs(1);
        w.update(t0, 10, win);
        w.update(t0 + 100 * MS, 5, win);
        w.update(t0 + 400 * MS, 7, win);
        assert_eq!(w.best(), Some(10));
        // 10 leaves after a second; the best of what is left is 7.
        w.update(t0 + 1100 * MS, 3, win);
        assert_eq!(w.best(), Some(7));
        w.update(t0 + 1500 * MS, 20, win);
        assert_eq!(w.best(), Some(20));
        let mut m = Windowed::new(false);
        m.update(t0, 10, win);
        m.update(t0 + 100 * MS, 15, win);
        assert_eq!(m.best(), Some(10));
        m.update(t0 + 1200 * MS, 12, win);
        assert_eq!(m.best(), Some(12));
    }
}

//! The gate's rules, under paused time with a fixed link.

use std::time::Duration;

use gvfs_nfs::net::estimate::{LinkEstimate, LinkHandle};
use tokio::sync::mpsc;

use super::*;

const MIB: u32 = 1 << 20;

/// A tenant other than this proxy.
fn tenant(n: u64) -> Tenant {
    Tenant(n)
}

/// A link of `rtt_ms` and `mb_s` MB/s.
fn link(rtt_ms: u64, mb_s: u64) -> FixedLink {
    FixedLink(Some(LinkEstimate {
        min_rtt: Duration::from_millis(rtt_ms),
        rate: mb_s * 1_000_000,
    }))
}

/// Lets every task run as far as it can.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// An admitted request: its label and its permit.
type Admitted = (&'static str, Tenant, u32, Permit);

/// Asks for `raw` bytes under a new ticket of `class` for `who`; the permit
/// comes out of `tx` with `label` once admitted.
fn ask(
    gate: &Gate,
    class: Class,
    who: Tenant,
    raw: u32,
    label: &'static str,
    tx: &mpsc::UnboundedSender<Admitted>,
) -> Arc<Ticket> {
    let ticket = Ticket::new(class, who);
    ask_with(gate, &ticket, raw, label, tx);
    ticket
}

fn ask_with(
    gate: &Gate,
    ticket: &Arc<Ticket>,
    raw: u32,
    label: &'static str,
    tx: &mpsc::UnboundedSender<Admitted>,
) {
    let (gate, ticket, tx) = (gate.clone(), ticket.clone(), tx.clone());
    tokio::spawn(async move {
        let p = gate.admit(&ticket, raw).await;
        let _ = tx.send((label, ticket.tenant(), raw, p));
    });
}

/// Everything admitted so far.
fn drain(rx: &mut mpsc::UnboundedReceiver<Admitted>) -> Vec<Admitted> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// Admits at once (no other task needs to run).
async fn now(gate: &Gate, class: Class, who: Tenant, raw: u32) -> Permit {
    let t = Ticket::new(class, who);
    tokio::time::timeout(Duration::ZERO, gate.admit(&t, raw))
        .await
        .expect("not admitted at once")
}

#[tokio::test(start_paused = true)]
async fn a_demand_goes_ahead_of_twenty_queued_background_requests() {
    let gate = Gate::new(FixedLink(None));
    assert_eq!(gate.cap(), MIN_CAP);
    let (tx, mut rx) = mpsc::unbounded_channel();
    // One chunk fills the cap (its estimate is half its bytes).
    let first = now(&gate, Class::Background, Tenant::LOCAL, MIB).await;
    for _ in 0..20 {
        ask(&gate, Class::Background, Tenant::LOCAL, MIB, "bg", &tx);
    }
    settle().await;
    assert!(drain(&mut rx).is_empty());
    assert_eq!(gate.stats().queued, 20);
    let demand = now(&gate, Class::Demand, Tenant::LOCAL, MIB).await;
    assert_eq!(demand.class(), Some(Class::Demand));
    let s = gate.stats();
    assert_eq!((s.queued, s.background.waits, s.demand.waits), (20, 20, 0));
    assert_eq!(s.demand.admitted_bytes, u64::from(MIB));
    // Demand bytes are not lower-class bytes: the background queue still
    // waits for `first` only.
    demand.done(u64::from(MIB / 2));
    settle().await;
    assert!(drain(&mut rx).is_empty());
    first.done(u64::from(MIB / 2));
    settle().await;
    assert_eq!(drain(&mut rx).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn lower_class_bytes_in_flight_never_exceed_the_cap() {
    // 1 MB in 10 ms: a cap of 2 BDP, 2 MB.
    let gate = Gate::new(link(10, 100));
    let cap = gate.cap();
    // Two BDPs and one chunk's estimate (half a chunk) more.
    assert_eq!(cap, 2_000_000 + u64::from(MIB / 2));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sizes = [64 << 10, MIB, 300 << 10, MIB, 8 << 10, 700 << 10];
    for i in 0..60 {
        let class = [Class::Bulk, Class::Background, Class::Profile][i % 3];
        let who = tenant(1 + (i % 2) as u64);
        ask(&gate, class, who, sizes[i % sizes.len()], "low", &tx);
    }
    let mut in_flight = VecDeque::new();
    let (mut admitted, mut most) = (0, 0);
    while admitted < 60 {
        settle().await;
        for a in drain(&mut rx) {
            in_flight.push_back(a);
            admitted += 1;
        }
        let s = gate.stats();
        most = most.max(s.low_in_flight_bytes);
        assert!(
            s.low_in_flight_bytes <= cap,
            "{} bytes in flight over a cap of {cap}",
            s.low_in_flight_bytes
        );
        let (_, _, raw, p) = in_flight.pop_front().expect("nothing admitted");
        p.done(u64::from(raw / 2));
    }
    assert!(most > cap / 2, "the cap was never near full: {most}");
}

#[tokio::test(start_paused = true)]
async fn profile_goes_before_background_before_bulk() {
    let gate = Gate::new(FixedLink(None));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = now(&gate, Class::Bulk, Tenant::LOCAL, MIB).await;
    ask(&gate, Class::Bulk, Tenant::LOCAL, MIB, "bulk", &tx);
    settle().await;
    ask(
        &gate,
        Class::Background,
        Tenant::LOCAL,
        MIB,
        "background",
        &tx,
    );
    settle().await;
    ask(&gate, Class::Profile, Tenant::LOCAL, MIB, "profile", &tx);
    settle().await;
    let mut order = Vec::new();
    let mut held = first;
    for _ in 0..3 {
        held.done(u64::from(MIB / 2));
        settle().await;
        let mut got = drain(&mut rx);
        assert_eq!(got.len(), 1, "one chunk fills the cap");
        let (label, _, _, p) = got.pop().unwrap();
        order.push(label);
        held = p;
    }
    assert_eq!(order, ["profile", "background", "bulk"]);
}

#[tokio::test(start_paused = true)]
async fn a_raise_moves_a_waiter_up() {
    let gate = Gate::new(FixedLink(None));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = now(&gate, Class::Background, Tenant::LOCAL, MIB).await;
    ask(
        &gate,
        Class::Background,
        Tenant::LOCAL,
        MIB,
        "background",
        &tx,
    );
    settle().await;
    let bulk = ask(&gate, Class::Bulk, Tenant::LOCAL, MIB, "raised", &tx);
    let stuck = ask(&gate, Class::Bulk, Tenant::LOCAL, MIB, "demand", &tx);
    settle().await;
    bulk.raise(Class::Profile);
    // Never lowered.
    bulk.raise(Class::Bulk);
    assert_eq!(bulk.class(), Class::Profile);
    assert!(!bulk.admitted());
    settle().await;
    assert!(drain(&mut rx).is_empty(), "the cap is still full");
    first.done(u64::from(MIB / 2));
    settle().await;
    let got = drain(&mut rx);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "raised");
    assert!(bulk.admitted());
    // Raised to demand, a waiter goes at once, cap or not.
    stuck.raise(Class::Demand);
    settle().await;
    let got = drain(&mut rx);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0, got[0].3.class()),
        ("demand", Some(Class::Demand))
    );
}

#[tokio::test(start_paused = true)]
async fn with_nothing_in_flight_a_request_larger_than_the_cap_goes() {
    let gate = Gate::new(link(40, 1000));
    assert_eq!(gate.cap(), MAX_CAP);
    // Estimated at 32 MiB, twice the cap.
    let big = now(&gate, Class::Bulk, Tenant::LOCAL, 64 * MIB).await;
    assert_eq!(gate.stats().low_in_flight_bytes, u64::from(32 * MIB));
    let (tx, mut rx) = mpsc::unbounded_channel();
    ask(&gate, Class::Bulk, Tenant::LOCAL, 64 << 10, "small", &tx);
    settle().await;
    assert!(drain(&mut rx).is_empty(), "over the cap already");
    drop(big);
    settle().await;
    assert_eq!(drain(&mut rx).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_permit_dropped_without_done_releases_its_bytes() {
    let gate = Gate::new(FixedLink(None));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = now(&gate, Class::Background, Tenant::LOCAL, MIB).await;
    assert_eq!(gate.stats().low_in_flight_bytes, u64::from(MIB / 2));
    ask(
        &gate,
        Class::Background,
        Tenant::LOCAL,
        2 * MIB,
        "next",
        &tx,
    );
    settle().await;
    assert!(drain(&mut rx).is_empty());
    drop(first);
    settle().await;
    let got = drain(&mut rx);
    assert_eq!(got.len(), 1);
    // Only the next one's estimate is left, at the first ratio: nothing
    // was learnt from the dropped one.
    assert_eq!(gate.stats().low_in_flight_bytes, u64::from(MIB));
    drop(got);
    let s = gate.stats();
    assert_eq!((s.low_in_flight_bytes, s.queued), (0, 0));
    assert!(lock_state(&gate).tenants.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_admit_given_up_while_queued_leaves_nothing() {
    let gate = Gate::new(FixedLink(None));
    let first = now(&gate, Class::Background, tenant(1), MIB).await;
    let t = Ticket::new(Class::Background, tenant(2));
    let gave_up = tokio::time::timeout(Duration::from_secs(1), gate.admit(&t, MIB)).await;
    assert!(gave_up.is_err());
    assert_eq!(gate.stats().queued, 0);
    first.done(u64::from(MIB / 2));
    assert!(lock_state(&gate).tenants.is_empty());
    assert!(lock_state(&gate).low.iter().all(|q| q.ring.is_empty()));
}

fn lock_state(gate: &Gate) -> MutexGuard<'_, GateState> {
    gate.shared.lock()
}

/// Requests admitted and not yet ended, oldest first.
type Held = VecDeque<(u32, Permit)>;

/// Ends the oldest request held and takes those admitted then, over and
/// over, noting who got each and its estimate, until `stop` says so.
async fn turns(
    rx: &mut mpsc::UnboundedReceiver<Admitted>,
    held: &mut Held,
    mut stop: impl FnMut(&[(Tenant, u64)]) -> bool,
) -> Vec<(Tenant, u64)> {
    let mut got = Vec::new();
    loop {
        let (raw, p) = held.pop_front().expect("nothing in flight");
        p.done(u64::from(raw / 2));
        settle().await;
        for (_, who, raw, p) in drain(rx) {
            got.push((who, u64::from(raw / 2)));
            held.push_back((raw, p));
            if stop(&got) {
                return got;
            }
        }
    }
}

fn bytes_of(got: &[(Tenant, u64)], who: Tenant) -> u64 {
    got.iter().filter(|g| g.0 == who).map(|g| g.1).sum()
}

#[tokio::test(start_paused = true)]
async fn backlogged_tenants_get_equal_bytes_however_many_they_queue() {
    let gate = Gate::new(FixedLink(None));
    let (a, b) = (tenant(1), tenant(2));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = now(&gate, Class::Background, a, MIB).await;
    // A queues four times as many requests, and half as large.
    for _ in 0..80 {
        ask(&gate, Class::Background, a, MIB / 2, "a", &tx);
    }
    settle().await;
    for _ in 0..10 {
        ask(&gate, Class::Background, b, MIB, "b", &tx);
    }
    settle().await;
    let mut b_left = 10;
    let mut held = Held::from([(MIB, first)]);
    let got = turns(&mut rx, &mut held, |got| {
        if got.last().unwrap().0 == b {
            b_left -= 1;
        }
        b_left == 0
    })
    .await;
    let quantum = u64::from(MIB / 2);
    let (ab, bb) = (bytes_of(&got, a), bytes_of(&got, b));
    assert_eq!(bb, 10 * quantum);
    assert!(ab.abs_diff(bb) <= quantum, "a {ab}, b {bb}");
}

#[tokio::test(start_paused = true)]
async fn a_late_tenant_gets_its_share_at_once() {
    let gate = Gate::new(FixedLink(None));
    let (a, b, c) = (tenant(1), tenant(2), tenant(3));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = now(&gate, Class::Background, a, MIB).await;
    for who in [a, b] {
        for _ in 0..40 {
            ask(&gate, Class::Background, who, MIB, "early", &tx);
        }
        settle().await;
    }
    let mut held = Held::from([(MIB, first)]);
    let got = turns(&mut rx, &mut held, |got| got.len() == 10).await;
    assert_eq!(bytes_of(&got, a), bytes_of(&got, b));
    for _ in 0..10 {
        ask(&gate, Class::Background, c, MIB, "late", &tx);
    }
    settle().await;
    let got = turns(&mut rx, &mut held, |got| got.len() == 12).await;
    // C's first turn comes within one round of the others...
    let first_c = got.iter().position(|g| g.0 == c).expect("c never served");
    assert!(first_c <= 2, "c waited {first_c} turns");
    // ...and from then on, the three share alike.
    for who in [a, b, c] {
        let n = bytes_of(&got[first_c..], who);
        assert!(
            n.abs_diff(u64::from(MIB / 2) * 4) <= u64::from(MIB / 2),
            "{who:?}: {n}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn several_tenants_share_demand_calls() {
    let gate = Gate::new(FixedLink(None));
    let (a, b) = (tenant(1), tenant(2));
    // Alone, a tenant gets everything.
    let mut alone = Vec::new();
    for _ in 0..40 {
        alone.push(now(&gate, Class::Demand, a, 8 << 10).await);
    }
    drop(alone);
    // With another active, at most DEMAND_SHARE / 2 each.
    let _other = now(&gate, Class::Background, b, MIB).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..40 {
        ask(&gate, Class::Demand, a, 8 << 10, "a", &tx);
    }
    settle().await;
    let mut held = drain(&mut rx);
    assert_eq!(held.len(), DEMAND_SHARE / 2);
    // B's demand still goes at once.
    let _b = now(&gate, Class::Demand, b, 8 << 10).await;
    held.truncate(held.len() - 3);
    settle().await;
    assert_eq!(drain(&mut rx).len(), 3);
}

/// A link the gate's own traffic is measured on: a real estimator, a least
/// round trip of 40 ms (a small call's), and chunk calls that take 60 ms
/// more (a far link behind the server, as a node's LAN proxy has) and
/// their transfer at 125 MB/s. A cap of two BDPs alone settles at one
/// chunk in flight: the rate it measures is one chunk per 108 ms.
#[tokio::test(start_paused = true)]
async fn a_rate_measured_under_the_cap_grows_past_one_chunk() {
    const RTT: Duration = Duration::from_millis(40);
    const FAR: Duration = Duration::from_millis(60);
    let link = LinkHandle::new();
    let small = link.sent();
    tokio::time::sleep(RTT).await;
    link.replied(small, 128);
    let gate = Gate::new(link.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Incompressible chunks (their wire bytes are their raw bytes), more
    // than the test's 6 s can carry.
    for _ in 0..1000 {
        ask(&gate, Class::Background, Tenant::LOCAL, MIB, "bg", &tx);
    }
    let transfer = Duration::from_micros(u64::from(MIB) * 1_000_000 / 125_000_000);
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut most_late = 0;
    while start.elapsed() < Duration::from_secs(6) {
        for (_, _, raw, permit) in drain(&mut rx) {
            let (link, in_flight) = (link.clone(), in_flight.clone());
            in_flight.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let sent = link.sent();
                tokio::time::sleep(RTT + FAR + transfer).await;
                link.replied(sent, u64::from(raw));
                in_flight.fetch_sub(1, Ordering::SeqCst);
                permit.done(u64::from(raw));
            });
        }
        if start.elapsed() > Duration::from_secs(3) {
            most_late = most_late.max(in_flight.load(Ordering::SeqCst));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        most_late >= 3,
        "at most {most_late} chunks in flight after 3 s (cap {})",
        gate.cap()
    );
}

#[tokio::test(start_paused = true)]
async fn while_a_guest_waits_background_and_bulk_fill_only_what_it_leaves() {
    // 40 ms at 6 MB/s: a BDP of 240,000 bytes; 20 ms of it is 120,000
    // wire bytes, 240,000 raw at the first ratio: three 64 KiB parts.
    let gate = Gate::new(link(40, 6));
    assert_eq!(gate.part(), CHUNK, "nobody waits yet");
    let wide = gate.cap();
    assert_eq!(wide, 2 * 240_000 + u64::from(MIB) / 2);
    let demand = now(&gate, Class::Demand, Tenant::LOCAL, 8192).await;
    let part = gate.part();
    assert_eq!(part, 3 * MIN_PART);
    let narrow = gate.stats().urgent_cap_bytes;
    assert_eq!(narrow, 240_000 + u64::from(part) / 2);
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..8 {
        ask(&gate, Class::Bulk, tenant(1), part, "bulk", &tx);
    }
    settle().await;
    let mut bulk = drain(&mut rx);
    let est = u64::from(part) / 2;
    assert_eq!(
        bulk.len() as u64,
        (narrow - 4096) / est,
        "within one BDP and a part, the demand's bytes counted"
    );
    // The profile keeps the wide cap, and while it is in flight no more
    // bulk goes: the profile has the link.
    ask(&gate, Class::Profile, tenant(2), MIB, "profile", &tx);
    settle().await;
    let profile = drain(&mut rx);
    assert_eq!(profile.len(), 1);
    if let Some((_, _, _, p)) = bulk.pop() {
        p.done(est);
    }
    settle().await;
    assert!(drain(&mut rx).is_empty(), "bulk went beside the profile");
    // Demand and profile end; a hold later the rest goes within the wide
    // cap, in whole chunks from then on.
    demand.done(4096);
    for (_, _, _, p) in profile {
        p.done(u64::from(MIB) / 2);
    }
    // Within the hold, bulk fills one BDP and a part again.
    settle().await;
    let within = drain(&mut rx);
    assert_eq!(within.len(), 1, "{:?}", gate.stats());
    tokio::time::sleep(URGENT_HOLD).await;
    assert_eq!(gate.part(), CHUNK);
    if let Some((_, _, _, p)) = bulk.pop() {
        p.done(est);
    }
    settle().await;
    let more = drain(&mut rx);
    assert_eq!(more.len(), 8 - 3 - 1, "{:?}", gate.stats());
}

#[tokio::test(start_paused = true)]
async fn an_nfs_call_on_the_link_has_background_asked_in_parts() {
    let link = LinkHandle::new();
    let sent = link.sent();
    tokio::time::sleep(Duration::from_millis(40)).await;
    link.replied(sent, 240_000);
    let gate = Gate::new(link.clone());
    assert_eq!(gate.part(), CHUNK);
    let call = link.foreground();
    assert!(gate.part() < CHUNK, "an NFS call in flight");
    drop(call);
    assert!(gate.part() < CHUNK, "within the hold");
    tokio::time::sleep(URGENT_HOLD).await;
    assert_eq!(gate.part(), CHUNK);
}

#[tokio::test(start_paused = true)]
async fn across_a_short_round_trip_chunks_are_never_cut() {
    // 2 ms at 6 MB/s: 20 ms of the link would be a part of three pieces,
    // but a round trip under PART_MIN_RTT keeps chunks whole.
    let gate = Gate::new(link(2, 6));
    let _demand = now(&gate, Class::Demand, Tenant::LOCAL, 8192).await;
    assert_eq!(gate.part(), CHUNK);
    let gate = Gate::new(link(PART_MIN_RTT.as_millis() as u64, 6));
    let _demand = now(&gate, Class::Demand, Tenant::LOCAL, 8192).await;
    assert!(gate.part() < CHUNK, "a WAN's round trip");
}

//! The state of one file's fetch: which chunks are here, which are being
//! fetched and by whom, and how the background stream, readers' own
//! fetches and the rests of chunks behind them share the link.
//!
//! Everything here belongs to one [`FetchState`], one per entry. Its rules:
//!
//! - **The chunks mutex** guards [`Chunks`]: each chunk's [`Chunk`] state
//!   and, for chunks not whole yet, their [`Pieces`] (`here`, `fetching`,
//!   `streaming`). Whoever fetches something claims it under this lock
//!   first, so nothing is fetched twice at once: a whole chunk goes
//!   `Missing -> InFlight` ([`claim_next`](FetchState::claim_next), or a
//!   reader's [`plan`](FetchState::plan)), pieces get their `fetching`
//!   bits ([`claim_pieces`](FetchState::claim_pieces), or a reader's plan),
//!   the rest of a chunk behind a reader gets `streaming` (the background
//!   stream then passes the chunk over). The fetch that claimed something
//!   ends it under the lock: a whole chunk becomes `Present` or `Missing`
//!   again ([`set`](FetchState::set)), pieces leave `fetching` and join
//!   `here` if they arrived, and a chunk whose pieces are all here becomes
//!   `Present` ([`pieces_ended`](FetchState::pieces_ended)). `Zero` chunks
//!   are never fetched; a WRITE turns those it touches into `Present`, and
//!   one growing the file adds `Present` chunks. The lock is held for
//!   short sections, never across an `.await`. It may be taken while the
//!   entry's learning is locked (not the other way round), and the
//!   entry's versions may be locked under it.
//! - **The failed mutex** holds why the fetch was abandoned: set once, by
//!   the first failure ([`fail`](FetchState::fail)), never cleared. Every
//!   waiter checks it after each signal; a failed entry is let go.
//! - **The watch channel** (`changed`) is a counter bumped after every
//!   change someone may wait for: a chunk's state set, a run of pieces
//!   ended (arrived or given back), the fetch failed, a rest behind a
//!   reader ended (its place on the link is free). Those who wait
//!   subscribe before they look, so no bump is missed: readers waiting for
//!   chunks others fetch (`ensure`), the rest of a chunk waiting for the
//!   pieces others fetch (`fetch_rest`), and the background stream, held
//!   back by readers' fetches or, at the end, waiting for their chunks
//!   and for pieces given back, claimable again (`fetch_all`).
//! - **The atomics** steer the background stream; none guards data:
//!   - `demand_in_flight`: readers' own fetches under way;
//!   - `last_demand_ms`: when a reader's own fetch last ended (ms since
//!     `born`, plus 1; 0: never). With `demand_in_flight` it makes
//!     [`demand_active`](FetchState::demand_active): the stream then keeps
//!     only `UNDER_DEMAND` chunks in flight;
//!   - `behind_in_flight`: rests of chunks fetched behind readers' pieces,
//!     under way: they take the background stream's place on the link;
//!   - `follow`: the chunk after the last one a reader fetched itself,
//!     plus 1 (0: none yet): where the stream goes on from, because a
//!     guest faulting its memory in walks through regions of it;
//!   - `profiled`: whether the stream follows a working-set profile (set
//!     once it knows): a reader's fault then fetches only the pieces it
//!     needs; without one, also the rest of their chunk behind them;
//!   - `stream_class`: the class the background stream's chunks go as:
//!     [`Class::Background`], or [`Class::Bulk`] while the only reader is
//!     sequential (a copy, `seq.rs`) or the first proxy that asked for the
//!     file asked as bulk; any later request above bulk raises it again
//!     ([`note_class`](FetchState::note_class)).
//!
//! **Claims are exact.** A run of pieces is claimed only where none is
//! being fetched (`pieces::claim_runs`): a reader's pieces between others'
//! in-flight ones (or pieces kept from before a restart, `kept`) become
//! runs of their own, so no piece is fetched twice at once, and the fetch that ends a run gives back only the pieces it
//! claimed, never another's. (A run widened to whole hashed pieces, for
//! dedup, may fetch a neighbour's pieces again, but still gives back only
//! its own.)

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gvfs_ext::{Class, Tenant, Ticket, Want};
use gvfs_nfs::layer::lock;
use tokio::sync::watch;

use crate::chunks::{Chunk, Chunks, Pieces, chunk_len, chunks_of};
use crate::error::FileCacheError;
use crate::pieces::{Mask, all_pieces, claim_runs, piece_mask};
use crate::seq::SeqReads;

/// How long after a reader's own fetch the background stream stays at
/// `UNDER_DEMAND`.
pub(crate) const DEMAND_HOLD_MS: u64 = 300;

/// How far one file's fetch has come (see the module doc for its rules).
#[derive(Debug)]
pub(crate) struct FetchState {
    chunks: Mutex<Chunks>,
    failed: Mutex<Option<FileCacheError>>,
    /// Bumped whenever a chunk or pieces arrive, the fetch fails, or a
    /// rest behind a reader ends.
    changed: watch::Sender<u64>,
    /// When the entry was made: the clock of `last_demand_ms`.
    born: Instant,
    last_demand_ms: AtomicU64,
    demand_in_flight: AtomicUsize,
    behind_in_flight: AtomicUsize,
    follow: AtomicUsize,
    profiled: AtomicBool,
    /// The class of the background stream's chunks (a [`Class`] as `u8`).
    stream_class: AtomicU8,
    /// Whom the entry's own fetches (the background stream) are for: who
    /// started it.
    pub(crate) owner: Tenant,
    /// The run of in-order READs its readers are in (`seq.rs`), which
    /// sets `stream_class` while they copy the file.
    pub(crate) seq: Mutex<SeqReads>,
    /// The tickets of the fetches under way, by chunk, with the bytes each
    /// fetches: a reader who comes to wait for some of them raises it to
    /// its class ([`raise`](Self::raise)).
    tickets: Mutex<HashMap<usize, Vec<Underway>>>,
}

/// The bytes a fetch under way fetches, and its ticket.
type Underway = (Range<u64>, Arc<Ticket>);

/// A fetch's ticket, known to its [`FetchState`] until dropped.
pub(crate) struct Ticketed<'a> {
    state: &'a FetchState,
    idx: usize,
    ticket: Arc<Ticket>,
}

impl Drop for Ticketed<'_> {
    fn drop(&mut self) {
        let mut tickets = lock(&self.state.tickets);
        if let Some(list) = tickets.get_mut(&self.idx) {
            list.retain(|(_, t)| !Arc::ptr_eq(t, &self.ticket));
            if list.is_empty() {
                tickets.remove(&self.idx);
            }
        }
    }
}

/// A fetch a reader's wait starts.
pub(crate) struct Planned {
    pub(crate) idx: usize,
    /// The pieces, claimed; `None`: the chunk (claimed whole).
    pub(crate) pieces: Option<Mask>,
    /// Whether the reader waits for it to end, not only for its bytes.
    pub(crate) wait: bool,
}

impl Planned {
    fn waited(idx: usize, pieces: Option<Mask>) -> Self {
        Planned {
            idx,
            pieces,
            wait: true,
        }
    }
}

impl FetchState {
    /// A fetch of chunks in these states, nothing under way, for `owner`;
    /// its background stream goes as `stream` (bulk, else background).
    pub(crate) fn new(chunks: Vec<Chunk>, owner: Tenant, stream: Class) -> Self {
        let stream = stream.min(Class::Background);
        Self {
            chunks: Mutex::new(Chunks::new(chunks)),
            failed: Mutex::new(None),
            changed: watch::channel(0).0,
            born: Instant::now(),
            last_demand_ms: AtomicU64::new(0),
            demand_in_flight: AtomicUsize::new(0),
            behind_in_flight: AtomicUsize::new(0),
            follow: AtomicUsize::new(0),
            profiled: AtomicBool::new(false),
            stream_class: AtomicU8::new(stream as u8),
            owner,
            seq: Mutex::new(SeqReads::default()),
            tickets: Mutex::new(HashMap::new()),
        }
    }

    /// `want` under a new ticket, kept under chunk `idx` while the
    /// returned guard lives (a fetch of `bytes`, some of chunk `idx`).
    pub(crate) fn ticket(
        &self,
        idx: usize,
        bytes: Range<u64>,
        want: &Want,
    ) -> (Want, Ticketed<'_>) {
        let (want, ticket) = want.ticketed();
        lock(&self.tickets)
            .entry(idx)
            .or_default()
            .push((bytes, ticket.clone()));
        let guard = Ticketed {
            state: self,
            idx,
            ticket,
        };
        (want, guard)
    }

    /// A reader of `class` waits for `offset..end`: the fetches of those
    /// bytes under way, still queued at a lower class, go as `class`.
    pub(crate) fn raise(&self, offset: u64, end: u64, class: Class) {
        let tickets = lock(&self.tickets);
        if tickets.is_empty() {
            return;
        }
        let (first, last) = chunks_of(offset, end);
        for idx in first..=last {
            for (bytes, t) in tickets.get(&idx).into_iter().flatten() {
                if bytes.start < end && offset < bytes.end {
                    t.raise(class);
                }
            }
        }
    }

    /// The chunks, locked.
    pub(crate) fn chunks(&self) -> MutexGuard<'_, Chunks> {
        lock(&self.chunks)
    }

    /// A receiver of the changes from now on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Tells those who wait that something changed.
    fn signal(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Milliseconds since the entry was made (for logs).
    pub(crate) fn since_born_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Whether every chunk has arrived.
    pub(crate) fn complete(&self) -> bool {
        self.chunks().iter().all(|c| c.here())
    }

    /// Why the fetch was abandoned, if it was.
    pub(crate) fn failure(&self) -> Option<FileCacheError> {
        lock(&self.failed).clone()
    }

    /// Abandons the fetch of the file at `path` (the first reason stays).
    pub(crate) fn fail(&self, why: FileCacheError, path: &Path) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            tracing::warn!(file = %path.display(), "file cache fetch abandoned: {why}");
            *f = Some(why);
        }
        drop(f);
        self.signal();
    }

    /// Claims the first chunk at or after `from` that nobody fetches yet.
    pub(crate) fn claim_next(&self, from: usize) -> Option<usize> {
        let mut chunks = self.chunks();
        let idx = (from..chunks.len()).find(|&i| {
            chunks[i] == Chunk::Missing && !chunks.pieces.get(&i).is_some_and(|p| p.streaming)
        })?;
        chunks[idx] = Chunk::InFlight;
        Some(idx)
    }

    /// Sets chunk `idx`'s state (a whole chunk's fetch ended).
    pub(crate) fn set(&self, idx: usize, state: Chunk) {
        let mut chunks = self.chunks();
        chunks[idx] = state;
        if state.here() {
            chunks.pieces.remove(&idx);
        }
        drop(chunks);
        self.signal();
    }

    /// Claims the pieces of `mask` in chunk `idx` that are neither here nor
    /// being fetched, as runs (`pieces::claim_runs`), if the chunk is not
    /// being fetched whole.
    pub(crate) fn claim_pieces(&self, idx: usize, mask: Mask) -> Vec<Mask> {
        let mut chunks = self.chunks();
        if chunks.get(idx) != Some(&Chunk::Missing) {
            return Vec::new();
        }
        let p = chunks.pieces.entry(idx).or_default();
        let runs = claim_runs(mask & !p.here & !p.fetching, p.fetching | p.kept);
        for run in &runs {
            p.fetching |= run;
        }
        runs
    }

    /// Ends the fetch of the pieces `fetched` of chunk `idx` (`len`
    /// bytes), which claimed `claimed` of them: here if they `arrived`,
    /// the claim given back either way; the chunk is whole once all its
    /// pieces are here.
    pub(crate) fn pieces_ended(
        &self,
        idx: usize,
        len: u32,
        claimed: Mask,
        fetched: Mask,
        arrived: bool,
    ) {
        {
            let mut chunks = self.chunks();
            let whole = chunks.get(idx).is_some_and(|c| c.here());
            let p = chunks.pieces.entry(idx).or_default();
            p.fetching &= !claimed;
            if arrived {
                p.here |= fetched;
            }
            let done = p.here & all_pieces(len) == all_pieces(len);
            if whole || (done && chunks[idx] == Chunk::Missing) {
                chunks[idx] = Chunk::Present;
                chunks.pieces.remove(&idx);
            }
        }
        self.signal();
    }

    /// Ends the check of the pieces `kept` of chunk `idx` (`len` bytes),
    /// kept from before a restart and claimed since: those `good` are here
    /// (and no run is joined over them: they are not fetched again), the
    /// rest given back to be fetched.
    pub(crate) fn kept_checked(&self, idx: usize, len: u32, kept: Mask, good: Mask) {
        if let Some(p) = self.chunks().pieces.get_mut(&idx) {
            p.kept |= good & kept;
        }
        self.pieces_ended(idx, len, kept, good & kept, true);
    }

    /// The pieces of chunk `idx` here and being fetched (none when it has
    /// no pieces).
    pub(crate) fn pieces(&self, idx: usize) -> Pieces {
        self.chunks().pieces.get(&idx).copied().unwrap_or_default()
    }

    /// The rest of chunk `idx` behind a reader's pieces is no longer
    /// fetched a run at a time.
    pub(crate) fn stop_streaming(&self, idx: usize) {
        if let Some(p) = self.chunks().pieces.get_mut(&idx) {
            p.streaming = false;
        }
    }

    /// What `offset..end` of a file of `size` bytes still needs: fetches to
    /// start, claimed here (a chunk's pieces for a reader, else one whole
    /// chunk), and whether some of it is on its way.
    pub(crate) fn plan(
        &self,
        offset: u64,
        end: u64,
        size: u64,
        class: Class,
    ) -> (Vec<Planned>, bool) {
        let (first, last) = chunks_of(offset, end);
        let mut fetch: Vec<Planned> = Vec::new();
        let mut waiting = false;
        let mut chunks = self.chunks();
        let last = last.min(chunks.len().saturating_sub(1));
        for idx in first..=last {
            let state = chunks[idx];
            if state.here() {
                continue;
            }
            let len = chunk_len(size, idx);
            let want = piece_mask(idx, len, offset, end);
            let p = chunks.pieces.get(&idx).copied().unwrap_or_default();
            if p.here & want == want {
                continue;
            }
            waiting = true;
            // A reader fetches the pieces it needs. A reader of a file
            // with no working-set profile (an image never cloned here)
            // faults all over it: the rest of the chunk comes right behind
            // its pieces (not waited for), so its next faults nearby find
            // their bytes here, and the background stream goes on after
            // it. With a profile, the profile brings the rest.
            let demand = class == Class::Demand;
            let pieces = class == Class::Profile || demand;
            let rest = demand && !self.profiled.load(Ordering::Acquire);
            if demand {
                self.follow.store(idx + 2, Ordering::Release);
            }
            let whole_planned = fetch.iter().any(|f| f.pieces.is_none());
            match state {
                Chunk::Missing if pieces => {
                    for run in claim_runs(want & !p.here & !p.fetching, p.fetching | p.kept) {
                        chunks.pieces.entry(idx).or_default().fetching |= run;
                        fetch.push(Planned::waited(idx, Some(run)));
                    }
                    let p = chunks.pieces.entry(idx).or_default();
                    if rest && !p.streaming {
                        p.streaming = true;
                        fetch.push(Planned {
                            idx,
                            pieces: None,
                            wait: false,
                        });
                    }
                }
                Chunk::Missing if !whole_planned => {
                    chunks[idx] = Chunk::InFlight;
                    fetch.push(Planned::waited(idx, None));
                }
                _ => {}
            }
        }
        (fetch, waiting)
    }

    /// A reader's own fetch starts.
    pub(crate) fn demand_started(&self) {
        self.demand_in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A reader's own fetch ended.
    pub(crate) fn demand_ended(&self) {
        self.last_demand_ms
            .store(self.since_born_ms() + 1, Ordering::Release);
        self.demand_in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether readers fetched chunks of their own lately: the background
    /// stream then keeps only `UNDER_DEMAND` chunks in flight, so that
    /// what the readers wait for is not queued behind it on the link.
    pub(crate) fn demand_active(&self) -> bool {
        if self.demand_in_flight.load(Ordering::Acquire) > 0 {
            return true;
        }
        let last = self.last_demand_ms.load(Ordering::Acquire);
        last != 0 && (self.since_born_ms() + 1).saturating_sub(last) < DEMAND_HOLD_MS
    }

    /// The rest of a chunk behind a reader's pieces starts.
    pub(crate) fn behind_started(&self) {
        self.behind_in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// The rest of a chunk behind a reader's pieces ended: the background
    /// stream may take its place.
    pub(crate) fn behind_ended(&self) {
        self.behind_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.signal();
    }

    /// Rests of chunks behind readers' pieces under way.
    pub(crate) fn behind(&self) -> usize {
        self.behind_in_flight.load(Ordering::Acquire)
    }

    /// The chunk after the last one a reader fetched itself, plus 1 (0:
    /// none yet).
    pub(crate) fn follow(&self) -> usize {
        self.follow.load(Ordering::Acquire)
    }

    /// The class the background stream's chunks go as.
    pub(crate) fn stream_class(&self) -> Class {
        match self.stream_class.load(Ordering::Acquire) {
            0 => Class::Bulk,
            _ => Class::Background,
        }
    }

    /// A request of `class` came for the file: one above bulk raises the
    /// background stream to [`Class::Background`].
    pub(crate) fn note_class(&self, class: Class) {
        if class > Class::Bulk {
            self.stream_class
                .fetch_max(Class::Background as u8, Ordering::AcqRel);
        }
    }

    /// The file's only reader copies it: the background stream goes as
    /// bulk, behind every other class.
    pub(crate) fn set_bulk(&self) {
        self.stream_class
            .store(Class::Bulk as u8, Ordering::Release);
    }

    /// Says whether the background fetch follows a working-set profile.
    pub(crate) fn set_profiled(&self, profiled: bool) {
        self.profiled.store(profiled, Ordering::Release);
    }
}

//! RPC record marking over a byte stream (RFC 5531 section 11).
//!
//! A record is a sequence of fragments; each fragment starts with a 4-byte
//! big-endian header whose top bit marks the last fragment and whose low 31
//! bits give the fragment length. Both lengths are peer-controlled, so the
//! reader checks them against [`RecordLimits`] before reserving any memory:
//! a fragment or a record over the cap is an error and the caller closes the
//! connection.
//!
//! [`RecordReader`] is sans-IO: feed it bytes as they arrive and take
//! complete records out. [`frame`] builds the header for an outgoing record.

use thiserror::Error;

/// Caps applied to incoming records before any allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLimits {
    /// Largest single fragment accepted, in bytes.
    pub max_fragment: u32,
    /// Largest reassembled record accepted, in bytes.
    pub max_record: u32,
}

impl RecordLimits {
    /// Limits for a peer that may send `max_data` bytes of READ or WRITE
    /// payload in one call, plus room for headers, attributes and handles.
    pub const fn for_payload(max_data: u32) -> Self {
        let max_record = max_data.saturating_add(RECORD_OVERHEAD);
        Self {
            max_fragment: max_record,
            max_record,
        }
    }
}

/// Room for everything in a record besides the READ/WRITE payload: the RPC
/// header with credentials (at most ~1 KiB), handles, attributes, and a
/// READDIR reply's entries beyond its payload.
pub const RECORD_OVERHEAD: u32 = 64 * 1024;

/// Why a byte stream stopped being a valid sequence of records.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// A fragment header announced more than [`RecordLimits::max_fragment`].
    #[error("peer sent an oversized fragment ({len} bytes, limit {limit})")]
    PeerSentOversizedFragment {
        /// Announced fragment length.
        len: u32,
        /// The cap in force.
        limit: u32,
    },
    /// The fragments of one record add up to more than
    /// [`RecordLimits::max_record`].
    #[error("peer sent an oversized record ({len} bytes so far, limit {limit})")]
    PeerSentOversizedRecord {
        /// Record length including the offending fragment.
        len: u64,
        /// The cap in force.
        limit: u32,
    },
}

#[derive(Debug)]
enum State {
    /// Collecting the 4 header bytes of the next fragment.
    Header { have: usize, bytes: [u8; 4] },
    /// Copying `remaining` bytes of a fragment; `last` marks the record end.
    Body { remaining: usize, last: bool },
}

/// Reassembles records from a byte stream, enforcing [`RecordLimits`].
#[derive(Debug)]
pub struct RecordReader {
    limits: RecordLimits,
    state: State,
    record: Vec<u8>,
    ready: Option<Vec<u8>>,
}

impl RecordReader {
    /// A reader that enforces `limits`.
    pub fn new(limits: RecordLimits) -> Self {
        Self {
            limits,
            state: State::Header {
                have: 0,
                bytes: [0; 4],
            },
            record: Vec::new(),
            ready: None,
        }
    }

    /// Consumes bytes from `input` and returns how many were used. Stops
    /// early when a whole record is ready: take it with
    /// [`take_record`](Self::take_record) and feed the rest again.
    pub fn feed(&mut self, mut input: &[u8]) -> Result<usize, RecordError> {
        let start = input.len();
        while !input.is_empty() && self.ready.is_none() {
            match &mut self.state {
                State::Header { have, bytes } => {
                    let n = (4 - *have).min(input.len());
                    bytes[*have..*have + n].copy_from_slice(&input[..n]);
                    *have += n;
                    input = &input[n..];
                    if *have == 4 {
                        let header = u32::from_be_bytes(*bytes);
                        self.begin_fragment(header)?;
                    }
                }
                State::Body { remaining, last } => {
                    let n = (*remaining).min(input.len());
                    self.record.extend_from_slice(&input[..n]);
                    *remaining -= n;
                    input = &input[n..];
                    if *remaining == 0 {
                        let last = *last;
                        self.end_fragment(last);
                    }
                }
            }
        }
        Ok(start - input.len())
    }

    /// The next complete record, if one is ready.
    pub fn take_record(&mut self) -> Option<Vec<u8>> {
        self.ready.take()
    }

    /// True when no partial record is buffered (a clean place for EOF).
    pub fn is_idle(&self) -> bool {
        self.ready.is_none()
            && self.record.is_empty()
            && matches!(self.state, State::Header { have: 0, .. })
    }

    /// When a fragment body is being collected: the record buffer (with room
    /// reserved for the rest of the fragment) and how many bytes the fragment
    /// still needs, so an I/O edge can read them straight into the record.
    /// Report what it appended with [`body_appended`](Self::body_appended).
    pub fn body_slot(&mut self) -> Option<(&mut Vec<u8>, usize)> {
        match self.state {
            State::Body { remaining, .. } if self.ready.is_none() => {
                Some((&mut self.record, remaining))
            }
            _ => None,
        }
    }

    /// Accounts for `n` bytes appended to the record through
    /// [`body_slot`](Self::body_slot) (at most the bytes it said remain).
    pub fn body_appended(&mut self, n: usize) {
        if let State::Body { remaining, last } = &mut self.state {
            *remaining -= n.min(*remaining);
            if *remaining == 0 {
                let last = *last;
                self.end_fragment(last);
            }
        }
    }

    fn begin_fragment(&mut self, header: u32) -> Result<(), RecordError> {
        let last = header & 0x8000_0000 != 0;
        let len = header & 0x7FFF_FFFF;
        if len > self.limits.max_fragment {
            return Err(RecordError::PeerSentOversizedFragment {
                len,
                limit: self.limits.max_fragment,
            });
        }
        let total = self.record.len() as u64 + u64::from(len);
        if total > u64::from(self.limits.max_record) {
            return Err(RecordError::PeerSentOversizedRecord {
                len: total,
                limit: self.limits.max_record,
            });
        }
        // Both caps hold, so this reservation is bounded by max_record
        // (exact: amortized growth could double it).
        self.record.reserve_exact(len as usize);
        if len == 0 {
            self.end_fragment(last);
        } else {
            self.state = State::Body {
                remaining: len as usize,
                last,
            };
        }
        Ok(())
    }

    fn end_fragment(&mut self, last: bool) {
        self.state = State::Header {
            have: 0,
            bytes: [0; 4],
        };
        if last {
            self.ready = Some(std::mem::take(&mut self.record));
        }
    }
}

/// The record-marking header for a single-fragment record of `len` bytes.
///
/// Outgoing records are always sent as one fragment; callers keep them under
/// 2 GiB (they are bounded by the peer's limits long before that).
pub fn frame(len: usize) -> [u8; 4] {
    let len = u32::try_from(len).unwrap_or(u32::MAX) & 0x7FFF_FFFF;
    (len | 0x8000_0000).to_be_bytes()
}

/// Writes `payload` into `out` as one record (header then bytes).
pub fn push_record(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&frame(payload.len()));
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: RecordLimits = RecordLimits {
        max_fragment: 1000,
        max_record: 2500,
    };

    fn read_all(reader: &mut RecordReader, mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let used = reader.feed(bytes)?;
            bytes = &bytes[used..];
            if let Some(r) = reader.take_record() {
                out.push(r);
            }
        }
        Ok(out)
    }

    #[test]
    fn oversized_fragment_is_refused_before_allocation() {
        let mut r = RecordReader::new(LIMITS);
        let err = r.feed(&0xFFFF_FFFFu32.to_be_bytes()).unwrap_err();
        assert!(matches!(
            err,
            RecordError::PeerSentOversizedFragment {
                len: 0x7FFF_FFFF,
                ..
            }
        ));
        assert!(r.record.capacity() < 2500);
    }

    #[test]
    fn oversized_record_over_several_fragments_is_refused() {
        let mut r = RecordReader::new(LIMITS);
        let mut bytes = Vec::new();
        for _ in 0..3 {
            bytes.extend_from_slice(&900u32.to_be_bytes());
            bytes.extend_from_slice(&[7u8; 900]);
        }
        let err = read_all(&mut r, &bytes).unwrap_err();
        assert!(matches!(
            err,
            RecordError::PeerSentOversizedRecord { len: 2700, .. }
        ));
    }

    #[test]
    fn a_record_of_two_fragments_never_holds_more_than_the_cap() {
        // The cap as the proxy sets it: one fragment may be a whole record.
        let limits = RecordLimits {
            max_fragment: 2500,
            max_record: 2500,
        };
        let mut r = RecordReader::new(limits);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&2496u32.to_be_bytes());
        bytes.extend_from_slice(&[7u8; 2496]);
        bytes.extend_from_slice(&(0x8000_0000u32 | 4).to_be_bytes());
        bytes.extend_from_slice(b"last");
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let used = r.feed(rest).unwrap();
            rest = &rest[used..];
            assert!(r.record.capacity() <= 2500, "{}", r.record.capacity());
        }
        let record = r.take_record().unwrap();
        assert_eq!(record.len(), 2500);
        assert!(record.capacity() <= 2500, "{}", record.capacity());
    }

    #[test]
    fn empty_last_fragment_ends_a_record() {
        let mut r = RecordReader::new(LIMITS);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&3u32.to_be_bytes());
        bytes.extend_from_slice(b"abc");
        bytes.extend_from_slice(&0x8000_0000u32.to_be_bytes());
        assert_eq!(read_all(&mut r, &bytes).unwrap(), vec![b"abc".to_vec()]);
        assert!(r.is_idle());
    }

    proptest! {
        /// Any list of records, split into fragments and fed in arbitrary
        /// chunks, comes back out unchanged.
        #[test]
        fn round_trip(records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..2000), 0..5),
                      frag in 1usize..700, chunk in 1usize..300) {
            let mut wire = Vec::new();
            for rec in &records {
                let pieces: Vec<&[u8]> = if rec.is_empty() { vec![&rec[..]] } else { rec.chunks(frag).collect() };
                for (i, p) in pieces.iter().enumerate() {
                    let mut h = p.len() as u32;
                    if i + 1 == pieces.len() { h |= 0x8000_0000; }
                    wire.extend_from_slice(&h.to_be_bytes());
                    wire.extend_from_slice(p);
                }
            }
            let mut r = RecordReader::new(LIMITS);
            let mut got = Vec::new();
            for c in wire.chunks(chunk) {
                let mut c = c;
                while !c.is_empty() {
                    let used = r.feed(c).unwrap();
                    c = &c[used..];
                    if let Some(rec) = r.take_record() { got.push(rec); }
                }
            }
            prop_assert_eq!(got, records);
            prop_assert!(r.is_idle());
        }

        /// Arbitrary bytes never panic and never make the reader hold more
        /// than the record cap.
        #[test]
        fn garbage_is_bounded(bytes in prop::collection::vec(any::<u8>(), 0..4000)) {
            let mut r = RecordReader::new(LIMITS);
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                match r.feed(rest) {
                    Ok(used) => { rest = &rest[used..]; let _ = r.take_record(); }
                    Err(_) => break,
                }
                prop_assert!(r.record.capacity() <= LIMITS.max_record as usize);
            }
        }
    }
}

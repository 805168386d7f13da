//! The tokio edge of record marking: [`RecordStream`] reads whole records
//! from an async byte stream.
//!
//! Headers and small fragments go through a scratch buffer into the sans-IO
//! [`RecordReader`]; a large fragment body (a WRITE call, a READ reply) is
//! read straight into the record, so a megabyte payload is copied once on its
//! way in, not twice.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::record::{RecordError, RecordLimits, RecordReader};

/// Fragment bodies at least this long are read straight into the record.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// Size of the scratch buffer for headers and small records.
const SCRATCH: usize = 64 * 1024;

/// Why a record stream ended with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The peer broke record marking (an oversized fragment or record).
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The connection ended in the middle of a record.
    #[error("connection closed in the middle of a record")]
    Truncated,
    /// Reading failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    /// [`RecordStream::next_within`]: no record began in time (`begun:
    /// false`), or one that began was not finished in time.
    #[error("{}", if *begun { "a record begun was not finished in time" } else { "no record in time" })]
    TimedOut {
        /// Whether part of a record had come.
        begun: bool,
    },
}

/// Reads records from `R`, enforcing [`RecordLimits`].
#[derive(Debug)]
pub struct RecordStream<R> {
    rd: R,
    reader: RecordReader,
    scratch: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> RecordStream<R> {
    /// Wraps `rd`.
    pub fn new(rd: R, limits: RecordLimits) -> Self {
        Self {
            rd,
            reader: RecordReader::new(limits),
            scratch: vec![0; SCRATCH].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Bytes read from the stream but not yet taken into a record (what
    /// follows the last record returned, when it ended mid-buffer).
    pub fn buffered(&self) -> &[u8] {
        &self.scratch[self.start..self.end]
    }

    /// The next record; `None` when the peer closed cleanly between records.
    /// Cancel-safe only in the sense that dropping it loses the connection.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, StreamError> {
        self.read_record(None).await
    }

    /// Like [`next`](Self::next), with two deadlines: the next record must
    /// begin within `wait` and, once its first byte is in, be complete
    /// within `finish` of that byte (a record already begun, bytes of it
    /// buffered, gets `finish` from now). A peer that sends nothing, or
    /// half a record and then nothing, is thus told apart from one that is
    /// slowly sending a large record. Dropping the future mid-record loses
    /// the connection, as with `next`; one that timed out before a record
    /// began ([`StreamError::TimedOut`] with `begun: false`) has lost
    /// nothing and may be called again.
    pub async fn next_within(
        &mut self,
        wait: Duration,
        finish: Duration,
    ) -> Result<Option<Vec<u8>>, StreamError> {
        self.read_record(Some((wait, finish))).await
    }

    /// Whether part of a record has been read (bytes buffered or taken in).
    pub fn in_record(&self) -> bool {
        self.start < self.end || !self.reader.is_idle()
    }

    async fn read_record(
        &mut self,
        limits: Option<(Duration, Duration)>,
    ) -> Result<Option<Vec<u8>>, StreamError> {
        let mut begun = self.in_record();
        // One timer per record, moved once when the record begins.
        let deadline = |begun: bool| {
            limits.map(|(wait, finish)| Instant::now() + if begun { finish } else { wait })
        };
        let mut sleep = std::pin::pin!(deadline(begun).map(tokio::time::sleep_until));
        loop {
            if let Some(rec) = self.reader.take_record() {
                return Ok(Some(rec));
            }
            if self.start < self.end {
                let used = self.reader.feed(&self.scratch[self.start..self.end])?;
                self.start += used;
                continue;
            }
            let read = async {
                if let Some((record, remaining)) = self.reader.body_slot()
                    && remaining >= DIRECT_READ_MIN
                {
                    let n = (&mut self.rd)
                        .take(remaining as u64)
                        .read_buf(record)
                        .await?;
                    return Ok::<_, std::io::Error>((n, true));
                }
                let n = self.rd.read(&mut self.scratch).await?;
                Ok((n, false))
            };
            let (n, direct) = match sleep.as_mut().as_pin_mut() {
                Some(timer) => tokio::select! {
                    biased;
                    r = read => r?,
                    () = timer => return Err(StreamError::TimedOut { begun }),
                },
                None => read.await?,
            };
            if n == 0 {
                return if self.reader.is_idle() {
                    Ok(None)
                } else {
                    Err(StreamError::Truncated)
                };
            }
            if direct {
                self.reader.body_appended(n);
            } else {
                (self.start, self.end) = (0, n);
            }
            if !begun {
                begun = true;
                if let (Some(timer), Some(at)) = (sleep.as_mut().as_pin_mut(), deadline(true)) {
                    timer.reset(at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn reads_small_and_large_records_in_any_split() {
        let (mut tx, rx) = tokio::io::duplex(7000);
        let records: Vec<Vec<u8>> = vec![vec![1; 10], vec![2; 300_000], vec![], vec![3; 70_000]];
        let wire: Vec<u8> = records
            .iter()
            .flat_map(|r| {
                let mut v = crate::record::frame(r.len()).to_vec();
                v.extend_from_slice(r);
                v
            })
            .collect();
        tokio::spawn(async move {
            for chunk in wire.chunks(4999) {
                tx.write_all(chunk).await.unwrap();
            }
        });
        let mut s = RecordStream::new(rx, RecordLimits::for_payload(1 << 20));
        for r in &records {
            assert_eq!(s.next().await.unwrap().as_ref(), Some(r));
        }
        assert!(s.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn eof_inside_a_record_is_an_error() {
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        tx.write_all(&crate::record::frame(100_000)).await.unwrap();
        tx.write_all(&[0; 50_000]).await.unwrap();
        drop(tx);
        let mut s = RecordStream::new(rx, RecordLimits::for_payload(1 << 20));
        assert!(matches!(s.next().await, Err(StreamError::Truncated)));
    }

    /// With paused time the deadlines are checked exactly, not raced.
    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_and_a_half_record_time_out_a_slow_record_does_not() {
        let wait = Duration::from_secs(10);
        let finish = Duration::from_secs(30);
        let limits = RecordLimits::for_payload(1 << 20);

        // Nothing at all: times out after `wait`, nothing begun, and the
        // stream may be asked again.
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut s = RecordStream::new(rx, limits);
        let t0 = Instant::now();
        assert!(matches!(
            s.next_within(wait, finish).await,
            Err(StreamError::TimedOut { begun: false })
        ));
        assert_eq!(t0.elapsed(), wait);
        tx.write_all(&crate::record::frame(3)).await.unwrap();
        tx.write_all(b"abc").await.unwrap();
        assert_eq!(s.next_within(wait, finish).await.unwrap().unwrap(), b"abc");

        // Half a record, then silence: `finish` after its first byte.
        tx.write_all(&crate::record::frame(100)).await.unwrap();
        tx.write_all(&[1; 50]).await.unwrap();
        let t0 = Instant::now();
        assert!(matches!(
            s.next_within(wait, finish).await,
            Err(StreamError::TimedOut { begun: true })
        ));
        assert_eq!(t0.elapsed(), finish);

        // A record that takes longer than `wait` but less than `finish`
        // to arrive, a piece every 5 s, is read whole.
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut s = RecordStream::new(rx, limits);
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(9)).await;
            tx.write_all(&crate::record::frame(40_000)).await.unwrap();
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                tx.write_all(&[7; 10_000]).await.unwrap();
            }
            tx
        });
        let rec = s.next_within(wait, finish).await.unwrap().unwrap();
        assert_eq!(rec, vec![7; 40_000]);
        let _tx = writer.await.unwrap();
    }
}

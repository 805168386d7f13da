//! The tokio edge of record marking: [`RecordStream`] reads whole records
//! from an async byte stream.
//!
//! Headers and small fragments go through a scratch buffer into the sans-IO
//! [`RecordReader`]; a large fragment body (a WRITE call, a READ reply) is
//! read straight into the record, so a megabyte payload is copied once on its
//! way in, not twice.

use tokio::io::{AsyncRead, AsyncReadExt};

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
        loop {
            if let Some(rec) = self.reader.take_record() {
                return Ok(Some(rec));
            }
            if self.start < self.end {
                let used = self.reader.feed(&self.scratch[self.start..self.end])?;
                self.start += used;
                continue;
            }
            if let Some((record, remaining)) = self.reader.body_slot()
                && remaining >= DIRECT_READ_MIN
            {
                let n = (&mut self.rd)
                    .take(remaining as u64)
                    .read_buf(record)
                    .await?;
                if n == 0 {
                    return Err(StreamError::Truncated);
                }
                self.reader.body_appended(n);
                continue;
            }
            let n = self.rd.read(&mut self.scratch).await?;
            if n == 0 {
                return if self.reader.is_idle() {
                    Ok(None)
                } else {
                    Err(StreamError::Truncated)
                };
            }
            (self.start, self.end) = (0, n);
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
}

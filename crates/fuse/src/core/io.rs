//! Reads, writes and COMMITs through open files: the bytes of writes kept
//! until a COMMIT with their verifier covers them (see `crate::writes`).

use super::*;

impl Core {
    /// Reads `size` bytes at `offset` through open file `h`: as many
    /// READs as it takes, up to the end of the file. Noted in the read
    /// trace when there is one.
    pub(crate) async fn read(
        &self,
        caller: &CallContext,
        ino: u64,
        h: u64,
        offset: u64,
        size: u32,
    ) -> Res<Vec<u8>> {
        let Some(trace) = &self.trace else {
            return self.read_through(caller, ino, h, offset, size).await;
        };
        let start = unix_micros();
        let read = self.read_through(caller, ino, h, offset, size).await;
        if !trace.note(ino, offset, size, start, unix_micros()) {
            self.counters.trace_dropped.inc();
        }
        read
    }

    async fn read_through(
        &self,
        caller: &CallContext,
        ino: u64,
        h: u64,
        offset: u64,
        size: u32,
    ) -> Res<Vec<u8>> {
        let fh = self.handle(ino)?;
        let cx = self.io_context(h, caller);
        let size = size.min(gvfs_nfs::proc::MAX_DATA);
        tracing::trace!(ino, offset, size, "read");
        let mut out: Vec<u8> = Vec::new();
        while let Some(at) = offset.checked_add(out.len() as u64) {
            let want = size.saturating_sub(out.len() as u32);
            let r = reply!(
                self.call(&cx, || Ok(NfsRequest::Read(READ3args {
                    file: fh3(&fh),
                    offset: at,
                    count: want
                })))
                .await?,
                Read
            )?;
            let data = r.data.0;
            let got = data.len().min(want as usize);
            if out.is_empty() && (got == size as usize || r.eof) {
                let mut data = data.into_owned();
                data.truncate(got);
                self.counters.read_bytes.add(got as u64);
                return Ok(data);
            }
            out.extend_from_slice(&data[..got]);
            if r.eof || got == 0 || out.len() == size as usize {
                break;
            }
        }
        self.counters.read_bytes.add(out.len() as u64);
        Ok(out)
    }

    /// Writes `data` at `offset` through open file `h`, UNSTABLE, and keeps
    /// the bytes until a COMMIT covers them.
    pub(crate) async fn write(
        &self,
        caller: &CallContext,
        ino: u64,
        h: u64,
        offset: u64,
        data: Vec<u8>,
    ) -> Res<u32> {
        let fh = self.handle(ino)?;
        let cx = self.io_context(h, caller);
        let seq = self.uncommitted.next_seq();
        let count = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        if offset
            .checked_add(u64::from(count))
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(Errno::EFBIG);
        }
        let request = || {
            Ok(NfsRequest::Write(WRITE3args {
                file: fh3(&fh),
                offset,
                count,
                stable: stable_how::UNSTABLE,
                data: Opaque::owned(data.clone()),
            }))
        };
        let r = reply!(self.call(&cx, request).await?, Write)?;
        let written = r.count.min(count);
        self.counters.write_bytes.add(u64::from(written));
        if r.committed != stable_how::FILE_SYNC {
            let mut data = data;
            data.truncate(written as usize);
            let over = self.uncommitted.keep(
                ino,
                &fh,
                &cx,
                Write {
                    seq,
                    offset,
                    data,
                    verf: r.verf.0,
                },
            );
            if over {
                self.commit(ino).await?;
                if self.uncommitted.over_budget() {
                    self.commit_all().await?;
                }
            }
        }
        Ok(written)
    }

    /// Makes `ino`'s writes durable below: COMMIT, and if its verifier is
    /// not the one every write got, the writes again, FILE_SYNC.
    pub(crate) async fn commit(&self, ino: u64) -> Res<()> {
        if !self.uncommitted.has(ino) {
            return Ok(());
        }
        let file_lock = lock(&self.commit_locks).entry(ino).or_default().clone();
        let done = {
            let _one = file_lock.lock().await;
            self.commit_now(ino).await
        };
        let mut locks = lock(&self.commit_locks);
        // The last one out takes the lock away (the map holds one, we one).
        if Arc::strong_count(&file_lock) <= 2 {
            locks.remove(&ino);
        }
        done
    }

    async fn commit_now(&self, ino: u64) -> Res<()> {
        let Some(f) = self.uncommitted.take(ino) else {
            return Ok(());
        };
        self.counters.commits.inc();
        let done = self
            .call(&f.cx, || {
                Ok(NfsRequest::Commit(COMMIT3args {
                    file: fh3(&f.fh),
                    offset: 0,
                    count: 0,
                }))
            })
            .await;
        let verf = match done.and_then(|r| reply!(r, Commit)) {
            Ok(r) => r.verf.0,
            Err(e) => {
                self.uncommitted.put_back(ino, f);
                return Err(e);
            }
        };
        if f.covered_by(verf) {
            self.uncommitted.recycle(f.writes);
            return Ok(());
        }
        // The writes may be lost below: send them again, and the ones
        // kept since, in the order they were first written.
        self.uncommitted.put_back(ino, f);
        let Some(mut f) = self.uncommitted.take(ino) else {
            return Ok(());
        };
        f.writes.sort_by_key(|w| w.seq);
        tracing::warn!(
            writes = f.writes.len(),
            "the write verifier changed before COMMIT: writing again"
        );
        while let Some(w) = f.writes.first() {
            let request = || {
                Ok(NfsRequest::Write(WRITE3args {
                    file: fh3(&f.fh),
                    offset: w.offset,
                    count: w.data.len() as u32,
                    stable: stable_how::FILE_SYNC,
                    data: Opaque::owned(w.data.clone()),
                }))
            };
            let sent = self
                .call(&f.cx, request)
                .await
                .and_then(|r| reply!(r, Write));
            match sent {
                Ok(r)
                    if r.count as usize == w.data.len() && r.committed == stable_how::FILE_SYNC =>
                {
                    self.counters.writes_resent.inc();
                    f.writes.remove(0);
                }
                Ok(_) => {
                    self.uncommitted.put_back(ino, f);
                    return Err(Errno::EIO);
                }
                Err(e) => {
                    self.uncommitted.put_back(ino, f);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Commits every file with writes kept (budget, exit).
    pub(crate) async fn commit_all(&self) -> Res<()> {
        let mut first = Ok(());
        for ino in self.uncommitted.files() {
            if let Err(e) = self.commit(ino).await {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// A copy of a write's bytes (taken before the request's buffer is
    /// reused), in a buffer of an earlier write when one is free.
    pub(crate) fn write_buffer(&self, data: &[u8]) -> Vec<u8> {
        self.uncommitted.buffer(data)
    }
}

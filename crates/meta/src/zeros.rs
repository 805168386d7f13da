//! READs of files with a zero map: zero runs answered here, data runs
//! read below (in parallel), and READs of files held whole.

use super::*;

impl MetaLayer {
    pub(super) async fn read(
        &self,
        cx: &CallContext,
        args: READ3args,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.file.data.to_vec();
        if let (Some(f), Some(copy)) = (self.held_dirty(&fh), &self.copy) {
            // Local writes live only here until they are written back.
            return self
                .read_held(cx, copy, &f, &args)
                .await
                .map_err(ServiceError::from);
        }
        let Some((meta, attrs)) = self.meta_for(cx, &fh).await else {
            return self.forward(cx, NfsRequest::Read(args)).await;
        };
        let size = attrs.size;
        let count = u64::from(args.count.min(MAX_READ));
        if args.offset >= size || count == 0 {
            return self.forward(cx, NfsRequest::Read(args)).await;
        }
        if meta.actions.remote_copy
            && let Some(reply) = self.read_copy(cx, &fh, &meta, &attrs, &args).await
        {
            return Ok(reply);
        }
        let end = (args.offset + count).min(size);
        // Runs of (start, end, zero) over the blocks of the range.
        let bs = u64::from(meta.block_size);
        let mut runs: Vec<(u64, u64, bool)> = Vec::new();
        let mut pos = args.offset;
        while pos < end {
            let block_end = ((pos / bs) + 1) * bs;
            let hi = block_end.min(end);
            let zero = meta.range_is_zero(pos, hi - pos);
            match runs.last_mut() {
                Some(r) if r.2 == zero => r.1 = hi,
                _ => runs.push((pos, hi, zero)),
            }
            pos = hi;
        }
        let runs = merge_short_gaps(runs);
        if runs.iter().all(|r| r.2) {
            // Nothing to read upstream: the reply lends static zeros.
            self.counters.zero_bytes.add(end - args.offset);
            self.counters.zero_reads.add(1);
            return Ok(NfsReply::Read(Nfs3Result::Ok(READ3resok {
                file_attributes: Nfs3Option::Some(attrs),
                count: (end - args.offset) as u32,
                eof: end >= size,
                data: Opaque(zeros((end - args.offset) as usize)),
            })));
        }
        let mut data = vec![0u8; (end - args.offset) as usize];
        let mut zero_bytes = 0;
        let mut last_attrs = Nfs3Option::Some(attrs.clone());
        // The data runs are read concurrently.
        let mut set = tokio::task::JoinSet::new();
        for &(lo, hi, zero) in &runs {
            if zero {
                zero_bytes += hi - lo;
                continue;
            }
            let (inner, cx, file) = (self.inner.clone(), cx.clone(), fh.clone());
            set.spawn(async move { (lo, read_run(inner.as_ref(), &cx, file, lo, hi).await) });
        }
        while let Some(joined) = set.join_next().await {
            let (lo, run) = joined.map_err(ServiceError::layer)?;
            match run? {
                Run::Data {
                    bytes,
                    attrs,
                    reads,
                } => {
                    self.counters.data_reads.add(reads);
                    self.note_post_op(&fh, &attrs);
                    let off = (lo - args.offset) as usize;
                    data[off..off + bytes.len()].copy_from_slice(&bytes);
                    last_attrs = attrs;
                }
                Run::Failed(reply) => return Ok(reply),
            }
        }
        // A data run may have shown the file changed: then start over the
        // normal way rather than mix zeros from an old map into new data.
        if self.meta_for(cx, &fh).await.is_none() {
            return self.forward(cx, NfsRequest::Read(args)).await;
        }
        self.counters.zero_bytes.add(zero_bytes);
        let n = data.len() as u32;
        Ok(NfsReply::Read(Nfs3Result::Ok(READ3resok {
            file_attributes: last_attrs,
            count: n,
            eof: end >= size,
            data: Opaque::owned(data),
        })))
    }
}

/// Zero runs shorter than this between two data runs are read with them:
/// a block cache below (64 KiB blocks by default) fetches whole blocks, so
/// skipping them saves nothing and splits one READ into many.
const MERGE_GAP: u64 = 64 * 1024;

/// `runs` with short zero runs between data runs turned into data.
fn merge_short_gaps(runs: Vec<(u64, u64, bool)>) -> Vec<(u64, u64, bool)> {
    let n = runs.len();
    let mut out: Vec<(u64, u64, bool)> = Vec::with_capacity(n);
    for (i, (lo, hi, zero)) in runs.into_iter().enumerate() {
        let inner = i > 0 && i + 1 < n;
        let zero = zero && !(inner && hi - lo < MERGE_GAP);
        match out.last_mut() {
            Some(r) if r.2 == zero => r.1 = hi,
            _ => out.push((lo, hi, zero)),
        }
    }
    out
}

/// What reading one data run gave.
enum Run {
    Data {
        bytes: Vec<u8>,
        attrs: post_op_attr,
        reads: u64,
    },
    /// A reply other than data: the READ's answer as it is.
    Failed(NfsReply),
}

/// Reads `lo..hi` of `fh` from `inner` (several READs if it answers short).
async fn read_run(
    inner: &dyn NfsService,
    cx: &CallContext,
    fh: Vec<u8>,
    lo: u64,
    hi: u64,
) -> Result<Run, ServiceError> {
    let mut bytes = Vec::with_capacity((hi - lo) as usize);
    let mut attrs = Nfs3Option::None;
    let mut reads = 0;
    while lo + (bytes.len() as u64) < hi {
        let at = lo + bytes.len() as u64;
        reads += 1;
        let req = NfsRequest::Read(READ3args {
            file: nfs_fh3 {
                data: Opaque::owned(fh.clone()),
            },
            offset: at,
            count: (hi - at) as u32,
        });
        match inner.call(cx, req).await? {
            NfsReply::Read(Nfs3Result::Ok(ok)) => {
                let n = ok.data.len().min((hi - at) as usize);
                bytes.extend_from_slice(&ok.data[..n]);
                attrs = ok.file_attributes;
                if n == 0 || ok.eof {
                    break;
                }
            }
            other => return Ok(Run::Failed(other)),
        }
    }
    // A short file: the rest reads as zeros (the buffer is zero-filled).
    bytes.resize((hi - lo) as usize, 0);
    Ok(Run::Data {
        bytes,
        attrs,
        reads,
    })
}

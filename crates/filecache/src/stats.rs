//! What the file cache counts, and the stats it reports: one struct for
//! `gvfsctl stats` and the metrics endpoint.

gvfs_nfs::counters! {
    /// What the file cache counts.
    pub struct Counters => FileCacheCounts {
        /// Whole-file fetches started.
        files_fetched,
        /// Fetches that finished (every chunk arrived).
        files_complete,
        /// Fetches abandoned (upstream error, file changed, local I/O).
        files_failed,
        /// Users that joined a fetch already under way instead of starting one.
        coalesced_fetches,
        /// FETCH calls sent upstream.
        chunks_fetched,
        /// Chunks never fetched because the zero map says they are zeros.
        zero_chunks,
        /// Bytes received on the wire (compressed).
        wire_bytes,
        /// File bytes those chunks held (decompressed).
        raw_bytes,
        /// Reads served from the file cache.
        hits,
        /// Bytes served from the file cache.
        hit_bytes,
        /// Chunks sent to other proxies in a kept frame, compressed by nobody.
        frames_reused,
        /// Chunks compressed here for other proxies (then kept).
        frames_made,
        /// Chunks asked for in parts, not whole, because a guest waited on
        /// a slow link ([`ChunkSource::part`]): no frame of them came from
        /// upstream, so one is made here if another proxy asks for them.
        ///
        /// [`ChunkSource::part`]: gvfs_ext::ChunkSource::part
        parted_chunks,
        /// Runs (ranges not whole chunks) sent to other proxies in a frame
        /// made for a proxy before and kept in memory.
        run_frames_reused,
        /// Wall time of the whole-file fetches that finished, summed, from the
        /// start to the last chunk (microseconds).
        fetch_micros,
        /// Time spent decompressing arrived chunks (microseconds).
        decompress_micros,
        /// File bytes sent as zeros because they repeat earlier bytes, and
        /// copied from those here.
        repeat_bytes,
        /// Files evicted to stay under the budget.
        evicted,
        /// Files written back (compressed, uploaded with STORE).
        written_back_files,
        /// File bytes written back.
        written_back_bytes,
        /// Bytes sent for them (compressed).
        written_back_wire_bytes,
        /// Write-backs stopped because the file had changed at the origin
        /// since it was fetched: the local writes are kept, not stored over it.
        write_back_conflicts,
        /// Wire bytes of chunks fetched because a reader waited for them.
        demand_wire_bytes,
        /// Wire bytes of chunks fetched because a working-set profile
        /// named them.
        profile_wire_bytes,
        /// Wire bytes of chunks fetched by the background stream.
        background_wire_bytes,
        /// Wire bytes of bulk fetches (whole-file copies, sequential readers).
        bulk_wire_bytes,
        /// Reads that waited for a chunk not here yet (faults).
        faults_waited,
        /// Time those reads waited, summed (microseconds).
        fault_wait_micros,
        /// Whole-file fetches that started with a working-set profile.
        profile_hits,
        /// Pieces fetched first because a profile named them.
        profile_pieces,
        /// Working-set profiles learned here and sent upstream.
        profiles_sent,
        /// Learned read orders not kept as profiles: the file was read in
        /// file order (a copy, not a working set).
        profiles_discarded,
        /// Learnings not kept as profiles because readers touched more
        /// than `KEEP_SHARE` of the file's data (most of the image).
        profiles_too_big,
        /// Learnings that found only the profile the fetch started with
        /// (nothing sent).
        profiles_unchanged,
        /// Profiles learned here (and kept) that upstream did not take: an
        /// error, or no answer within `PROFILE_WAIT`.
        profiles_refused,
        /// Learnings that closed with no piece touched.
        learned_nothing,
        /// Learnings closed because readers touched nothing new for
        /// `LEARN_QUIET`.
        learn_closed_quiet,
        /// Learnings closed because their window (`--learn-window`) after
        /// the first touch passed, the readers still busy.
        learn_closed_time,
        /// Learnings closed because they held as many pieces as a profile
        /// may (`MAX_PROFILE_PARTS`, or `KEEP_SHARE` of the data).
        learn_closed_size,
        /// Learnings ended on request (`gvfsctl learned`): the guest was
        /// ready.
        learn_ended_early,
        /// File bytes copied from blocks held here (of another image, or
        /// earlier in the same one) with the content hash the metadata
        /// names, instead of fetched.
        dedup_bytes,
        /// Fetches not sent at all: every block was held here.
        dedup_fetches_saved,
        /// Held blocks that were not what their fingerprint promised (a
        /// file rewritten since, a damaged disk, a fingerprint shared by
        /// other bytes): not used, fetched.
        dedup_rejected,
        /// Partly fetched files kept at open (their progress logs loaded),
        /// for the next fetch of the same version to resume.
        kept_files,
        /// Bytes of those files their progress logs recorded as written.
        kept_bytes,
        /// Kept pieces whose bytes did not match the CRC32 their progress
        /// log recorded (lost in a crash, or damaged): fetched again.
        kept_bad_pieces,
        /// Bytes fetched again of pieces a progress log had recorded and
        /// that passed their check (should stay 0).
        refetched_bytes,
        /// 64 KiB pieces that did not match their hash in the image's
        /// metadata: with held blocks in them, fetched again whole;
        /// otherwise as upstream sent them (the metadata is wrong), and
        /// their blocks not offered for dedup.
        hash_mismatches,
    }
}

/// Counters, for `gvfsctl stats` and the metrics endpoint.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FileCacheStats {
    /// What the file cache counted.
    #[serde(flatten)]
    pub counts: FileCacheCounts,
    /// Bytes of frame files held now (counted in the budget).
    pub frame_bytes: u64,
    /// Bytes of run frames kept in memory now (at most 64 MiB).
    pub run_frame_bytes: u64,
    /// Bytes of files held now.
    pub cached_bytes: u64,
    /// Files holding writes not yet written back.
    pub dirty_files: u64,
    /// Bytes copied from held blocks instead of fetched, per held file
    /// (the largest [`DEDUP_FILES_SHOWN`]).
    pub dedup_files: Vec<FileDedup>,
    /// Blocks written into the dedup index and made durable (in the
    /// background, at low priority).
    pub blocks_indexed: u64,
    /// Blocks taken out of the index again (their file or block let go).
    pub blocks_forgotten: u64,
    /// Ranges not indexed because the indexer's queue was full.
    pub index_dropped: u64,
}

/// Files listed in [`FileCacheStats::dedup_files`].
pub const DEDUP_FILES_SHOWN: usize = 32;

/// What dedup saved one held file.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileDedup {
    /// The file's handle, in hex.
    pub fh: String,
    /// Its name, where the metadata layer knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its bytes copied from blocks held here instead of fetched.
    pub bytes: u64,
}

//! How gvfsctl shows a proxy's answers: status, stats, and a write-back
//! job's progress.

use anyhow::bail;
use gvfs_proxy::status::{Stats, Status};
use serde_json::Value;

/// Polls the proxy's write-back job with a progress bar until the job that
/// `started` describes has ended; fails when it failed.
pub(super) fn wait_for_job(
    ask: &dyn Fn(&str) -> anyhow::Result<Value>,
    started: &Value,
) -> anyhow::Result<()> {
    // The job we wait for is the one running now (ours, or one already
    // running that we joined): it ends when `finished` passes this count.
    let finished_before = started["job"]["finished"].as_u64().unwrap_or(0);
    let bar = indicatif::ProgressBar::new(started["job"]["total_bytes"].as_u64().unwrap_or(0));
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(
        started["job"]["kind"]
            .as_str()
            .unwrap_or("write-back")
            .to_string(),
    );
    let job = loop {
        let job = ask("stats")?["writeback"].clone();
        bar.set_length(job["total_bytes"].as_u64().unwrap_or(0));
        bar.set_position(job["done_bytes"].as_u64().unwrap_or(0));
        if job["finished"].as_u64().unwrap_or(0) > finished_before {
            break job;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    bar.finish_and_clear();
    let last = &job["last"];
    let name = last["job"].as_str().unwrap_or("write-back");
    if last["ok"] == true {
        let r = &last["report"];
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        println!(
            "{name} done: {} bytes in {} blocks of {} files written back ({} rewritten after the server's verifier changed)",
            n("bytes"),
            n("blocks"),
            n("files"),
            n("rewrites"),
        );
        Ok(())
    } else {
        bail!(
            "{name} failed: {} (dirty data stays in the cache)",
            last["error"].as_str().unwrap_or("unknown error")
        )
    }
}

/// What a stats or status answer that does not parse means.
pub(super) const NOT_UNDERSTOOD: &str =
    "the proxy's answer is not understood (a gvfs-proxy of another version? --json shows it)";

pub(super) fn print_stats(s: &Stats) {
    print_cache_stats(s);
    if let Some(m) = &s.meta {
        println!("metadata actions");
        println!(
            "  metadata    {} files with, {} without, {} ignored (bad, stale or \
             {} not trusted)",
            m.meta_found, m.meta_absent, m.meta_rejected, m.meta_untrusted
        );
        println!(
            "  zero maps   {} bytes of zeros answered here, {} READs wholly zeros",
            m.zero_bytes, m.zero_reads
        );
        println!(
            "  file cache  {} READs and {} WRITEs served",
            m.copy_reads, m.copy_writes
        );
    }
    if let Some(f) = &s.file_cache {
        println!("file cache (compress-and-copy)");
        println!(
            "  files       {} fetched ({} whole, {} failed), {} joined a fetch under way",
            f.counts.files_fetched,
            f.counts.files_complete,
            f.counts.files_failed,
            f.counts.coalesced_fetches
        );
        println!(
            "  wire        {} chunks, {} bytes for {} bytes of file; {} zero chunks never fetched; \
             {} bytes copied from earlier ones (repeats)",
            f.counts.chunks_fetched,
            f.counts.wire_bytes,
            f.counts.raw_bytes,
            f.counts.zero_chunks,
            f.counts.repeat_bytes
        );
        println!(
            "  time        {:.2} s fetching whole files (start to last chunk, summed), {:.2} s decompressing",
            f.counts.fetch_micros as f64 / 1e6,
            f.counts.decompress_micros as f64 / 1e6
        );
        println!(
            "  held        {} bytes; {} files with writes; {} files ({} bytes) written back",
            f.cached_bytes, f.dirty_files, f.counts.written_back_files, f.counts.written_back_bytes
        );
        let c = &f.counts;
        if c.kept_files + c.kept_bad_pieces + c.refetched_bytes > 0 {
            println!(
                "  kept        {} partly fetched files ({} bytes) kept across a restart; \
                 {} kept pieces failed their check, {} kept bytes fetched again",
                c.kept_files, c.kept_bytes, c.kept_bad_pieces, c.refetched_bytes
            );
        }
        let closed =
            c.learn_closed_quiet + c.learn_closed_time + c.learn_closed_size + c.learn_ended_early;
        if c.faults_waited + c.demand_wire_bytes + c.profile_hits + c.profiles_sent + closed > 0 {
            println!(
                "  lazy        {} bytes for readers waiting, {} for working-set profiles, {} in the background, {} as bulk (behind readers copying a file)",
                c.demand_wire_bytes,
                c.profile_wire_bytes,
                c.background_wire_bytes,
                c.bulk_wire_bytes
            );
            println!(
                "  faults      {} reads waited for a chunk, {:.1} ms each on average",
                c.faults_waited,
                c.fault_wait_micros as f64 / 1e3 / c.faults_waited.max(1) as f64
            );
            println!(
                "  profiles    {} fetches started with one ({} pieces of {} KiB fetched first); {} learned and sent upstream, {} not kept (a copy)",
                c.profile_hits,
                c.profile_pieces,
                gvfs_filecache::PIECE >> 10,
                c.profiles_sent,
                c.profiles_discarded
            );
            println!(
                "  learning    {} closed: {} readers quiet, {} window passed, {} size cap, {} ended by `gvfsctl learned`; \
                 {} not kept (most of the image), {} unchanged, {} not taken upstream, {} learned nothing",
                closed,
                c.learn_closed_quiet,
                c.learn_closed_time,
                c.learn_closed_size,
                c.learn_ended_early,
                c.profiles_too_big,
                c.profiles_unchanged,
                c.profiles_refused,
                c.learned_nothing
            );
        }
        if c.dedup_bytes + c.dedup_rejected + c.hash_mismatches + f.blocks_indexed > 0 {
            println!(
                "  dedup       {} bytes copied from blocks held here instead of fetched ({} fetches not sent); {} held blocks were not what their fingerprint promised, {} pieces did not match their hash; {} blocks indexed, {} taken out again ({} ranges not indexed, the indexer being behind)",
                c.dedup_bytes,
                c.dedup_fetches_saved,
                c.dedup_rejected,
                c.hash_mismatches,
                f.blocks_indexed,
                f.blocks_forgotten,
                f.index_dropped
            );
            for d in &f.dedup_files {
                println!(
                    "    {:>12} bytes  {}",
                    d.bytes,
                    d.name.as_deref().unwrap_or(&d.fh)
                );
            }
        }
        if f.counts.frames_reused + f.counts.frames_made > 0 {
            println!(
                "  frames      {} chunks sent to other proxies as they came, {} compressed here; {} bytes kept",
                f.counts.frames_reused, f.counts.frames_made, f.frame_bytes
            );
        }
    }
    if let Some(a) = &s.attr_cache {
        println!("attribute cache (--attr-timeout)");
        println!(
            "  calls       {} answered here, {} asked upstream; emptied {} times",
            a.hits, a.misses, a.invalidations
        );
        println!(
            "  listings    {} directories read along with a first LOOKUP",
            a.listings
        );
    }
    let e = &s.ext;
    if e.fetch_calls + e.store_calls > 0 {
        println!("extension program (answering other proxies)");
        println!(
            "  FETCH       {} calls, {} bytes of file sent as {} bytes ({} from the file cache, {} compressed here, {} forwarded)",
            e.fetch_calls,
            e.raw_bytes,
            e.wire_bytes,
            e.from_file_cache,
            e.compressed_here,
            e.forwarded
        );
        println!(
            "  STORE       {} calls, {} bytes received for {} bytes of file; {} errors",
            e.store_calls, e.stored_wire_bytes, e.stored_raw_bytes, e.errors
        );
        println!(
            "  lazy        {} FETCHes a reader waited for; working-set profiles: {} kept, {} answered, {} written beside their image",
            e.demand_calls, e.profiles_stored, e.profiles_served, e.profiles_written
        );
        let classed = e.class_calls_demand
            + e.class_calls_profile
            + e.class_calls_background
            + e.class_calls_bulk;
        if classed > 0 {
            println!(
                "  classes     {classed} FETCH_CLASS calls: {} demand, {} profile, {} background, {} bulk",
                e.class_calls_demand,
                e.class_calls_profile,
                e.class_calls_background,
                e.class_calls_bulk
            );
        }
        if e.have_calls > 0 {
            println!(
                "  dedup       {} FETCHes named blocks the caller held; {} bytes of them not sent",
                e.have_calls, e.have_bytes
            );
        }
    }
}

pub(super) fn print_cache_stats(s: &Stats) {
    let Some(c) = &s.cache else {
        println!("no block cache (the proxy runs without --cache-dir)");
        return;
    };
    let n = &c.counts;
    let (hits, misses) = (n.hits, n.misses);
    let ratio = if hits + misses > 0 {
        100.0 * hits as f64 / (hits + misses) as f64
    } else {
        0.0
    };
    println!("block cache");
    println!(
        "  hits        {hits} ({ratio:.1}%), misses {misses}, read-ahead hits {}",
        n.readahead_hits
    );
    println!(
        "  served      {} bytes from the cache, {} bytes fetched upstream, {} bytes filled from blocks with the same content held here",
        n.hit_bytes, n.fetched_bytes, n.held_fill_bytes
    );
    println!(
        "  dirty       {} bytes; {} bytes written back so far",
        c.dirty_bytes, n.write_back_bytes
    );
    println!(
        "  cached      {} of {} bytes; {} evictions",
        c.cached_bytes, c.capacity_bytes, c.evictions
    );
    let calls = n.upstream_calls;
    let avg = n.upstream_latency_us_total.checked_div(calls).unwrap_or(0);
    println!(
        "  upstream    {calls} calls, {avg} us average latency; {} misses coalesced",
        n.coalesced_misses
    );
    let (bad, lost) = (c.corrupt_clean_dropped, c.dirty_sub_blocks_lost);
    if bad + lost + c.banks_lost > 0 {
        println!(
            "  integrity   {bad} sub-blocks failed their checksum and were fetched again; \
             {lost} dirty sub-blocks LOST (not written back; see the log and CACHE_DIR/quarantine); \
             {} bank files missing or cut off; write verifier changed {} times",
            c.banks_lost, c.verifier_changes
        );
    }
    let w = &s.writeback;
    if w.running {
        println!(
            "  write-back  running: {} of {} bytes",
            w.done_bytes, w.total_bytes
        );
    }
}

pub(super) fn print_status(s: &Status) {
    println!("gvfs-proxy {} (pid {})", s.version, s.pid);
    println!("  listening   {}  export {}", s.listen, s.export);
    println!("  upstream    {}", s.upstream);
    println!("  uptime      {} s", s.uptime_secs);
    let c = &s.connections;
    println!(
        "  connections {} open, {} accepted, {} closed for oversized records",
        c.open, c.counts.accepted, c.counts.closed_oversized
    );
    println!(
        "  data        {} bytes read, {} bytes written",
        s.front.read_bytes, s.front.write_bytes
    );
    println!(
        "  errors      {} RPC-level, {} upstream; {} retransmissions answered from the duplicate-request cache",
        s.front.rpc_errors, s.front.service_errors, s.front.drc_hits
    );
    let list: Vec<String> = s
        .nfs_calls
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    println!(
        "  NFS calls   {}",
        if list.is_empty() {
            "none".into()
        } else {
            list.join(", ")
        }
    );
    println!(
        "  MOUNT calls {}  PORTMAP calls {}",
        s.front.mount_calls, s.front.portmap_calls
    );
    if let Some(u) = &s.upstream_client {
        println!(
            "  upstream rpc {}: {} calls, {} retransmits, {} connects",
            u.server, u.calls, u.retransmits, u.connects
        );
        if let Some(l) = &u.link {
            println!(
                "    link: min rtt {:.1} ms, {:.1} Mbit/s, bdp {} KiB",
                l.min_rtt_us as f64 / 1e3,
                l.rate_bps as f64 / 1e6,
                l.bdp_bytes >> 10
            );
        }
    }
    if let Some(m) = &s.mount {
        println!("  FUSE mount  {}", m.path);
        println!(
            "    {} bytes read, {} bytes written ({} not yet committed), {} commits, {} writes sent again",
            m.counts.read_bytes,
            m.counts.write_bytes,
            m.uncommitted_bytes,
            m.counts.commits,
            m.counts.writes_resent
        );
        println!(
            "    {} calls down the stack ({} failed), {} running; {} inodes and {} open files held by the kernel",
            m.counts.calls, m.counts.failed, m.in_flight, m.inodes, m.open
        );
        println!("    {}", session_line(&m.session, m.counts.resent_requests));
    }
}

/// A mount's session as one line: since when, taken over how often,
/// what keeps it.
fn session_line(s: &gvfs_fuse::SessionInfo, resent: u64) -> String {
    let mut line = if s.id.is_empty() {
        "session not kept (--mount-keep none): it ends with this proxy".to_string()
    } else {
        format!(
            "session {} mounted {} ago",
            &s.id[..s.id.len().min(8)],
            ago(s.mounted_at_us)
        )
    };
    if s.takeovers > 0 {
        line += &format!(
            ", taken over {}, last {} ago ({} requests resent{})",
            match s.takeovers {
                1 => "once".to_string(),
                n => format!("{n} times"),
            },
            ago(s.taken_over_at_us),
            resent,
            if s.resend == "unsupported" {
                "; this kernel cannot resend (Linux before 6.9)"
            } else {
                ""
            }
        );
    }
    match s.kept_by.as_str() {
        "" | "none" => {}
        "fdstore" => line += "; kept in systemd's fd store",
        holder => line += &format!("; kept by its {holder}"),
    }
    line
}

/// How long ago a Unix time in microseconds was, for people.
fn ago(us: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let secs = now.saturating_sub(us) / 1_000_000;
    match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    }
}

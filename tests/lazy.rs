//! Lazy clones, proxy side, through the real binaries: a node proxy with a
//! file cache reads a compress-and-copy image through its FUSE mount (the
//! way a lazy clone's QEMU reads guest memory) from an image-server
//! gvfs-proxy over nfs-ganesha (or the embedded `dir:` origin).
//! - Working-set profiles: scattered first reads are learned, kept by the
//!   image server, and fetched first by the next node; a changed image
//!   drops its profile; a copy of the whole file teaches nothing.
//! - Demand: a read of a chunk the background stream has not reached is
//!   fetched by the reader itself (FETCH_DEMAND), across an emulated WAN.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_ext::{ChunkSource, ExtClient};
use gvfs_nfs::Credentials;
use gvfs_nfs::net::client::{ClientConfig, RpcClient, TcpConnector};
use gvfs_testbed::data::{compare_bytes, compare_files, write_sparse_file};
use gvfs_testbed::fuse::{self, MountPoint};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;
use gvfs_testbed::require_fuse;
use gvfs_testbed::{Ganesha, Origin, Proxy, ProxyArgs, Site, Tier};
use gvfs_wanlink::LinkConfig;

const MIB: u64 = 1 << 20;
/// The file cache's chunk.
const CHUNK: u64 = MIB;
/// The image's size: 48 chunks.
const IMAGE_SIZE: u64 = 48 * MIB;
/// Its chunks of zeros (holes); every other chunk holds data.
const ZERO_CHUNKS: [u64; 6] = [3, 19, 20, 21, 35, 46];
/// Bytes each scattered read asks for.
const PAGE: usize = 4096;
/// How long a learning may take to end and be sent: 3 s of quiet, a
/// 250 ms tick, and room for a slow machine.
const LEARN_WAIT: Duration = Duration::from_secs(15);
/// How long a whole-file fetch over loopback may take.
const FETCH_WAIT: Duration = Duration::from_secs(30);

/// Writes a sparse image of `size` bytes at `path`: data (for `seed`) in
/// every chunk but `zeros`, then its metadata with `meta gen --compress`.
fn image(path: &Path, size: u64, zeros: &[u64], seed: u64) -> Result<()> {
    let extents: Vec<(u64, u64)> = (0..size.div_ceil(CHUNK))
        .filter(|c| !zeros.contains(c))
        .map(|c| (c * CHUNK, CHUNK.min(size - c * CHUNK)))
        .collect();
    write_sparse_file(path, size, seed, &extents)?;
    meta_gen(path)
}

/// `gvfsctl meta gen PATH --compress`.
fn meta_gen(path: &Path) -> Result<()> {
    gvfsctl(&["meta", "gen", &path.display().to_string(), "--compress"])?;
    Ok(())
}

/// An image-server proxy over nfs-ganesha's export, as the other tests
/// start one (no options).
fn image_server(g: &Ganesha) -> Result<Proxy> {
    Proxy::spawn(ProxyArgs::new(g.upstream_url()))
}

/// A node: a fresh proxy with a block cache (so a file cache) in a fresh
/// directory, whose upstream is `upstream`, with its export mounted on a
/// fresh mount point.
struct Node {
    proxy: Proxy,
    mnt: MountPoint,
    _cache: tempfile::TempDir,
}

impl Node {
    fn start(upstream: String) -> Result<Self> {
        let cache = tempfile::Builder::new().prefix("gvfs-lazy-").tempdir()?;
        let mnt = MountPoint::new()?;
        let proxy = fuse::mounted(ProxyArgs::new(upstream).cache(cache.path(), "64M"), &mnt)?;
        Ok(Self {
            proxy,
            mnt,
            _cache: cache,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.path().join(name)
    }
}

/// Reads `PAGE` bytes at `offset` of `name` through the node's mount (one
/// open file, as QEMU keeps one) and checks them against the origin's.
fn read_page(file: &File, origin: &Path, offset: u64) -> Result<()> {
    let mut got = vec![0u8; PAGE];
    file.read_exact_at(&mut got, offset)
        .with_context(|| format!("reading {PAGE} bytes at {offset} through the mount"))?;
    let mut want = vec![0u8; PAGE];
    File::open(origin)?.read_exact_at(&mut want, offset)?;
    compare_bytes(&want, &got).with_context(|| format!("the page at {offset}"))
}

/// The first reads of a lazy clone's guest, scattered, chunk by chunk (7
/// twice): the profile learned is the 8 KiB pieces at the start of
/// chunks 30, 7, 41, 12.
const SCATTERED: [u64; 5] = [30, 7, 41, 7, 12];

/// Node 1 reads `SCATTERED` through its mount and goes quiet; its profile
/// is sent to `server`, which keeps it. Returns node 1 (still running).
fn learn_scattered(server: &Proxy, origin: &Path, name: &str) -> Result<Node> {
    let node = Node::start(server.upstream_url())?;
    let f = File::open(node.path(name))?;
    for c in SCATTERED {
        read_page(&f, origin, c * CHUNK + 512)?;
    }
    let s = node
        .proxy
        .wait_for("file_cache.profiles_sent", LEARN_WAIT, |s| {
            s.file_cache.counts.profiles_sent >= 1
        })?;
    ensure!(
        s.file_cache.counts.profiles_sent == 1 && s.file_cache.counts.profiles_discarded == 0,
        "node 1 after its scattered reads: {s}"
    );
    let up = server.stats()?;
    ensure!(
        up.ext.profiles_stored == 1,
        "the image server did not keep the profile: {up}"
    );
    Ok(node)
}

/// The profile `server` answers PROFILE_GET with for `name`, asked
/// directly on its extension program.
async fn profile_at(server: &Proxy, name: &str) -> Result<Option<Vec<u32>>> {
    let give_up = Duration::from_secs(20);
    let nfs = NfsClient::of_proxy(server, give_up).await?;
    let fh = nfs.resolve(name).await?.context("resolving the image")?;
    let ext = ExtClient::new(RpcClient::new(
        TcpConnector {
            addr: server.addr(),
        },
        ClientConfig {
            give_up_after: Some(give_up),
            ..ClientConfig::default()
        },
    ));
    let p = ext.get_profile(&Credentials::unix(0, 0), &fh.data).await?;
    Ok(p.map(|p| {
        let per = (CHUNK / u64::from(p.unit)) as u32;
        p.parts.iter().map(|x| x / per).collect()
    }))
}

/// A lazy clone's first reads are learned by its node and kept by the
/// image server; the next node, reading another chunk first, fetches the
/// learned chunks before the rest, and serves the whole file right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_reads_are_learned_and_the_next_node_fetches_them_first() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    let origin = g.export_dir().join("golden.mem");
    image(&origin, IMAGE_SIZE, &ZERO_CHUNKS, 61)?;
    let server = image_server(&g)?;
    let node1 = learn_scattered(&server, &origin, "golden.mem")?;
    drop(node1);

    let node2 = Node::start(server.upstream_url())?;
    let f = File::open(node2.path("golden.mem"))?;
    read_page(&f, &origin, 100)?;
    let s = node2.proxy.wait_files_complete(1, FETCH_WAIT)?;
    ensure!(
        s.file_cache.counts.profile_hits == 1
            && s.file_cache.counts.profile_pieces == 4
            && s.file_cache.counts.profile_wire_bytes > 0,
        "node 2 did not fetch the learned chunks first: {s}\noutput:\n{}",
        node2.proxy.output()
    );
    let up = server.stats()?;
    ensure!(
        up.ext.profiles_served == 1,
        "the image server did not serve node 2 the profile: {up}"
    );
    compare_files(&origin, &node2.path("golden.mem"))
        .context("the whole file through node 2's mount")?;
    Ok(())
}

/// An image changed at the origin after a profile was learned on it (same
/// file, other bytes, its metadata made again): the profile describes the
/// old version, so a fresh node gets none, and reads the new bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_image_drops_its_profile() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    let origin = g.export_dir().join("golden.mem");
    image(&origin, IMAGE_SIZE, &ZERO_CHUNKS, 71)?;
    let server = image_server(&g)?;
    drop(learn_scattered(&server, &origin, "golden.mem")?);
    let kept = profile_at(&server, "golden.mem").await?;
    ensure!(
        kept == Some(vec![30, 7, 41, 12]),
        "the image server answers {kept:?} for the unchanged image"
    );

    // A new version: other bytes in two chunks of data (one the profile
    // names), mtime and ctime move on.
    thread::sleep(Duration::from_millis(20));
    gvfs_testbed::data::write_at(&origin, 30 * CHUNK + 512, b"the golden image, rebuilt")?;
    gvfs_testbed::data::write_at(&origin, 44 * CHUNK + 9, &[0xa5; 3000])?;
    meta_gen(&origin)?;

    let node = Node::start(server.upstream_url())?;
    let f = File::open(node.path("golden.mem"))?;
    read_page(&f, &origin, 30 * CHUNK)?;
    let s = node.proxy.wait_files_complete(1, FETCH_WAIT)?;
    ensure!(
        s.file_cache.counts.profile_hits == 0 && s.file_cache.counts.profile_pieces == 0,
        "a profile of the old version ordered the new one's fetch: {s}"
    );
    compare_files(&origin, &node.path("golden.mem"))
        .context("the changed file through a fresh node's mount")?;
    let left = profile_at(&server, "golden.mem").await?;
    ensure!(
        left.is_none(),
        "the image server still answers {left:?} for the changed image"
    );
    Ok(())
}

/// A node whose reader copies the whole file learns no working set: the
/// read order is discarded, nothing is sent upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_teaches_nothing() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    let origin = g.export_dir().join("golden.mem");
    image(&origin, IMAGE_SIZE, &ZERO_CHUNKS, 81)?;
    let server = image_server(&g)?;
    let node = Node::start(server.upstream_url())?;
    compare_files(&origin, &node.path("golden.mem")).context("the copy through the mount")?;
    let s = node
        .proxy
        .wait_for("file_cache.profiles_discarded", LEARN_WAIT, |s| {
            s.file_cache.counts.profiles_discarded >= 1
        })?;
    ensure!(
        s.file_cache.counts.profiles_sent == 0 && s.file_cache.counts.profiles_discarded == 1,
        "a copy was taken for a working set: {s}"
    );
    let up = server.stats()?;
    ensure!(
        up.ext.profiles_stored == 0,
        "the image server kept a profile of a copy: {up}"
    );
    Ok(())
}

/// Across a WAN (20 ms RTT, 20 Mbit/s), a read of a far chunk right after
/// the first read does not wait for the background stream to get there:
/// the reader fetches it itself, as demand (FETCH_DEMAND upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demand_reads_are_fetched_as_demand() -> Result<()> {
    require_fuse!();
    // 24 chunks of data but for two; incompressible, so the background
    // stream takes about 0.4 s a chunk on this link.
    let site = Site::builder(Origin::Dir)
        .wan(LinkConfig::from_rtt(
            Duration::from_millis(20),
            Some(20_000_000),
        ))
        .node(Tier::new().cache("64M").mount())
        .start_with(|dir| image(&dir.join("golden.mem"), 24 * MIB, &[5, 17], 91))?;
    let origin = site.origin_dir().join("golden.mem");
    let (server, node) = (site.image_server(), site.node(0)?);
    let f = File::open(node.path("golden.mem")?)?;
    read_page(&f, &origin, 0)?;
    read_page(&f, &origin, 22 * CHUNK + 4096)?;
    // Both reads waited, and the far one fetched its bytes itself: its
    // 8 KiB piece as demand. With no working-set profile for the image the
    // rest of its chunk comes behind it for the faults near it, but as the
    // stream's class, since no reader waits for it: the demand on the wire
    // is a piece or two, not the chunk. (With a profile, only the pieces a
    // read needs: the file cache's unit tests.)
    let piece = 8 << 10;
    let mut s = node.stats()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while s.file_cache.counts.demand_wire_bytes < 2 * piece && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
        s = node.stats()?;
    }
    ensure!(
        s.file_cache.counts.faults_waited >= 2
            && s.file_cache.counts.fault_wait_micros > 0
            && s.file_cache.counts.demand_wire_bytes >= 2 * piece
            && s.file_cache.counts.demand_wire_bytes < CHUNK,
        "the far read's piece was not fetched as demand (and only it): {s}"
    );
    let up = server.stats()?;
    ensure!(
        up.ext.demand_calls >= 2,
        "the reads' chunks did not reach the image server as FETCH_DEMAND: {up}"
    );
    Ok(())
}

/// With a metadata layer (`--meta`, the default with `--listen-tls` or a
/// cache) the image server keeps a profile beside the image at the origin:
/// `gvfsctl meta show` shows it there, and a restarted image server (whose
/// memory is empty) still hands it to a fresh node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_is_kept_beside_the_image_and_outlives_the_image_server() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    let origin = g.export_dir().join("golden.mem");
    image(&origin, IMAGE_SIZE, &ZERO_CHUNKS, 83)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()).meta())?;
    drop(learn_scattered(&server, &origin, "golden.mem")?);
    let up = server.stats()?;
    ensure!(
        up.ext.profiles_written == 1,
        "the image server did not write the profile beside the image: {up}"
    );
    let beside = g.export_dir().join(".golden.mem.gvfsprofile");
    ensure!(beside.is_file(), "no {}", beside.display());
    let shown = gvfsctl(&["meta", "show", &origin.display().to_string()])?;
    ensure!(
        shown.contains("in 4 parts of 8.00 KiB")
            && shown.contains("first touched at 30.00 MiB, 7.00 MiB, 41.00 MiB, 12.00 MiB"),
        "meta show:\n{shown}"
    );
    ensure!(
        shown.contains("learned on this version"),
        "meta show:\n{shown}"
    );
    drop(server);

    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()).meta())?;
    let node = Node::start(server.upstream_url())?;
    let f = File::open(node.path("golden.mem"))?;
    read_page(&f, &origin, 100)?;
    let s = node.proxy.wait_files_complete(1, FETCH_WAIT)?;
    ensure!(
        s.file_cache.counts.profile_hits == 1 && s.file_cache.counts.profile_pieces == 4,
        "the restarted image server did not hand on the kept profile: {s}"
    );
    compare_files(&origin, &node.path("golden.mem"))?;

    // The image changes: meta show calls the kept profile stale.
    thread::sleep(Duration::from_millis(20));
    gvfs_testbed::data::write_at(&origin, 7 * CHUNK, b"rebuilt")?;
    let shown = gvfsctl(&["meta", "show", &origin.display().to_string()])?;
    ensure!(
        shown.contains("stale: learned on another version"),
        "meta show:\n{shown}"
    );
    Ok(())
}

/// A busy guest never goes quiet: scattered reads that never stop, so its
/// node's learning would close only with its window. `gvfsctl learned
/// NAME --wait`, as a middleware that knows the guest is ready says it,
/// ends the learning of that file (and of no other name) at once: the
/// profile is sent, and the image server keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_guests_learning_ends_with_gvfsctl_learned() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    require_fuse!();
    let g = Ganesha::start()?;
    let origin = g.export_dir().join("golden.mem");
    image(&origin, IMAGE_SIZE, &ZERO_CHUNKS, 97)?;
    let server = image_server(&g)?;
    let node = Node::start(server.upstream_url())?;
    let (stop, reads) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    // The n-th read: a page of data chunk 17n mod 48 (jumping back and
    // forth), a new piece each time.
    let reader = {
        let (stop, reads) = (stop.clone(), reads.clone());
        let (f, origin) = (File::open(node.path("golden.mem"))?, origin.clone());
        thread::spawn(move || -> Result<()> {
            for n in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let chunk = n * 17 % (IMAGE_SIZE / CHUNK);
                if !ZERO_CHUNKS.contains(&chunk) {
                    let page = (n * 3 * 8192) % CHUNK;
                    read_page(&f, &origin, chunk * CHUNK + page)?;
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        })
    };
    let started = std::time::Instant::now();
    while reads.load(Ordering::Relaxed) < 5 && !reader.is_finished() {
        ensure!(started.elapsed() < FETCH_WAIT, "the reads did not start");
        thread::sleep(Duration::from_millis(50));
    }
    let ctl = |args: &[&str]| gvfs_testbed::proxy::gvfsctl(node.proxy.control_path(), args);
    // Another name: nothing ended.
    let out = ctl(&["learned", "other.mem"])?;
    ensure!(
        out.status.success() && out.stdout_text().contains("no learning"),
        "gvfsctl learned other.mem: {}{}",
        out.stdout_text(),
        out.stderr_text()
    );
    let out = ctl(&["learned", "golden.mem", "--wait"])?;
    stop.store(true, Ordering::Relaxed);
    let read = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader panicked"))?;
    ensure!(
        out.status.success() && out.stdout_text().contains("sent upstream"),
        "gvfsctl learned golden.mem --wait: {}{}\noutput:\n{}",
        out.stdout_text(),
        out.stderr_text(),
        node.proxy.output()
    );
    read?;
    let s = node.proxy.stats()?;
    let c = &s.file_cache.counts;
    ensure!(
        c.learn_ended_early == 1 && c.learn_closed_time + c.learn_closed_quiet == 0,
        "the learning did not end on request: {s}"
    );
    ensure!(c.profiles_sent == 1, "node: {s}");
    let up = server.stats()?;
    ensure!(
        up.ext.profiles_stored == 1,
        "the image server did not keep the profile: {up}"
    );
    let kept = profile_at(&server, "golden.mem")
        .await?
        .context("no profile at the image server")?;
    ensure!(kept.first() == Some(&0), "the profile kept: {kept:?}");
    Ok(())
}

/// Bytes of a working-set profile's piece.
const PROFILE_PIECE: u32 = 8 << 10;

/// Keeps `parts` (in 8 KiB pieces) as `name`'s working-set profile at
/// `server`, with PROFILE_PUT on its extension program.
async fn put_profile_at(server: &Proxy, name: &str, parts: Vec<u32>) -> Result<()> {
    use gvfs_nfs::nfs3_types::nfs3::{GETATTR3args, Nfs3Result};
    use gvfs_nfs::{NfsReply, NfsRequest};
    let give_up = Duration::from_secs(20);
    let nfs = NfsClient::of_proxy(server, give_up).await?;
    let fh = nfs.resolve(name).await?.context("resolving the image")?;
    let reply = nfs
        .call(NfsRequest::Getattr(GETATTR3args { object: fh.clone() }))
        .await?;
    let NfsReply::Getattr(Nfs3Result::Ok(ok)) = reply else {
        anyhow::bail!("GETATTR of the image failed");
    };
    let profile = gvfs_ext::Profile::of(&ok.obj_attributes, PROFILE_PIECE, parts);
    let ext = ExtClient::new(RpcClient::new(
        TcpConnector {
            addr: server.addr(),
        },
        ClientConfig {
            give_up_after: Some(give_up),
            ..ClientConfig::default()
        },
    ));
    ext.put_profile(&Credentials::unix(0, 0), &fh.data, &profile)
        .await?;
    Ok(())
}

/// A node's working-set profile crosses a LAN proxy as its pieces: the
/// node asks for each run as a profile's (FETCH_CLASS), and the LAN
/// fetches those pieces across the WAN, not the chunks they are in (when
/// it did, eight nodes' profiles moved 64 MiB before any guest answered).
/// By the time the node has the profile's bytes, the WAN has carried
/// little more than they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_runs_cross_a_lan_proxy_as_pieces() -> Result<()> {
    require_fuse!();
    // Incompressible data in every chunk but the zeros; a WAN slow enough
    // that a whole chunk crossing it shows.
    let site = Site::builder(Origin::Dir)
        .wan(LinkConfig::from_rtt(
            Duration::from_millis(40),
            Some(8_000_000),
        ))
        .lan(Tier::new().cache("128M"))
        .node(Tier::new().cache("128M").mount())
        .start_with(|dir| image(&dir.join("golden.mem"), IMAGE_SIZE, &ZERO_CHUNKS, 97))?;
    let origin = site.origin_dir().join("golden.mem");
    // Three pieces from the middle of each of 40 chunks of data: 960 KiB,
    // a run per chunk (under PROFILE_BYTES: all asked for at once).
    let per = (CHUNK / u64::from(PROFILE_PIECE)) as u32;
    let chunks: Vec<u32> = (0..IMAGE_SIZE / CHUNK)
        .filter(|c| !ZERO_CHUNKS.contains(c))
        .take(40)
        .map(|c| c as u32)
        .collect();
    let parts: Vec<u32> = chunks
        .iter()
        .flat_map(|c| (0..3).map(move |i| c * per + 16 + i))
        .collect();
    let profile_bytes = parts.len() as u64 * u64::from(PROFILE_PIECE);
    put_profile_at(site.image_server(), "golden.mem", parts).await?;

    // A first read of a chunk of zeros: it starts the node's fetch (its
    // metadata, then the profile) and fetches nothing itself.
    let node = site.node(0)?;
    let f = File::open(node.path("golden.mem")?)?;
    read_page(&f, &origin, ZERO_CHUNKS[0] * CHUNK + 4096)?;
    let wan = site.wan()?;
    let before = wan.stats().downstream_bytes;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut s = node.stats()?;
    while s.file_cache.counts.profile_wire_bytes < profile_bytes {
        ensure!(
            std::time::Instant::now() < deadline,
            "the node did not get its profile's bytes: {s}"
        );
        std::thread::sleep(Duration::from_millis(5));
        s = node.stats()?;
    }
    let crossed = wan.stats().downstream_bytes - before;
    ensure!(
        s.file_cache.counts.profile_hits == 1 && s.file_cache.counts.profile_pieces == 120,
        "the node did not fetch the profile first: {s}"
    );
    // Pieces, not chunks: the profile's 120 pieces lie in chunks of 1 MiB
    // of incompressible data, which would be many MiB. Beside the profile
    // the LAN's own background stream may have one chunk in flight (the
    // gate's cap is two BDPs and a chunk's estimate).
    ensure!(
        crossed * 10 <= profile_bytes * 25,
        "{crossed} bytes crossed the WAN for a profile of {profile_bytes}"
    );
    let (lan, up) = (site.lan()?.stats()?, site.image_server().stats()?);
    ensure!(
        lan.ext.class_calls_profile > 0 && up.ext.class_calls_profile > 0,
        "profile runs did not go as FETCH_CLASS(profile): LAN {lan}\nimage server {up}"
    );
    compare_files(&origin, &node.path("golden.mem")?).context("the whole file through the node")?;
    Ok(())
}

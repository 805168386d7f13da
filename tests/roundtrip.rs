//! Files round-trip byte for byte through gvfs with real clients (libnfs
//! `nfs-cp`/`nfs-cat`/`nfs-ls`), to the `dir:` origin, to nfs-ganesha, and
//! through a chain of three proxies to nfs-ganesha: sizes from 0 to 256 MiB,
//! sparse files, and writes at odd offsets.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::{Credentials, NfsReply, NfsRequest};
use gvfs_testbed::data::{compare_files, random_bytes_at, write_random_file, write_sparse_file};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp, nfs_ls_names};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::proxy::chain;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const MIB: u64 = 1 << 20;

/// Sizes around the interesting edges: empty, sub-block, block boundaries,
/// the proxy's 1 MiB transfer size, and a large file.
const SIZES: [u64; 8] = [0, 1, 4095, 4096, 65_537, MIB, MIB + 3, 256 * MIB];

/// Copies files of every size and a sparse file in through `front` and back
/// out, checking each against `origin` (the directory the bytes land in).
fn round_trip(front: &Proxy, origin: &Path) -> Result<()> {
    let local = tempfile::tempdir()?;
    let mut names = Vec::new();
    for (i, size) in SIZES.iter().enumerate() {
        let name = format!("file-{size}.bin");
        let src = local.path().join(&name);
        write_random_file(&src, 100 + i as u64, *size)?;
        nfs_cp(&src.display().to_string(), &front.url(&name))
            .with_context(|| format!("writing {name}"))?;
        compare_files(&src, &origin.join(&name))
            .with_context(|| format!("{name} at the origin"))?;
        let back = local.path().join(format!("{name}.back"));
        nfs_cp(&front.url(&name), &back.display().to_string())
            .with_context(|| format!("reading {name}"))?;
        compare_files(&src, &back).with_context(|| format!("{name} read back"))?;
        names.push(name);
    }
    // Sparse: 40 MiB with three data extents at odd offsets and holes between.
    let sparse = local.path().join("sparse.img");
    write_sparse_file(
        &sparse,
        40 * MIB,
        7,
        &[(3, 1000), (5 * MIB + 17, 300_000), (40 * MIB - 4097, 4097)],
    )?;
    nfs_cp(&sparse.display().to_string(), &front.url("sparse.img"))?;
    compare_files(&sparse, &origin.join("sparse.img")).context("sparse file at the origin")?;
    let cat = nfs_cat(&front.url("sparse.img"))?;
    ensure!(
        cat == std::fs::read(&sparse)?,
        "nfs-cat of the sparse file differs"
    );
    names.push("sparse.img".into());
    // A file placed at the origin directly is listed and read through the proxy.
    write_random_file(&origin.join("placed.bin"), 9, 3 * MIB + 5)?;
    let got = nfs_cat(&front.url("placed.bin"))?;
    ensure!(
        got == std::fs::read(origin.join("placed.bin"))?,
        "nfs-cat of a file placed at the origin differs"
    );
    names.push("placed.bin".into());
    let mut listed = nfs_ls_names(&front.url(""))?;
    listed.sort();
    names.sort();
    ensure!(
        listed == names,
        "nfs-ls shows {listed:?}, expected {names:?}"
    );
    Ok(())
}

#[test]
fn libnfs_round_trips_through_a_proxy_to_the_dir_origin() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let proxy = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    round_trip(&proxy, origin.path())
}

#[test]
fn libnfs_round_trips_through_a_proxy_to_ganesha() -> Result<()> {
    let g = Ganesha::start()?;
    let proxy = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    round_trip(&proxy, g.export_dir())
}

#[test]
fn libnfs_round_trips_through_three_proxies_to_ganesha() -> Result<()> {
    let g = Ganesha::start()?;
    let proxies = chain(&g.upstream_url(), 3, |a| a)?;
    round_trip(proxies.last().context("no proxy")?, g.export_dir())
}

#[test]
fn libnfs_round_trips_through_three_proxies_to_the_dir_origin() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let proxies = chain(&format!("dir:{}", origin.path().display()), 3, |a| a)?;
    round_trip(proxies.last().context("no proxy")?, origin.path())
}

/// Unaligned writes (odd offsets and lengths, some past the end, some
/// overlapping, UNSTABLE then COMMIT) through the chain land exactly where
/// a local model says, and read back the same at odd offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_offset_writes_and_reads_through_the_chain() -> Result<()> {
    let g = Ganesha::start()?;
    let proxies = chain(&g.upstream_url(), 3, |a| a)?;
    let front: SocketAddr = proxies.last().context("no proxy")?.addr();
    let c = NfsClient::mount(
        front,
        front,
        "/export",
        Credentials::unix(0, 0),
        Duration::from_secs(30),
    )
    .await?;
    let created = c
        .call(NfsRequest::Create(CREATE3args {
            where_: diropargs3 {
                dir: c.root.clone(),
                name: filename3::from(b"odd.bin".to_vec()),
            },
            how: createhow3::GUARDED(sattr3::default()),
        }))
        .await?;
    let NfsReply::Create(Nfs3Result::Ok(CREATE3resok {
        obj: Nfs3Option::Some(fh),
        ..
    })) = created
    else {
        anyhow::bail!("CREATE failed: {:?}", created.status());
    };
    let mut model: Vec<u8> = Vec::new();
    let mut seed = 1u64;
    for i in 0..200u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let offset = (seed >> 20) % (3 * MIB) + (i % 7);
        let len = ((seed >> 5) % 200_000 + 1) as usize;
        let data = random_bytes_at(seed, offset, len);
        let reply = c
            .call(NfsRequest::Write(WRITE3args {
                file: fh.clone(),
                offset,
                count: len as u32,
                stable: stable_how::UNSTABLE,
                data: Opaque::owned(data.clone()),
            }))
            .await?;
        ensure!(
            reply.status() == nfsstat3::NFS3_OK,
            "write {i} failed: {:?}",
            reply.status()
        );
        let end = offset as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[offset as usize..end].copy_from_slice(&data);
    }
    let commit = c
        .call(NfsRequest::Commit(COMMIT3args {
            file: fh.clone(),
            offset: 0,
            count: 0,
        }))
        .await?;
    ensure!(commit.status() == nfsstat3::NFS3_OK, "commit failed");
    ensure!(
        std::fs::read(g.export_dir().join("odd.bin"))? == model,
        "file at ganesha differs from the model"
    );
    for (offset, count) in [
        (0u64, 1u32),
        (3, 5),
        (4095, 4098),
        (MIB - 1, 70_001),
        (model.len() as u64 - 10, 100),
    ] {
        let r = c
            .call(NfsRequest::Read(READ3args {
                file: fh.clone(),
                offset,
                count,
            }))
            .await?;
        let NfsReply::Read(Nfs3Result::Ok(ok)) = r else {
            anyhow::bail!("read failed")
        };
        let end = (offset as usize + count as usize).min(model.len());
        ensure!(
            ok.data.as_ref() == &model[offset as usize..end],
            "read at {offset}+{count} differs"
        );
        ensure!(
            ok.eof == (end == model.len()),
            "eof flag wrong at {offset}+{count}"
        );
    }
    Ok(())
}

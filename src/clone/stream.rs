//! The paper's copy-first clone: the memory image streamed whole from the
//! image server (a plain TCP file server) before QEMU resumes.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::guest::FILES;

/// Longest wait for a connection, or for the next bytes, of the full copy.
pub(super) const STREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves the files of one directory, one per connection, like scp: the
/// client sends a file name and a newline, the server sends the bytes and
/// closes.
pub(super) struct FileServer {
    pub(super) addr: SocketAddr,
}

impl FileServer {
    pub(super) fn start(dir: PathBuf) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let dir = Arc::new(dir);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                if stream.set_read_timeout(Some(STREAM_TIMEOUT)).is_err()
                    || stream.set_write_timeout(Some(STREAM_TIMEOUT)).is_err()
                {
                    continue;
                }
                let dir = Arc::clone(&dir);
                std::thread::spawn(move || {
                    let mut name = Vec::new();
                    let mut byte = [0u8; 1];
                    while name.len() < 64
                        && stream.read_exact(&mut byte).is_ok()
                        && byte[0] != b'\n'
                    {
                        name.push(byte[0]);
                    }
                    let name = String::from_utf8_lossy(&name).into_owned();
                    if FILES.contains(&name.as_str())
                        && let Ok(mut f) = std::fs::File::open(dir.join(&name))
                    {
                        let _ = std::io::copy(&mut f, &mut stream);
                    }
                });
            }
        });
        Ok(Self { addr })
    }
}

/// Fetches file `name` from a [`FileServer`] at `addr` into `to`.
pub(super) fn fetch_stream(addr: SocketAddr, name: &str, to: &Path) -> Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, STREAM_TIMEOUT)?;
    stream.set_read_timeout(Some(STREAM_TIMEOUT))?;
    stream.set_write_timeout(Some(STREAM_TIMEOUT))?;
    stream.write_all(format!("{name}\n").as_bytes())?;
    let mut f = std::fs::File::create(to)?;
    let n = std::io::copy(&mut stream, &mut f).with_context(|| format!("fetching {name}"))?;
    ensure!(n > 0, "the file server sent nothing for {name}");
    Ok(())
}

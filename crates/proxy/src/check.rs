//! `gvfs-proxy --check`: what a validated configuration would serve, told
//! without opening anything, so an operator (or a unit's `ExecStartPre`)
//! can check a file before starting the proxy with it.
//!
//! Parsing and validation are [`Config::from_file_config`]'s; this module
//! only describes the result: the layer stack (the plan
//! [`Stack::build`] walks, from [`plan::plan`]) and what the proxy would
//! listen on.
//!
//! [`Stack::build`]: crate::stack::Stack::build

use crate::config::{Config, default_control_path};
use crate::plan::{self, human_bytes};

/// What `--check` leaves to the start itself.
pub const NOT_CHECKED: &str = "not checked: that the files and directories named exist and \
are usable (certificate, key, CA, cache_dir, mount), that the addresses can be bound, that \
the upstream answers";

/// The stack, top first, and the listeners `cfg` asks for, one per line.
pub fn summary(cfg: &Config) -> String {
    let mut out = String::from("stack, top first:\n");
    for layer in plan::plan(cfg).describe().iter().rev() {
        out += &format!("  {:<16} {}\n", layer.name, layer.settings);
    }
    out += "serves:\n";
    let mut line = |what: &str, text: String| out += &format!("  {what:<16} {text}\n");
    match cfg.listen {
        Some(addr) => {
            let starttls = if cfg.tls.is_some() {
                "; RFC 9289 STARTTLS for clients that ask"
            } else {
                ""
            };
            line(
                "NFS clients",
                format!("{addr} (NFSv3, MOUNT v3, PORTMAP v2{starttls})"),
            );
        }
        None => line("NFS clients", "none (listen = \"none\")".to_owned()),
    }
    match &cfg.tls {
        Some(t) => {
            let identity = format!(
                "certificate {}, CA {}",
                t.files.cert.display(),
                t.files.ca.display()
            );
            let text = match t.listen {
                Some(at) => {
                    let mut peers: Vec<String> = t
                        .map
                        .peers
                        .iter()
                        .map(|(n, m)| format!("{n}={m}"))
                        .collect();
                    peers.push(format!("others {}", t.map.unknown));
                    format!(
                        "gvfs:// peers on {at}, mapped {}; {identity}",
                        peers.join(", ")
                    )
                }
                None => format!("{identity}; no listener for gvfs:// peers"),
            };
            line("TLS", text);
        }
        None => line("TLS", "none (no cert, key and ca)".to_owned()),
    }
    if let Some(dir) = &cfg.mount {
        line(
            "FUSE mount",
            format!(
                "{} (read-ahead {})",
                dir.display(),
                human_bytes(u64::from(cfg.mount_readahead))
            ),
        );
    }
    let control = match (&cfg.control, cfg.listen) {
        (Some(path), _) => path.display().to_string(),
        (None, Some(addr)) => format!("{} (the default)", default_control_path(addr).display()),
        (None, None) => "the default, named after the mount point or TLS address".to_owned(),
    };
    line("control socket", control);
    line(
        "metrics",
        cfg.metrics
            .map_or("none".to_owned(), |a| format!("http://{a}/metrics")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn summary_of(toml: &str) -> String {
        let file = FileConfig::parse(toml).unwrap();
        summary(&Config::from_file_config(file).unwrap())
    }

    #[test]
    fn a_node_is_described_top_first() {
        let s = summary_of(
            r#"
            listen = "127.0.0.2:111"
            upstream = "gvfs://10.0.0.2:20049/export?name=lan-proxy"
            cache_dir = "/var/cache/gvfs/node"
            cache_size = "8G"
            attr_timeout_secs = 60
            cert = "/etc/gvfs/node1.pem"
            key = "/etc/gvfs/node1-key.pem"
            ca = "/etc/gvfs/ca.pem"
            metrics = "127.0.0.1:9103"
            "#,
        );
        let at = |what: &str| s.find(what).unwrap_or_else(|| panic!("{what} not in {s}"));
        assert!(at("metadata layer") < at("attribute cache"));
        assert!(at("attribute cache") < at("block cache"));
        assert!(at("block cache") < at("upstream"));
        for part in [
            "/var/cache/gvfs/node: 8 GiB, 64 KiB blocks",
            "its certificate named lan-proxy",
            "file cache in /var/cache/gvfs/node/files (at most 16 GiB), dedup across images on",
            "127.0.0.2:111 (NFSv3, MOUNT v3, PORTMAP v2; RFC 9289 STARTTLS",
            "certificate /etc/gvfs/node1.pem, CA /etc/gvfs/ca.pem; no listener for gvfs:// peers",
            "http://127.0.0.1:9103/metrics",
        ] {
            assert!(s.contains(part), "{part:?} not in {s}");
        }
    }

    #[test]
    fn a_plain_forwarder_has_only_its_upstream() {
        let s = summary_of(r#"upstream = "nfs://filer/srv?mountport=20048""#);
        assert!(s.contains(
            "upstream         nfs://filer/srv (NFSv3: NFS port the portmapper's, MOUNT port 20048)"
        ));
        for absent in ["block cache", "attribute cache", "metadata layer"] {
            assert!(!s.contains(absent), "{absent} in {s}");
        }
        assert!(s.contains("TLS              none"));
    }

    #[test]
    fn an_image_server_lists_its_peers() {
        let s = summary_of(
            r#"
            upstream = "dir:/srv/images"
            listen_tls = "0.0.0.0:20049"
            cert = "/etc/gvfs/image-server.pem"
            key = "/etc/gvfs/image-server-key.pem"
            ca = "/etc/gvfs/ca.pem"
            [peers]
            lan-proxy = "pass"
            "#,
        );
        assert!(
            s.contains("gvfs:// peers on 0.0.0.0:20049, mapped lan-proxy=pass, others squash"),
            "{s}"
        );
        assert!(s.contains("no file cache (no cache_dir)"), "{s}");
    }

    #[test]
    fn sizes_read_in_their_largest_unit() {
        assert_eq!(human_bytes(64 << 10), "64 KiB");
        assert_eq!(human_bytes(16 << 30), "16 GiB");
        assert_eq!(human_bytes(1536 << 20), "1536 MiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
        assert_eq!(human_bytes(0), "0 bytes");
    }
}

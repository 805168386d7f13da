use super::*;

#[test]
fn defaults_serve_the_sample_on_loopback() {
    let c = Config::from_file_config(FileConfig::default()).unwrap();
    assert_eq!(c.listen, Some(DEFAULT_LISTEN_ADDR));
    assert_eq!(DEFAULT_LISTEN_ADDR.to_string(), DEFAULT_LISTEN);
    assert_eq!(
        c.upstream,
        UpstreamChoice::Sample(PathBuf::from(SAMPLE_DIR))
    );
    assert_eq!(c.export, "/export");
}

#[test]
fn plain_listener_stays_on_loopback_unless_allowed() {
    let f = FileConfig {
        server: ServerSection {
            listen: Some("0.0.0.0:2049".into()),
            ..ServerSection::default()
        },
        ..FileConfig::default()
    };
    let err = Config::from_file_config(f.clone()).unwrap_err().to_string();
    assert!(err.contains("--allow-remote"), "{err}");
    let ok = FileConfig {
        server: ServerSection {
            allow_remote: Some(true),
            ..f.server.clone()
        },
        ..f
    };
    assert!(Config::from_file_config(ok).is_ok());
}

#[test]
fn toml_round_trip_and_unknown_keys() {
    let f: FileConfig = toml::from_str(
        "listen = \"127.0.0.2:111\"\nupstream = \"dir:/srv\"\nupstream_timeout_secs = 0\n",
    )
    .unwrap();
    let c = Config::from_file_config(f).unwrap();
    assert_eq!(c.listen.map(|a| a.port()), Some(111));
    assert_eq!(c.upstream_timeout, None);
    assert!(FileConfig::parse("lisen = \"x\"").is_err());
    let f: FileConfig = toml::from_str(
        "max_connections = 8\nmax_pending_connections = 3\nidle_timeout_secs = 42\n",
    )
    .unwrap();
    let limits = Config::from_file_config(f).unwrap().limits;
    assert_eq!(
        (
            limits.max_connections,
            limits.max_pending,
            limits.idle_timeout
        ),
        (8, 3, Duration::from_secs(42))
    );
}

#[test]
fn bad_values_are_one_line_errors() {
    for f in [
        FileConfig {
            server: ServerSection {
                listen: Some("nope".into()),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                upstream: Some("ftp://x".into()),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                upstream: Some("dir:".into()),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                export: Some("export".into()),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                max_in_flight: Some(0),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                max_pending_connections: Some(0),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                idle_timeout_secs: Some(0),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
        FileConfig {
            server: ServerSection {
                buffer_memory: Some("1M".into()),
                ..ServerSection::default()
            },
            ..FileConfig::default()
        },
    ] {
        let e = Config::from_file_config(f).unwrap_err().to_string();
        assert!(!e.contains('\n') && !e.is_empty());
    }
}

#[test]
fn sizes_and_cache_settings() {
    assert_eq!(parse_size("4G").unwrap(), 4 << 30);
    assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
    assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
    assert!(parse_size("4X").is_err() && parse_size("").is_err() && parse_size("G").is_err());
    let c = Config::from_file_config(FileConfig {
        cache: CacheSection {
            cache_dir: Some("/tmp/c".into()),
            cache_size: Some("64M".into()),
            block_size: Some("128K".into()),
            write_policy: Some("write-through".into()),
            ..CacheSection::default()
        },
        ..FileConfig::default()
    })
    .unwrap();
    let cache = c.cache.unwrap();
    assert_eq!(cache.geometry.block_size(), 128 << 10);
    assert_eq!(cache.layer.policy, gvfs_cache::WritePolicy::WriteThrough);
    let orphan = FileConfig {
        cache: CacheSection {
            cache_size: Some("1G".into()),
            ..CacheSection::default()
        },
        ..FileConfig::default()
    };
    assert!(
        Config::from_file_config(orphan)
            .unwrap_err()
            .to_string()
            .contains("--cache-dir")
    );
    let bad = FileConfig {
        cache: CacheSection {
            cache_dir: Some("/tmp/c".into()),
            block_size: Some("3K".into()),
            ..CacheSection::default()
        },
        ..FileConfig::default()
    };
    assert!(Config::from_file_config(bad).is_err());
}

#[test]
fn cache_options_without_a_cache_are_refused() {
    let cases = [
        (
            FileConfig {
                cache: CacheSection {
                    readahead_blocks: Some(8),
                    ..CacheSection::default()
                },
                ..FileConfig::default()
            },
            "--readahead (readahead_blocks in the file)",
        ),
        (
            FileConfig {
                cache: CacheSection {
                    writeback_on_exit: Some(false),
                    ..CacheSection::default()
                },
                ..FileConfig::default()
            },
            "--no-writeback-on-exit (writeback_on_exit in the file)",
        ),
        (
            FileConfig {
                cache: CacheSection {
                    exit_writeback_timeout_secs: Some(5),
                    ..CacheSection::default()
                },
                ..FileConfig::default()
            },
            "--exit-writeback-timeout (exit_writeback_timeout_secs in the file)",
        ),
    ];
    for (f, what) in cases {
        let e = Config::from_file_config(f).unwrap_err().to_string();
        assert!(e.starts_with(what), "{e}");
        assert!(e.contains("add --cache-dir DIR"), "{e}");
    }
    for line in [
        "readahead_blocks = 8",
        "writeback_on_exit = false",
        "exit_writeback_timeout_secs = 5",
    ] {
        let f: FileConfig = toml::from_str(line).unwrap();
        let e = Config::from_file_config(f).unwrap_err().to_string();
        assert!(e.contains("there is no cache"), "{line}: {e}");
    }
    let with_cache = FileConfig {
        cache: CacheSection {
            cache_dir: Some("/tmp/c".into()),
            readahead_blocks: Some(8),
            writeback_on_exit: Some(false),
            exit_writeback_timeout_secs: Some(5),
            ..CacheSection::default()
        },
        ..FileConfig::default()
    };
    assert!(Config::from_file_config(with_cache).is_ok());
}

#[test]
fn tls_options_without_tls_are_refused() {
    let cases = [
        (
            FileConfig {
                tls: TlsSection {
                    peers: Some([("node1".into(), "pass".into())].into()),
                    ..TlsSection::default()
                },
                ..FileConfig::default()
            },
            "--map-peer ([peers] in the file)",
        ),
        (
            FileConfig {
                tls: TlsSection {
                    unknown_peers: Some("squash".into()),
                    ..TlsSection::default()
                },
                ..FileConfig::default()
            },
            "--unknown-peers (unknown_peers in the file)",
        ),
        (
            FileConfig {
                tls: TlsSection {
                    handshake_timeout_secs: Some(3),
                    ..TlsSection::default()
                },
                ..FileConfig::default()
            },
            "--handshake-timeout (handshake_timeout_secs in the file)",
        ),
        (
            FileConfig {
                tls: TlsSection {
                    nobody: Some((65534, 65534)),
                    ..TlsSection::default()
                },
                ..FileConfig::default()
            },
            "nobody in the file",
        ),
    ];
    for (f, what) in cases {
        let e = Config::from_file_config(f).unwrap_err().to_string();
        assert!(e.starts_with(what), "{e}");
        assert!(e.contains("add --cert, --key and --ca"), "{e}");
    }
    for text in [
        "[peers]\nnode1 = \"pass\"",
        "unknown_peers = \"squash\"",
        "handshake_timeout_secs = 3",
    ] {
        let f: FileConfig = toml::from_str(text).unwrap();
        let e = Config::from_file_config(f).unwrap_err().to_string();
        assert!(e.contains("there is no TLS"), "{text}: {e}");
    }
}

#[test]
fn config_file_errors_give_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, "listen = \"127.0.0.1:2049\"\nexport = /images\n").unwrap();
    let e = FileConfig::load(&path).unwrap_err().to_string();
    assert!(e.starts_with("bad config file "), "{e}");
    assert!(e.contains("line 2, column 10"), "{e}");
    std::fs::write(&path, "listen = \"127.0.0.1:2049\"\nlisen = \"x\"\n").unwrap();
    let e = FileConfig::load(&path).unwrap_err().to_string();
    assert!(e.contains("line 2, column 1"), "{e}");
    assert!(e.contains("unknown field `lisen`"), "{e}");
}

#[test]
fn command_line_wins() {
    let file = FileConfig {
        server: ServerSection {
            listen: Some("127.0.0.1:1".into()),
            export: Some("/a".into()),
            ..ServerSection::default()
        },
        ..FileConfig::default()
    };
    let cli = FileConfig {
        server: ServerSection {
            listen: Some("127.0.0.1:2".into()),
            ..ServerSection::default()
        },
        ..FileConfig::default()
    };
    let m = file.overridden_by(cli).unwrap();
    assert_eq!(m.server.listen.as_deref(), Some("127.0.0.1:2"));
    assert_eq!(m.server.export.as_deref(), Some("/a"));
}

/// The settings as flags, as the binary takes them.
#[derive(Debug, clap::Parser)]
struct Flags {
    #[command(flatten)]
    settings: FileConfig,
}

#[test]
fn a_flag_and_a_file_key_are_one_setting() {
    use clap::Parser;
    let flags = Flags::try_parse_from([
        "gvfs-proxy",
        "--cache-size",
        "8M",
        "--no-writeback-on-exit",
        "--allow-remote",
        "--meta",
        "--readahead",
        "4",
        "--upstream-timeout",
        "3",
        "--drain-timeout",
        "2",
    ])
    .unwrap();
    let file: FileConfig = toml::from_str(
        "cache_size = \"8M\"\nwriteback_on_exit = false\nallow_remote = true\nmeta = true\n\
         readahead_blocks = 4\nupstream_timeout_secs = 3\ndrain_timeout_secs = 2\n",
    )
    .unwrap();
    assert_eq!(flags.settings, file);
    // Nothing given is nothing set: the file's values stay.
    let none = Flags::try_parse_from(["gvfs-proxy"]).unwrap().settings;
    assert_eq!(none, FileConfig::default());
    assert_eq!(file.clone().overridden_by(none).unwrap(), file);
}

#[test]
fn every_key_of_every_section_parses() {
    let f = FileConfig::parse(
        "listen = \"127.0.0.1:2049\"\nupstream = \"dir:/srv\"\nexport = \"/export\"\n\
         allow_remote = false\nupstream_timeout_secs = 0\nconnect_timeout_secs = 5\n\
         max_connections = 256\nmax_pending_connections = 64\nmax_in_flight = 64\n\
         idle_timeout_secs = 600\nbuffer_memory = \"256M\"\ndrain_timeout_secs = 10\n\
         attr_timeout_secs = 3\nmount = \"/mnt/gvfs\"\nmount_readahead = \"0\"\nmount_trace = \"/tmp/t\"\nmount_keep = \"none\"\ncache_dir = \"/var/cache/gvfs\"\ncache_size = \"4G\"\n\
         cache_banks = 16\ncache_ways = 16\nblock_size = \"64K\"\n\
         write_policy = \"write-back\"\nreadahead_blocks = 32\nwriteback_on_exit = true\n\
         exit_writeback_timeout_secs = 60\nmeta = true\nfile_cache_size = \"16G\"\ndedup = false\n\
         learn_window_secs = 20\n\
         listen_tls = \"127.0.0.1:20049\"\ncert = \"n.pem\"\nkey = \"k.pem\"\nca = \"ca.pem\"\n\
         handshake_timeout_secs = 10\nunknown_peers = \"squash\"\nnobody = [65534, 65534]\n\
         [peers]\nsite-a = \"fixed:1000:1000\"\n",
    )
    .unwrap();
    assert_eq!(f.server.attr_timeout_secs, Some(3));
    assert_eq!(f.cache.cache_ways, Some(16));
    assert_eq!(f.tls.nobody, Some((65534, 65534)));
    assert_eq!(
        f.tls
            .peers
            .as_ref()
            .and_then(|p| p.get("site-a"))
            .map(String::as_str),
        Some("fixed:1000:1000")
    );
    assert_eq!(f.meta.meta, Some(true));
    assert_eq!(f.meta.dedup, Some(false));
    assert_eq!(f.server.mount, Some(PathBuf::from("/mnt/gvfs")));
    // Every key the help names is a key of the file, and nothing else.
    assert_eq!(f.meta.learn_window_secs, Some(20));
    assert_eq!(f.server.mount_trace, Some(PathBuf::from("/tmp/t")));
    assert_eq!(f.server.mount_keep.as_deref(), Some("none"));
    assert_eq!(FileConfig::keys().len(), 40);
}

#[test]
fn mount_readahead_needs_a_mount_and_is_capped() {
    let parse = |args: &[&str]| {
        let mut all = vec!["gvfs-proxy", "--upstream", "dir:/srv"];
        all.extend_from_slice(args);
        <Flags as clap::Parser>::try_parse_from(all)
            .map_err(|e| e.to_string())
            .and_then(|f| Config::from_file_config(f.settings).map_err(|e| e.to_string()))
    };
    let c = parse(&["--mount", "/mnt/g", "--mount-readahead", "0"]).unwrap();
    assert_eq!(c.mount_readahead, 0);
    let c = parse(&["--mount", "/mnt/g"]).unwrap();
    assert_eq!(c.mount_readahead, gvfs_fuse::DEFAULT_READ_AHEAD);
    let e = parse(&["--mount-trace", "/tmp/t"]).unwrap_err();
    assert!(e.contains("needs --mount"), "{e}");
    let c = parse(&["--mount", "/mnt/g", "--mount-trace", "/tmp/t"]).unwrap();
    assert_eq!(c.mount_trace.as_deref(), Some(Path::new("/tmp/t")));
    let e = parse(&["--mount-readahead", "64K"]).unwrap_err();
    assert!(e.contains("needs --mount"), "{e}");
    let e = parse(&["--mount", "/mnt/g", "--mount-readahead", "1G"]).unwrap_err();
    assert!(e.contains("at most"), "{e}");
    assert!(parse(&["--mount", "/mnt/g"]).unwrap().mount_keep);
    let c = parse(&["--mount", "/mnt/g", "--mount-keep", "none"]).unwrap();
    assert!(!c.mount_keep);
    let e = parse(&["--mount", "/mnt/g", "--mount-keep", "always"]).unwrap_err();
    assert!(e.contains("`auto` or `none`"), "{e}");
    let e = parse(&["--mount-keep", "auto"]).unwrap_err();
    assert!(e.contains("needs --mount"), "{e}");
}

#[test]
fn the_learn_window_needs_a_cache_and_is_bounded() {
    let parse = |args: &[&str]| {
        let mut all = vec!["gvfs-proxy", "--upstream", "dir:/srv"];
        all.extend_from_slice(args);
        <Flags as clap::Parser>::try_parse_from(all)
            .map_err(|e| e.to_string())
            .and_then(|f| Config::from_file_config(f.settings).map_err(|e| e.to_string()))
    };
    let window = |c: Config| c.cache.map(|c| c.learn_window.as_secs());
    let cache = ["--cache-dir", "/var/cache/gvfs"];
    assert_eq!(parse(&cache).map(window), Ok(Some(20)));
    let c = parse(&[&cache[..], &["--learn-window", "300"]].concat());
    assert_eq!(c.map(window), Ok(Some(300)));
    for bad in ["0", "301"] {
        let e = parse(&[&cache[..], &["--learn-window", bad]].concat()).unwrap_err();
        assert!(
            e.contains("--learn-window") && e.contains("from 1 to 300"),
            "{e}"
        );
    }
    let e = parse(&["--learn-window", "5"]).unwrap_err();
    assert!(e.contains("there is no cache"), "{e}");
    let f =
        FileConfig::parse("upstream = \"dir:/srv\"\ncache_dir = \"/c\"\nlearn_window_secs = 0\n")
            .unwrap();
    let e = Config::from_file_config(f).unwrap_err().to_string();
    assert!(e.contains("learn_window_secs in the file"), "{e}");
}

#[test]
fn listen_none_serves_a_mount_only() {
    let parse = |args: &[&str]| {
        let mut all = vec!["gvfs-proxy"];
        all.extend(args);
        Config::from_file_config(
            <Flags as clap::Parser>::try_parse_from(all)
                .unwrap()
                .settings,
        )
    };
    let c = parse(&["--listen", "none", "--mount", "/mnt/vm"]).unwrap();
    assert_eq!(c.listen, None);
    assert_eq!(c.mount.as_deref(), Some(Path::new("/mnt/vm")));
    let e = parse(&["--listen", "none"]).unwrap_err().to_string();
    assert!(e.contains("nothing to serve"), "{e}");
    assert!(
        default_control_path_for_mount(Path::new("/mnt/my vm/"))
            .ends_with("gvfs-proxy-mnt-my-vm.sock")
    );
}

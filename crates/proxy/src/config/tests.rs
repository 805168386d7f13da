use super::*;

#[test]
fn defaults_serve_the_sample_on_loopback() {
    let c = Config::from_file_config(FileConfig::default()).unwrap();
    assert_eq!(c.listen, DEFAULT_LISTEN.parse().unwrap());
    assert_eq!(
        c.upstream,
        UpstreamChoice::Sample(PathBuf::from(SAMPLE_DIR))
    );
    assert_eq!(c.export, "/export");
}

#[test]
fn plain_listener_stays_on_loopback_unless_allowed() {
    let f = FileConfig {
        listen: Some("0.0.0.0:2049".into()),
        ..FileConfig::default()
    };
    let err = Config::from_file_config(f.clone()).unwrap_err().to_string();
    assert!(err.contains("--allow-remote"), "{err}");
    let ok = FileConfig {
        allow_remote: Some(true),
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
    assert_eq!(c.listen.port(), 111);
    assert_eq!(c.upstream_timeout, None);
    assert!(toml::from_str::<FileConfig>("lisen = \"x\"").is_err());
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
            listen: Some("nope".into()),
            ..FileConfig::default()
        },
        FileConfig {
            upstream: Some("ftp://x".into()),
            ..FileConfig::default()
        },
        FileConfig {
            upstream: Some("dir:".into()),
            ..FileConfig::default()
        },
        FileConfig {
            export: Some("export".into()),
            ..FileConfig::default()
        },
        FileConfig {
            max_in_flight: Some(0),
            ..FileConfig::default()
        },
        FileConfig {
            max_pending_connections: Some(0),
            ..FileConfig::default()
        },
        FileConfig {
            idle_timeout_secs: Some(0),
            ..FileConfig::default()
        },
        FileConfig {
            buffer_memory: Some("1M".into()),
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
        cache_dir: Some("/tmp/c".into()),
        cache_size: Some("64M".into()),
        block_size: Some("128K".into()),
        write_policy: Some("write-through".into()),
        ..FileConfig::default()
    })
    .unwrap();
    let cache = c.cache.unwrap();
    assert_eq!(cache.geometry.block_size(), 128 << 10);
    assert_eq!(cache.layer.policy, gvfs_cache::WritePolicy::WriteThrough);
    let orphan = FileConfig {
        cache_size: Some("1G".into()),
        ..FileConfig::default()
    };
    assert!(
        Config::from_file_config(orphan)
            .unwrap_err()
            .to_string()
            .contains("--cache-dir")
    );
    let bad = FileConfig {
        cache_dir: Some("/tmp/c".into()),
        block_size: Some("3K".into()),
        ..FileConfig::default()
    };
    assert!(Config::from_file_config(bad).is_err());
}

#[test]
fn cache_options_without_a_cache_are_refused() {
    let cases = [
        (
            FileConfig {
                readahead_blocks: Some(8),
                ..FileConfig::default()
            },
            "--readahead (readahead_blocks in the file)",
        ),
        (
            FileConfig {
                writeback_on_exit: Some(false),
                ..FileConfig::default()
            },
            "--no-writeback-on-exit (writeback_on_exit in the file)",
        ),
        (
            FileConfig {
                exit_writeback_timeout_secs: Some(5),
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
        cache_dir: Some("/tmp/c".into()),
        readahead_blocks: Some(8),
        writeback_on_exit: Some(false),
        exit_writeback_timeout_secs: Some(5),
        ..FileConfig::default()
    };
    assert!(Config::from_file_config(with_cache).is_ok());
}

#[test]
fn tls_options_without_tls_are_refused() {
    let cases = [
        (
            FileConfig {
                peers: Some([("node1".into(), "pass".into())].into()),
                ..FileConfig::default()
            },
            "--map-peer ([peers] in the file)",
        ),
        (
            FileConfig {
                unknown_peers: Some("squash".into()),
                ..FileConfig::default()
            },
            "--unknown-peers (unknown_peers in the file)",
        ),
        (
            FileConfig {
                handshake_timeout_secs: Some(3),
                ..FileConfig::default()
            },
            "--handshake-timeout (handshake_timeout_secs in the file)",
        ),
        (
            FileConfig {
                nobody: Some((65534, 65534)),
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
        listen: Some("127.0.0.1:1".into()),
        export: Some("/a".into()),
        ..FileConfig::default()
    };
    let cli = FileConfig {
        listen: Some("127.0.0.1:2".into()),
        ..FileConfig::default()
    };
    let m = file.overridden_by(cli).unwrap();
    assert_eq!(m.listen.as_deref(), Some("127.0.0.1:2"));
    assert_eq!(m.export.as_deref(), Some("/a"));
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

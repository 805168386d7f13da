//! What a clone's logs say went wrong: the error lines of the guest's
//! serial console and QEMU's log.

use std::path::Path;

/// Lines of a guest console or QEMU log that report an error: a block
/// device or file system error in the guest, our init script's own
/// failures, a kernel oops, or a QEMU error message.
pub fn console_errors(text: &str) -> Vec<String> {
    const SIGNS: [&str; 9] = [
        "i/o error",
        "buffer i/o",
        "blk_update_request",
        "ext4-fs error",
        "ext4-fs warning",
        "gvfs-guest: ",
        "call trace",
        "kernel panic",
        "error",
    ];
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            SIGNS.iter().any(|s| low.contains(s))
        })
        .map(str::to_owned)
        .collect()
}

/// The error lines ([`console_errors`]) of the guest's console and QEMU's
/// log in a clone's directory, each named by its file.
pub(super) fn log_errors(dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    for log in ["serial.log", "qemu.log"] {
        let text = std::fs::read(dir.join(log)).unwrap_or_default();
        errors.extend(
            console_errors(&String::from_utf8_lossy(&text))
                .into_iter()
                .map(|l| format!("{log}: {l}")),
        );
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_errors_finds_block_and_file_system_errors_only() {
        let serial = "tick 41 0123456789abcdef0123456789abcdef\n\
                      [   12.5] I/O error, dev vda, sector 2048 op 0x0:(READ)\n\
                      [   12.6] EXT4-fs error (device vda): ext4_find_entry:1663\n\
                      gvfs-guest ready runs=8\n\
                      gvfs-guest: mount failed\n\
                      tick 42 0123456789abcdef0123456789abcdef\r\n";
        let e = console_errors(serial);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].contains("I/O error"));
        assert!(e[2].ends_with("mount failed"));
        assert!(console_errors("tick 1 abc\ngvfs-guest ready runs=3\n").is_empty());
        assert_eq!(
            console_errors("qemu-system-x86_64: Failed to read: Input/output error").len(),
            1
        );
    }
}

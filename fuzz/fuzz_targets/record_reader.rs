//! Feeds arbitrary bytes, in arbitrary chunk sizes, to the record reader:
//! it must never panic and never buffer more than its record cap.
#![no_main]

use gvfs_nfs::record::{RecordLimits, RecordReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else { return };
    let limits = RecordLimits { max_fragment: 4096, max_record: 16384 };
    let mut reader = RecordReader::new(limits);
    for piece in rest.chunks(usize::from(chunk).max(1)) {
        let mut piece = piece;
        while !piece.is_empty() {
            match reader.feed(piece) {
                Ok(used) => piece = &piece[used..],
                Err(_) => return,
            }
            if let Some(rec) = reader.take_record() {
                assert!(rec.len() <= limits.max_record as usize);
            }
        }
    }
});

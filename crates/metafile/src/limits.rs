//! The metadata file's numbers: its magic, versions and limits (the
//! layout that uses them is specified in `format.rs`).

/// Metadata file magic.
pub const META_MAGIC: [u8; 8] = *b"GVFSMETA";
/// Format version of a file without repeats.
pub const META_VERSION: u32 = 1;
/// Format version of a file with repeats.
pub const META_VERSION_REPEATS: u32 = 2;
/// Format version of a file with block hashes.
pub const META_VERSION_HASHES: u32 = 4;
/// Format version of a file with block hashes, the zero pieces' too (read,
/// not written).
pub const META_VERSION_ALL_HASHES: u32 = 3;
/// The zstd level chunks of a whole-file transfer are compressed at, and
/// the level a scan measures `compressed_size` at: fast, and most of what a
/// VM image saves comes from runs of zeros and repeats any level finds.
pub const LEVEL: i32 = 3;
/// The suffix of a metadata file name: `.NAME.gvfsmeta` describes `NAME`.
pub const META_SUFFIX: &str = ".gvfsmeta";
/// The largest metadata file accepted: a peer-supplied one larger than this
/// is refused before anything is allocated for it. Room for the hashes of
/// 4 GiB of non-zero 4 KiB blocks.
pub const MAX_META_LEN: usize = 32 << 20;
/// The most a metadata file's zero map and repeats take (the size every
/// version before hashes was held to): a scan keeps a map within it.
pub const MAX_MAP_LEN: usize = 1 << 20;
/// Smallest block size a metadata file may use.
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;
/// Largest block size a metadata file may use.
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// Longest file name (Linux `NAME_MAX`); the metadata file name must fit too.
pub const MAX_NAME_LEN: usize = 255;

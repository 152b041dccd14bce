use std::fmt;
use weft_fabric::FabricError;

/// Result of a weft operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in weft, each with a message that says what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A `WEFT_*` variable or builder value is invalid.
    Config(String),
    /// The fabric failed (operating system, start-up, malformed bytes).
    Fabric(FabricError),
    /// A remote address outside its segment.
    OutOfBounds {
        /// Target rank.
        rank: u32,
        /// Segment id.
        segment: u32,
        /// Byte offset of the access.
        offset: usize,
        /// Bytes accessed.
        len: usize,
        /// Bytes of the segment on each rank.
        segment_len: usize,
    },
    /// A remote address not aligned for its element type.
    Misaligned {
        /// Byte offset of the access.
        offset: usize,
        /// Alignment the element type needs.
        align: usize,
    },
    /// A rank that is not part of the job.
    NoSuchRank {
        /// The rank named.
        rank: u32,
        /// Ranks in the job.
        size: u32,
    },
    /// A segment id that does not exist.
    NoSuchSegment(u32),
    /// A distributed object id that names nothing on this rank, or an object of another type.
    NoSuchDist {
        /// The id.
        id: u64,
        /// The type it was looked up as.
        wanted: &'static str,
    },
    /// A team segment addressed on a rank that does not hold it.
    NotMember {
        /// The rank named.
        rank: u32,
        /// The segment.
        segment: u32,
    },
    /// A peer died or left while this rank depended on it.
    PeerFailed {
        /// The peer.
        rank: u32,
        /// What happened to it.
        reason: String,
    },
    /// Ranks disagree on the arguments of a collective call.
    Mismatch(String),
    /// A non-contiguous transfer's pieces do not fit their buffer, or the two sides' totals
    /// differ.
    BadPieces(String),
    /// An AM handler id that is not registered.
    UnknownHandler {
        /// The handler id.
        id: u16,
        /// The rank that named it.
        src: u32,
    },
    /// A payload or argument list over the documented maximum.
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// An operation that is not allowed where it was called (for example a request sent from
    /// inside a handler, or a second reply).
    Misuse(&'static str),
    /// The target of an AM-based operation rejected it.
    Remote(String),
    /// A value could not be encoded for sending (its `Serialize` implementation failed).
    Encode(String),
    /// A global index of a distributed array out of its range (in a batch: nothing of the
    /// batch was sent).
    IndexOutOfRange {
        /// The index.
        index: usize,
        /// Its position in a batch's indices (`None` for a single operation).
        position: Option<usize>,
        /// The array's length.
        len: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(s) => write!(f, "configuration: {s}"),
            Error::Fabric(e) => write!(f, "fabric: {e}"),
            // Offsets that overflowed saturate: say so rather than print 2^64 - 1.
            Error::OutOfBounds { rank, segment, offset: usize::MAX, len, segment_len } => write!(
                f,
                "remote access of {len} bytes at an offset that overflowed, in segment {segment} on rank {rank}, is out of bounds (segment is {segment_len} bytes)"
            ),
            Error::OutOfBounds { rank, segment, offset, len, segment_len } => write!(
                f,
                "remote access of {len} bytes at byte offset {offset} of segment {segment} on rank {rank} is out of bounds (segment is {segment_len} bytes)"
            ),
            Error::Misaligned { offset, align } => {
                write!(f, "remote address at byte offset {offset} is not aligned to {align} bytes")
            }
            Error::NoSuchRank { rank, size } => write!(f, "rank {rank} does not exist (job of {size} ranks)"),
            Error::NoSuchSegment(id) => write!(f, "segment {id} does not exist"),
            Error::NoSuchDist { id, wanted } => {
                write!(f, "no distributed object #{id} of type {wanted} on this rank")
            }
            Error::NotMember { rank, segment } => {
                write!(f, "segment {segment} is a team segment that rank {rank} does not hold")
            }
            Error::PeerFailed { rank, reason } => write!(f, "rank {rank} {reason}"),
            Error::Mismatch(s) => write!(f, "ranks disagree: {s}"),
            Error::BadPieces(s) => write!(f, "bad pieces: {s}"),
            Error::UnknownHandler { id, src } => write!(f, "unknown AM handler {id} (from rank {src})"),
            Error::TooLarge { what, len, max } => write!(f, "{what} of {len} exceeds the maximum of {max}"),
            Error::IndexOutOfRange { index, position: Some(p), len } => write!(
                f,
                "index {index} (item {p} of the batch's indices) is out of range for an array of {len} elements"
            ),
            Error::IndexOutOfRange { index, position: None, len } => {
                write!(f, "index {index} is out of range for an array of {len} elements")
            }
            Error::Misuse(s) => write!(f, "not allowed: {s}"),
            Error::Remote(s) => write!(f, "remote side: {s}"),
            Error::Encode(s) => write!(f, "cannot encode: {s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<FabricError> for Error {
    fn from(e: FabricError) -> Self {
        match e {
            FabricError::Peer { rank, reason } => Error::PeerFailed { rank, reason },
            FabricError::TooLarge { what, len, max } => Error::TooLarge { what, len, max },
            FabricError::Config { what } => Error::Config(what),
            e => Error::Fabric(e),
        }
    }
}

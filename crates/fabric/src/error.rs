use std::fmt;

/// Result of a fabric operation.
pub type FabricResult<T> = Result<T, FabricError>;

/// What can go wrong below the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricError {
    /// An operating-system call failed.
    Os { what: String, errno: i32 },
    /// A peer is gone or never came up.
    Peer { rank: u32, reason: String },
    /// Start-up did not complete in time.
    Timeout { what: String },
    /// An address or length outside a registered region.
    OutOfBounds { offset: usize, len: usize, region_len: usize },
    /// Bytes received that do not form a valid message.
    Malformed { what: String },
    /// A message larger than the fabric carries.
    TooLarge { what: &'static str, len: usize, max: usize },
    /// The fabric cannot do this operation; the runtime must use its AM-based path.
    Unsupported { what: &'static str },
    /// Ranks disagree on start-up parameters.
    Mismatch { what: String },
    /// More of a resource was asked for than the fabric provides.
    Limit { what: &'static str, asked: usize, max: usize },
    /// A shared file weft was about to create exists already (another process holds the name).
    Exists { path: String },
    /// A shared file that weft did not create (another user's, a link, readable by others):
    /// refused, never mapped. One string (its path and why), so that the error, which every
    /// fabric call returns, stays as small as the others.
    Untrusted { what: String },
    /// The configuration asks for what this build or start-up cannot give.
    Config { what: String },
}

impl FabricError {
    /// Builds an [`FabricError::Os`] from `errno` of the last failed call.
    pub fn last_os(what: impl Into<String>) -> Self {
        FabricError::Os {
            what: what.into(),
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricError::Os { what, errno } => {
                write!(f, "{what}: {}", std::io::Error::from_raw_os_error(*errno))
            }
            FabricError::Peer { rank, reason } => write!(f, "rank {rank} {reason}"),
            FabricError::Timeout { what } => write!(f, "timed out: {what}"),
            FabricError::OutOfBounds { offset, len, region_len } => write!(
                f,
                "access of {len} bytes at offset {offset} is outside a region of {region_len} bytes"
            ),
            FabricError::Malformed { what } => write!(f, "malformed message: {what}"),
            FabricError::Config { what } => write!(f, "{what}"),
            FabricError::TooLarge { what, len, max } => {
                write!(f, "{what} of {len} bytes exceeds the maximum of {max} bytes")
            }
            FabricError::Unsupported { what } => write!(f, "not supported by this fabric: {what}"),
            FabricError::Mismatch { what } => write!(f, "ranks disagree: {what}"),
            FabricError::Limit { what, asked, max } => {
                write!(f, "{asked} {what} asked for; this fabric provides at most {max}")
            }
            FabricError::Exists { path } => {
                write!(f, "{path} exists already: another process holds this name")
            }
            FabricError::Untrusted { what } => write!(f, "refusing to use {what}"),
        }
    }
}

impl std::error::Error for FabricError {}

// Every fabric call returns a `FabricResult`: a larger error makes each of them return through
// memory (a variant of two `String`s cut the medium AM rate to a third).
const _: () = assert!(std::mem::size_of::<FabricError>() <= 40);

//! Choosing and opening a fabric: the one place that names the fabrics by type. The runtime
//! calls [`open`] and sees only the [`Fabric`] trait; adding a fabric is a module and an arm
//! here.

use crate::boot::Bootstrap;
use crate::shm::{ShmConfig, ShmFabric};
use crate::{Fabric, FabricError, FabricResult, Rank};
use std::time::Duration;

/// Which fabric carries the job's traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FabricChoice {
    /// Shared memory between the processes of one node.
    Shm,
    /// libfabric, with an optional provider and domain name.
    Ofi {
        /// Provider name (`WEFT_OFI_PROVIDER`).
        provider: Option<String>,
        /// Domain name (`WEFT_OFI_DOMAIN`).
        domain: Option<String>,
        /// Ranks of one host talk through shared memory (`WEFT_SAME_HOST=shm`, the default)
        /// rather than through libfabric (`ofi`).
        same_host_shm: bool,
        /// Memory the caller owns is registered for a transfer from this many bytes up
        /// (`WEFT_OFI_ZCOPY_KIB`; `None`: 16 KiB).
        zcopy_bytes: Option<usize>,
        /// Register local buffers as if the provider required `FI_MR_LOCAL`
        /// (`WEFT_OFI_MR_LOCAL=1`).
        mr_local: bool,
        /// Connections accepted on a rank's TCP port that have sent nothing for this long are
        /// shut down (zero: never), and beyond this many at once (`WEFT_OFI_SILENT_MS`,
        /// `WEFT_OFI_SILENT_MAX`).
        silent: (std::time::Duration, usize),
    },
}

/// What opening a fabric needs.
pub struct OpenConfig<'a> {
    /// The fabric.
    pub choice: &'a FabricChoice,
    /// Job id, unique on the node (part of every shared file's name).
    pub job: &'a str,
    /// This rank.
    pub rank: Rank,
    /// Ranks in the job.
    pub size: u32,
    /// Size of the shared-memory AM rings.
    pub rings: crate::RingSize,
    /// How long start-up (and a libfabric operation) waits.
    pub init_timeout: Duration,
    /// The start-up channel of a launcher other than `weft run` (PMIx), if any.
    pub bootstrap: Option<&'a dyn Bootstrap>,
}

/// Opens the fabric `cfg.choice` names: shared memory; libfabric; or, with libfabric and
/// `same_host_shm` where ranks share a host, the hybrid of the two.
///
/// ```no_run
/// use weft_fabric::open::{open, FabricChoice, OpenConfig};
/// let cfg = OpenConfig {
///     choice: &FabricChoice::Shm,
///     job: "example",
///     rank: 0,
///     size: 1,
///     rings: weft_fabric::RingSize::Fixed(256 << 10),
///     init_timeout: std::time::Duration::from_secs(60),
///     bootstrap: None,
/// };
/// let fabric = open(&cfg)?;
/// assert_eq!(fabric.size(), 1);
/// # Ok::<(), weft_fabric::FabricError>(())
/// ```
pub fn open(cfg: &OpenConfig<'_>) -> FabricResult<Box<dyn Fabric>> {
    raise_descriptor_limit();
    match cfg.choice {
        FabricChoice::Shm => Ok(Box::new(ShmFabric::init(ShmConfig {
            job: cfg.job.to_string(),
            rank: cfg.rank,
            size: cfg.size,
            rings: cfg.rings,
            init_timeout: cfg.init_timeout,
        })?)),
        #[cfg(feature = "ofi")]
        FabricChoice::Ofi { provider, domain, same_host_shm, zcopy_bytes, mr_local, silent } => {
            let wanted = crate::ofi::Wanted {
                provider: provider.clone(),
                domain: domain.clone(),
                mr_local: *mr_local,
            };
            open_ofi(cfg, wanted, *same_host_shm, *zcopy_bytes, *silent)
        }
        #[cfg(not(feature = "ofi"))]
        FabricChoice::Ofi { .. } => Err(FabricError::Config {
            what: "WEFT_FABRIC=ofi: this build has no libfabric support (build with `--features ofi`)".into(),
        }),
    }
}

#[cfg(feature = "ofi")]
fn open_ofi(
    cfg: &OpenConfig<'_>,
    wanted: crate::ofi::Wanted,
    same_host_shm: bool,
    zcopy_bytes: Option<usize>,
    silent: (std::time::Duration, usize),
) -> FabricResult<Box<dyn Fabric>> {
    use crate::boot::{LauncherBoot, Solo};
    use crate::hybrid::{HybridConfig, HybridFabric};
    use crate::ofi::{OfiConfig, OfiFabric};
    let launcher = LauncherBoot::from_env(cfg.rank, cfg.size, cfg.init_timeout)?;
    let boot: &dyn Bootstrap = match (&launcher, cfg.bootstrap) {
        (Some(b), _) => b,
        (None, Some(b)) => b,
        (None, None) if cfg.size == 1 => &Solo,
        (None, None) => {
            return Err(FabricError::Config {
                what: "WEFT_FABRIC=ofi needs a start-up channel: start the job with `weft run`, \
                       or with mpirun / srun in a build with the `pmix` feature"
                    .into(),
            })
        }
    };
    let ofi = OfiFabric::init(OfiConfig { wanted, op_timeout: cfg.init_timeout, zcopy_bytes, silent }, boot)?;
    // Every rank makes the same choice: region descriptors differ between the two.
    if !same_host_shm || !ofi.hosts_shared() {
        return Ok(Box::new(ofi));
    }
    let hybrid = HybridConfig { job: cfg.job.to_string(), rings: cfg.rings, init_timeout: cfg.init_timeout };
    Ok(Box::new(HybridFabric::init(ofi, hybrid)?))
}

/// Raises this process's soft limit on open file descriptors to its hard limit: a rank of a
/// large job holds a connection per peer on a network, and outsiders' connections may take
/// some for a while (see `ofi::guard`). A limit that cannot be raised stays as it was.
fn raise_descriptor_limit() {
    // SAFETY: rlimit is plain data that getrlimit fills; setrlimit only reads it.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

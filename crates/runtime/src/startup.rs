//! How this process learns its place in the job: from `weft run`'s variables (`WEFT_RANK`,
//! `WEFT_SIZE`, `WEFT_JOB`, and the start-up channel `WEFT_BOOT_FD`), from the PMIx server of
//! `mpirun` / `srun --mpi=pmix` (feature `pmix`), or alone (rank 0 of 1).

use crate::error::Result;
use weft_fabric::boot::Bootstrap;

/// Who started the job.
pub(crate) enum Startup {
    /// `weft run`, or nobody (a one-rank job): identity from the environment.
    Env,
    /// A PMIx launcher.
    #[cfg(feature = "pmix")]
    Pmix(Box<weft_fabric::boot::pmix::PmixBoot>),
}

/// Rank, size and job name as a launcher gave them.
pub(crate) struct Identity {
    pub rank: u32,
    pub size: u32,
    pub job: String,
    /// Ranks of the job on this node.
    pub local_size: u32,
}

impl Identity {
    /// The job spans more than this node.
    pub fn multi_node(&self) -> bool {
        self.local_size < self.size
    }
}

/// True when a launcher started this process as a rank of a job: `weft run` (its variables)
/// or a PMIx server (`mpirun`, `srun --mpi=pmix`). A tool that would start a job of its own
/// (`weft info`, `weft bench`) acts as that job's rank instead, or refuses.
///
/// ```
/// # use weft_runtime as weft;
/// // A test process started by cargo, not by a launcher:
/// if !weft::launched() {
///     println!("not a rank of a launched job: rank 0 of 1 if it calls World::init");
/// }
/// ```
pub fn launched() -> bool {
    std::env::var_os("WEFT_RANK").is_some() || weft_fabric::boot::launched_by_pmix()
}

/// Asks the job's launcher to stop every rank and end the job with `status`, as OpenSHMEM's
/// `shmem_global_exit` does: `weft run` (when it started this process directly), a PMIx
/// launcher (`mpirun`, `srun --mpi=pmix`, in a build with the `pmix` feature), with `status`
/// (0-255). False where neither can (a wrapper between `weft run` and the rank, a build
/// without PMIx under `mpirun`): then only a failure status stops the others.
///
/// ```no_run
/// if !weft_runtime::end_job(0) {
///     std::process::exit(1); // the one way to stop the others under any launcher
/// }
/// std::process::exit(0);
/// ```
pub fn end_job(status: i32) -> bool {
    weft_fabric::boot::ask_launcher_to_end_job(status)
}

impl Startup {
    /// Finds the launcher. `weft run`'s variables win over PMIx (a `weft run` inside an
    /// allocation); a PMIx launch in a build without the `pmix` feature is an error rather
    /// than N one-rank jobs.
    pub(crate) fn detect() -> Result<Startup> {
        if std::env::var_os("WEFT_RANK").is_some() || !weft_fabric::boot::launched_by_pmix() {
            return Ok(Startup::Env);
        }
        #[cfg(feature = "pmix")]
        {
            Ok(Startup::Pmix(Box::new(weft_fabric::boot::pmix::PmixBoot::init()?)))
        }
        #[cfg(not(feature = "pmix"))]
        Err(crate::Error::Config(
            "started by a PMIx launcher (mpirun or srun) but this build has no PMIx support: \
             build with `--features pmix` (or `cluster`), or start the job with `weft run`"
                .into(),
        ))
    }

    /// The identity the launcher gave, where it is not in the environment. Under PMIx the
    /// job's name takes 64 random bits from rank 0 (one all-gather), so that nobody outside
    /// the job can guess the names of its shared files from the launcher's namespace.
    pub(crate) fn identity(&self) -> Result<Option<Identity>> {
        match self {
            Startup::Env => Ok(None),
            #[cfg(feature = "pmix")]
            Startup::Pmix(p) => {
                let mine = weft_fabric::os::random_u64()?.to_le_bytes();
                let all = p.allgather(&mine)?;
                let salt = all.first().and_then(|b| b.get(..8)).and_then(|b| b.try_into().ok()).ok_or_else(
                    || crate::Error::Config("rank 0's start-up contribution is malformed".into()),
                )?;
                Ok(Some(Identity {
                    rank: p.rank(),
                    size: p.size(),
                    job: format!("{}x{:016x}", job_name(p.namespace()), u64::from_le_bytes(salt)),
                    local_size: p.local_size(),
                }))
            }
        }
    }

    /// The out-of-band all-gather for network fabrics, if this launcher offers one.
    #[cfg_attr(not(feature = "ofi"), allow(dead_code))]
    pub(crate) fn bootstrap(&self) -> Option<&dyn Bootstrap> {
        match self {
            Startup::Env => None,
            #[cfg(feature = "pmix")]
            Startup::Pmix(p) => Some(&**p),
        }
    }
}

/// A job name usable in file names (letters and digits, at most 64) from a launcher's
/// namespace, which may hold any characters; distinct namespaces stay distinct (hashed).
#[cfg_attr(not(feature = "pmix"), allow(dead_code))]
pub(crate) fn job_name(namespace: &str) -> String {
    let clean: String = namespace.chars().filter(|c| c.is_ascii_alphanumeric()).take(24).collect();
    // FNV-1a over the whole namespace keeps names apart that the filter would merge.
    let h =
        namespace.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("p{clean}x{h:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names_are_clean_and_distinct() {
        let a = job_name("prterun-vm-1234@1");
        let b = job_name("prterun-vm-1234@2");
        assert_ne!(a, b);
        for n in [&a, &b, &job_name(&"x/".repeat(100))] {
            assert!(n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric()), "{n}");
        }
    }
}

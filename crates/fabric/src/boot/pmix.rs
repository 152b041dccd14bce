//! Start-up under PMIx launchers (`mpirun` of Open MPI / PRRTE, `srun --mpi=pmix`): rank,
//! job size, local rank and the job's namespace come from the PMIx server the launcher runs;
//! an all-gather is `PMIx_Put` + `PMIx_Commit` + `PMIx_Fence` (collecting data) + one
//! `PMIx_Get` per rank. Every `unsafe` PMIx call of weft is in this file.

use super::{Bootstrap, MAX_CONTRIBUTION};
use crate::{FabricError, FabricResult, Rank};
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use weft_pmix_sys as sys;

fn status(what: &str, rc: sys::pmix_status_t) -> FabricResult<()> {
    if rc == sys::PMIX_SUCCESS as sys::pmix_status_t {
        return Ok(());
    }
    // SAFETY: PMIx_Error_string returns a static NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr(sys::PMIx_Error_string(rc)) }.to_string_lossy().into_owned();
    Err(FabricError::Os { what: format!("{what}: {text} (PMIx status {rc})"), errno: 0 })
}

/// Asks the PMIx server (`mpirun`, `srun --mpi=pmix`) to stop every process of the job and
/// end it with `status` (`PMIx_Abort`); false where this process was not started by one, or
/// the server refused. weft closes its PMIx connection once the job has started (a rank that
/// ends without it then reads to the launcher as one that finalized, so that the other ranks
/// see it vanish), so this opens one again. Open MPI 4.1's `mpirun` then exits with
/// `status`, 0 included.
pub fn abort_job(status: i32, message: &str) -> bool {
    if !super::launched_by_pmix() {
        return false;
    }
    let mut me = sys::pmix_proc_t::default();
    // SAFETY: `me` is a valid pmix_proc_t for PMIx_Init to fill; no info (null, 0). PMIx
    // counts its initializations, so this is harmless where the connection is still open.
    if unsafe { sys::PMIx_Init(&mut me, std::ptr::null_mut(), 0) } != sys::PMIX_SUCCESS as sys::pmix_status_t
    {
        return false;
    }
    let message = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: PMIx is initialized; `message` is NUL-terminated and outlives the call; no
    // process list (null, 0) means every process of this job.
    let rc = unsafe { sys::PMIx_Abort(status, message.as_ptr(), std::ptr::null_mut(), 0) };
    rc == sys::PMIX_SUCCESS as sys::pmix_status_t
}

/// A PMIx key (at most `PMIX_MAX_KEYLEN` bytes) as the C string PMIx wants.
fn key(k: &str) -> [c_char; sys::PMIX_MAX_KEYLEN as usize + 1] {
    let mut out = [0 as c_char; sys::PMIX_MAX_KEYLEN as usize + 1];
    for (o, b) in out.iter_mut().zip(k.bytes().take(sys::PMIX_MAX_KEYLEN as usize)) {
        *o = b as c_char;
    }
    out
}

/// A bindgen string constant (`b"pmix.job.size\0"`) as a key.
fn key_of(c: &[u8]) -> [c_char; sys::PMIX_MAX_KEYLEN as usize + 1] {
    key(std::str::from_utf8(c.strip_suffix(&[0]).unwrap_or(c)).unwrap_or(""))
}

/// A value returned by `PMIx_Get`, released on drop.
struct Value(*mut sys::pmix_value_t);

impl Drop for Value {
    fn drop(&mut self) {
        // SAFETY: PMIx_Get allocated the value with malloc; PMIX_VALUE_RELEASE is destruct +
        // free, done once here.
        unsafe {
            sys::PMIx_Value_destruct(self.0);
            libc::free(self.0.cast());
        }
    }
}

/// This process's connection to the launcher's PMIx server; finalized on drop.
pub struct PmixBoot {
    me: sys::pmix_proc_t,
    size: u32,
    local_rank: u32,
    local_size: u32,
    namespace: String,
    /// All-gathers done so far: each uses its own key.
    round: AtomicU32,
    /// PMIx calls of one all-gather must not interleave with another's.
    lock: Mutex<()>,
}

// SAFETY: the PMIx client library is thread-safe; `me` is plain data.
unsafe impl Send for PmixBoot {}
// SAFETY: as above.
unsafe impl Sync for PmixBoot {}

impl PmixBoot {
    /// Connects to the launcher's PMIx server and learns rank, size and local rank.
    pub fn init() -> FabricResult<Self> {
        let mut me = sys::pmix_proc_t::default();
        // SAFETY: me is a valid out-parameter; no info array.
        status("PMIx_Init", unsafe { sys::PMIx_Init(&mut me, std::ptr::null_mut(), 0) })?;
        let mut boot = PmixBoot {
            me,
            size: 0,
            local_rank: 0,
            local_size: 0,
            namespace: String::new(),
            round: AtomicU32::new(0),
            lock: Mutex::new(()),
        };
        // SAFETY: nspace is a NUL-terminated array filled by PMIx_Init.
        boot.namespace = unsafe { CStr::from_ptr(me.nspace.as_ptr()) }.to_string_lossy().into_owned();
        let job = boot.job_get(sys::PMIX_JOB_SIZE)?;
        boot.size = boot.number(&job, "job size")?;
        boot.local_rank = match boot.get(&boot.me, sys::PMIX_LOCAL_RANK) {
            Ok(v) => boot.number(&v, "local rank")?,
            Err(_) => 0,
        };
        boot.local_size = match boot.job_get(sys::PMIX_LOCAL_SIZE) {
            Ok(v) => boot.number(&v, "local size")?,
            Err(_) => boot.size,
        };
        if boot.size == 0 || boot.me.rank >= boot.size {
            return Err(FabricError::Malformed {
                what: format!("PMIx says rank {} of {} ranks", boot.me.rank, boot.size),
            });
        }
        Ok(boot)
    }

    /// The job's namespace (unique per job on the cluster).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// This rank's index among the job's ranks on its node.
    pub fn local_rank(&self) -> u32 {
        self.local_rank
    }

    /// Ranks of the job on this node.
    pub fn local_size(&self) -> u32 {
        self.local_size
    }

    fn wildcard(&self) -> sys::pmix_proc_t {
        let mut p = self.me;
        p.rank = sys::RANK_WILDCARD;
        p
    }

    fn job_get(&self, k: &[u8]) -> FabricResult<Value> {
        self.get(&self.wildcard(), k)
    }

    fn get(&self, proc_: &sys::pmix_proc_t, k: &[u8]) -> FabricResult<Value> {
        self.get_key(proc_, &key_of(k))
    }

    fn get_key(&self, proc_: &sys::pmix_proc_t, k: &[c_char]) -> FabricResult<Value> {
        let mut v: *mut sys::pmix_value_t = std::ptr::null_mut();
        // SAFETY: proc_ and the key are valid for the call; v receives a malloc'd value.
        let rc = unsafe { sys::PMIx_Get(proc_, k.as_ptr(), std::ptr::null(), 0, &mut v) };
        let name =
            String::from_utf8_lossy(&k.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect::<Vec<_>>())
                .into_owned();
        status(&format!("PMIx_Get({name}) of rank {}", proc_.rank), rc)?;
        if v.is_null() {
            return Err(FabricError::Malformed { what: format!("PMIx_Get({name}) gave no value") });
        }
        Ok(Value(v))
    }

    /// A numeric value of any unsigned PMIx integer type.
    fn number(&self, v: &Value, what: &str) -> FabricResult<u32> {
        // SAFETY: v.0 is a valid value from PMIx_Get; the union member read matches its type.
        unsafe {
            let v = &*v.0;
            Ok(match v.type_ as u32 {
                sys::PMIX_UINT32 => v.data.uint32,
                sys::PMIX_UINT16 => v.data.uint16 as u32,
                sys::PMIX_UINT8 => v.data.uint8 as u32,
                sys::PMIX_UINT64 => u32::try_from(v.data.uint64).map_err(|_| FabricError::Malformed {
                    what: format!("PMIx {what} {} does not fit", v.data.uint64),
                })?,
                sys::PMIX_PROC_RANK => v.data.rank,
                t => return Err(FabricError::Malformed { what: format!("PMIx {what} has value type {t}") }),
            })
        }
    }
}

impl Bootstrap for PmixBoot {
    fn rank(&self) -> Rank {
        self.me.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn allgather(&self, data: &[u8]) -> FabricResult<Vec<Vec<u8>>> {
        super::check_contribution(data)?;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let round = self.round.fetch_add(1, Ordering::AcqRel);
        let k = key(&format!("weft.ag.{round}"));
        let mut v =
            sys::pmix_value_t { type_: sys::PMIX_BYTE_OBJECT as sys::pmix_data_type_t, ..Default::default() };
        // SAFETY: the byte object points at `data` only for PMIx_Put, which copies the value.
        unsafe {
            v.data.bo = sys::pmix_byte_object_t { bytes: data.as_ptr() as *mut c_char, size: data.len() };
            status("PMIx_Put", sys::PMIx_Put(sys::PMIX_GLOBAL as sys::pmix_scope_t, k.as_ptr(), &mut v))?;
            status("PMIx_Commit", sys::PMIx_Commit())?;
        }
        let mut collect = sys::pmix_info_t { key: key_of(sys::PMIX_COLLECT_DATA), ..Default::default() };
        collect.value.type_ = sys::PMIX_BOOL as sys::pmix_data_type_t;
        collect.value.data.flag = true;
        let all = self.wildcard();
        // SAFETY: one proc (the wildcard of our namespace) and one info, valid for the call.
        status("PMIx_Fence", unsafe { sys::PMIx_Fence(&all, 1, &collect, 1) })?;
        let mut out = Vec::with_capacity(self.size as usize);
        for r in 0..self.size {
            let mut p = self.me;
            p.rank = r;
            let v = self.get_key(&p, &k)?;
            // SAFETY: v.0 is a valid value; the byte object (checked by type) holds `size`
            // bytes at `bytes` (or none).
            let bytes = unsafe {
                let v = &*v.0;
                if v.type_ as u32 != sys::PMIX_BYTE_OBJECT {
                    return Err(FabricError::Malformed {
                        what: format!("start-up data of rank {r} has PMIx type {}", v.type_),
                    });
                }
                let bo = v.data.bo;
                if bo.size > MAX_CONTRIBUTION {
                    return Err(FabricError::Malformed {
                        what: format!("start-up data of rank {r}: {} bytes", bo.size),
                    });
                }
                if bo.size == 0 || bo.bytes.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(bo.bytes as *const u8, bo.size).to_vec()
                }
            };
            out.push(bytes);
        }
        Ok(out)
    }
}

impl Drop for PmixBoot {
    fn drop(&mut self) {
        // SAFETY: PMIx_Init succeeded for this object; finalized once, with no info.
        unsafe { sys::PMIx_Finalize(std::ptr::null(), 0) };
    }
}

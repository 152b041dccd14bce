//! The libfabric objects of one rank — fabric, domain, address vector, completion queue and
//! one reliable-datagram endpoint — opened from `fi_getinfo`'s answer, and the calls on them.
//! Every `unsafe` block of the libfabric fabric is here or in `ofi/mod.rs`'s memory access.

use crate::{FabricError, FabricResult};
use std::ffi::{c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard};
use weft_ofi_sys as sys;

mod domain;
use domain::close_in_order;
pub use domain::{Domain, TxEndpoint, SEP_CONTEXTS};

/// libfabric API version weft asks for (1.17, Debian 12's).
const API: u32 = sys::FI_VERSION(1, 17);

/// Sleeps on a CQ's descriptor in a row that it did not end while completions came, after
/// which it is not slept on any more (see [`Objects::wait`]).
pub const QUIET_WAKES: u32 = 4;

/// `-FI_EAGAIN` as returned by data-path calls.
pub const EAGAIN: isize = -(sys::FI_EAGAIN as isize);
/// `-FI_EMFILE` and `-ENFILE`: no file descriptor for a new connection (the process's or the
/// system's limit).
pub const EMFILE: isize = -(libc::EMFILE as isize);
pub const ENFILE: isize = -(libc::ENFILE as isize);

/// Whether a post's `ret` means "not now": a full queue, or no descriptor for a connection
/// yet (silent outsiders' connections are being closed, see `guard`).
pub fn transient(ret: isize) -> bool {
    matches!(ret, EAGAIN | EMFILE | ENFILE)
}
const EAVAIL: isize = -(sys::FI_EAVAIL as isize);

/// libfabric's text for error `code` (positive or negative).
pub fn strerror(code: i64) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(sys::fi_strerror(code.unsigned_abs() as i32)) }.to_string_lossy().into_owned()
}

/// Turns a negative libfabric return into an error naming the call.
pub fn check(ret: i64, what: &str) -> FabricResult<()> {
    if ret < 0 {
        return Err(FabricError::Os { what: format!("{what}: {}", strerror(ret)), errno: (-ret) as i32 });
    }
    Ok(())
}

/// What was negotiated with the provider.
#[derive(Clone, Debug)]
pub struct Negotiated {
    pub provider: String,
    pub fabric_name: String,
    pub domain_name: String,
    pub caps: u64,
    pub mr_mode: u32,
    pub inject: usize,
    pub max_msg: usize,
    pub tx_size: usize,
    pub rx_size: usize,
    /// Sends are delivered after the writes issued before them (`FI_ORDER_SAW`).
    pub send_after_write: bool,
    /// Operations complete only once visible at the target (`FI_DELIVERY_COMPLETE`).
    pub delivery_complete: bool,
    /// The provider needs calls to make progress (`FI_PROGRESS_MANUAL`).
    pub manual_progress: bool,
    /// The completion queue has a file descriptor to sleep on (`FI_WAIT_FD`).
    pub cq_wait_fd: bool,
    /// Bytes of a memory key (`mr_key_size`): requested keys are random within them.
    pub key_size: usize,
    /// Transmit contexts a scalable endpoint may have (`max_ep_tx_ctx`).
    pub tx_contexts: usize,
}

impl Negotiated {
    /// Local buffers must be registered (`FI_MR_LOCAL`).
    pub fn mr_local(&self) -> bool {
        self.mr_mode & sys::FI_MR_LOCAL != 0
    }
    /// Remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`), not offsets.
    pub fn virt_addr(&self) -> bool {
        self.mr_mode & sys::FI_MR_VIRT_ADDR != 0
    }
    /// Memory registrations are bound to the endpoint (`FI_MR_ENDPOINT`).
    pub fn mr_endpoint(&self) -> bool {
        self.mr_mode & sys::FI_MR_ENDPOINT != 0
    }
    /// Native atomics (`FI_ATOMIC`).
    pub fn atomics(&self) -> bool {
        self.caps & sys::FI_ATOMIC as u64 != 0
    }
    /// The memory-registration modes, for `weft info`.
    pub fn mr_mode_names(&self) -> String {
        let names = [
            (sys::FI_MR_LOCAL, "local"),
            (sys::FI_MR_VIRT_ADDR, "virt_addr"),
            (sys::FI_MR_ALLOCATED, "allocated"),
            (sys::FI_MR_PROV_KEY, "prov_key"),
            (sys::FI_MR_ENDPOINT, "endpoint"),
        ];
        let v: Vec<_> = names.iter().filter(|(b, _)| self.mr_mode & b != 0).map(|(_, n)| *n).collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(",")
        }
    }
}

/// Where to look for a provider.
#[derive(Clone, Debug, Default)]
pub struct Wanted {
    /// Provider name (`WEFT_OFI_PROVIDER`), e.g. "tcp", "shm", "verbs".
    pub provider: Option<String>,
    /// Domain name (`WEFT_OFI_DOMAIN`), e.g. "lo" or a NIC.
    pub domain: Option<String>,
    /// Register every local buffer an operation names and pass its descriptor, as if the
    /// provider required `FI_MR_LOCAL` (`WEFT_OFI_MR_LOCAL=1`: runs that path on providers
    /// that do not need it, such as tcp).
    pub mr_local: bool,
}

/// The open objects. Closed in reverse order of opening on drop; memory registrations must
/// be closed before (see [`Mr`]).
pub struct Objects {
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    ep: *mut sys::fid_ep,
    /// True once the endpoint is closed ([`Objects::close_endpoint`]): held for reading by
    /// every use of it ([`Objects::ep`]), for writing to close it.
    ep_closed: RwLock<bool>,
    /// The CQ's wait file descriptor, or -1 (owned by the CQ).
    wait_fd: i32,
    /// Sleeps on `wait_fd` in a row that ended by their timeout with completions waiting.
    quiet_wakes: AtomicU32,
    pub neg: Negotiated,
    /// A copy of the chosen `fi_info`, to open endpoint contexts from later.
    info: InfoList,
}

// SAFETY: the domain is opened with FI_THREAD_SAFE, so libfabric serialises concurrent calls
// on these objects itself; the pointers are only handed to libfabric.
unsafe impl Send for Objects {}
// SAFETY: as above.
unsafe impl Sync for Objects {}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's attribute strings are NUL-terminated and live as long as the info.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A `fi_info` list returned by `fi_getinfo`, freed on drop.
struct InfoList(*mut sys::fi_info);
impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo / fi_allocinfo and is freed once.
        unsafe { sys::fi_freeinfo(self.0) };
    }
}

/// Asks libfabric for RDM endpoints with messages and RMA (and atomics when `atomics`).
fn getinfo(w: &Wanted, atomics: bool, delivery: bool) -> FabricResult<InfoList> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute structs allocated (or
    // null on failure, checked); the fields set below are plain values, and prov_name is a
    // malloc'd copy that fi_freeinfo releases.
    unsafe {
        let hints = InfoList(sys::fi_allocinfo());
        if hints.0.is_null() {
            return Err(FabricError::Os { what: "fi_allocinfo".into(), errno: 12 });
        }
        let h = &mut *hints.0;
        h.caps = (sys::FI_MSG | sys::FI_TAGGED | sys::FI_RMA) as u64;
        if atomics {
            h.caps |= sys::FI_ATOMIC as u64;
        }
        h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
        (*h.ep_attr).type_ = sys::FI_EP_RDM;
        let d = &mut *h.domain_attr;
        d.threading = sys::FI_THREAD_SAFE;
        d.mr_mode = (sys::FI_MR_LOCAL
            | sys::FI_MR_VIRT_ADDR
            | sys::FI_MR_ALLOCATED
            | sys::FI_MR_PROV_KEY
            | sys::FI_MR_ENDPOINT) as i32;
        d.av_type = sys::FI_AV_TABLE;
        if delivery {
            (*h.tx_attr).op_flags = sys::FI_DELIVERY_COMPLETE as u64;
        }
        if let Some(p) = &w.provider {
            let c = CString::new(p.as_str())
                .map_err(|_| FabricError::Malformed { what: format!("provider name {p:?}") })?;
            (*h.fabric_attr).prov_name = libc::strdup(c.as_ptr());
        }
        let mut out = null_mut();
        let ret = sys::fi_getinfo(API, std::ptr::null(), std::ptr::null(), 0, hints.0, &mut out);
        check(ret as i64, "fi_getinfo")?;
        Ok(InfoList(out))
    }
}

impl Objects {
    /// Finds a provider and opens its objects; the endpoint is enabled.
    pub fn open(w: &Wanted) -> FabricResult<Objects> {
        // Prefer native atomics and delivery-complete semantics; step down when refused.
        let mut last = None;
        for (atomics, delivery) in [(true, true), (false, true), (true, false), (false, false)] {
            match getinfo(w, atomics, delivery) {
                Ok(list) => match Self::open_from(&list, w, delivery) {
                    Ok(Some(mut o)) => {
                        if w.mr_local {
                            o.neg.mr_mode |= sys::FI_MR_LOCAL;
                        }
                        return Ok(o);
                    }
                    Ok(None) => {}
                    Err(e) => last = Some(e),
                },
                Err(e) => last = Some(e),
            }
        }
        let what = format!(
            "no libfabric RDM provider with messages and RMA{}{}",
            w.provider.as_ref().map(|p| format!(", provider {p}")).unwrap_or_default(),
            w.domain.as_ref().map(|d| format!(", domain {d}")).unwrap_or_default()
        );
        Err(match last {
            Some(FabricError::Os { what: w2, errno }) => {
                FabricError::Os { what: format!("{what} ({w2})"), errno }
            }
            _ => FabricError::Mismatch { what },
        })
    }

    fn open_from(list: &InfoList, w: &Wanted, delivery: bool) -> FabricResult<Option<Objects>> {
        let mut p = list.0;
        while !p.is_null() {
            // SAFETY: p walks the list fi_getinfo returned, which stays alive during this loop.
            let info = unsafe { &mut *p };
            // SAFETY: every info from fi_getinfo has its attribute structs set.
            let domain_name = cstr(unsafe { &*info.domain_attr }.name);
            if w.domain.as_ref().is_none_or(|d| *d == domain_name) {
                return Self::open_info(info, delivery).map(Some);
            }
            p = info.next;
        }
        Ok(None)
    }

    fn open_info(info: &mut sys::fi_info, delivery: bool) -> FabricResult<Objects> {
        // SAFETY: info is a valid fi_info of a live list; fi_dupinfo deep-copies it.
        let kept = InfoList(unsafe { sys::fi_dupinfo(info) });
        if kept.0.is_null() {
            return Err(FabricError::Os { what: "fi_dupinfo".into(), errno: 12 });
        }
        // SAFETY: attribute pointers of a fi_getinfo answer are valid.
        let (fa, da, ta, ra, ea) = unsafe {
            (&*info.fabric_attr, &*info.domain_attr, &*info.tx_attr, &*info.rx_attr, &*info.ep_attr)
        };
        let neg = Negotiated {
            provider: cstr(fa.prov_name),
            fabric_name: cstr(fa.name),
            domain_name: cstr(da.name),
            caps: info.caps,
            mr_mode: da.mr_mode as u32,
            inject: ta.inject_size,
            max_msg: ea.max_msg_size,
            tx_size: ta.size.max(1),
            rx_size: ra.size.max(1),
            send_after_write: ta.msg_order & sys::FI_ORDER_SAW as u64 != 0,
            delivery_complete: delivery,
            manual_progress: da.data_progress == sys::FI_PROGRESS_MANUAL,
            cq_wait_fd: false,
            key_size: da.mr_key_size,
            tx_contexts: da.max_ep_tx_ctx,
        };
        let mut o = Objects {
            fabric: null_mut(),
            domain: null_mut(),
            av: null_mut(),
            cq: null_mut(),
            ep: null_mut(),
            ep_closed: RwLock::new(false),
            wait_fd: -1,
            quiet_wakes: AtomicU32::new(0),
            neg,
            info: kept,
        };
        // SAFETY: each call gets valid attribute pointers from the same info and out-pointers
        // into `o`; a failure leaves the objects opened so far in `o`, which Drop closes.
        unsafe {
            check(sys::fi_fabric(info.fabric_attr, &mut o.fabric, null_mut()) as i64, "fi_fabric")?;
            check(sys::fi_domain(o.fabric, info, &mut o.domain, null_mut()) as i64, "fi_domain")?;
            let mut av_attr = sys::fi_av_attr { type_: sys::FI_AV_TABLE, ..Default::default() };
            check(sys::fi_av_open(o.domain, &mut av_attr, &mut o.av, null_mut()) as i64, "fi_av_open")?;
            let mut cq_attr = sys::fi_cq_attr {
                // Room for every transmit and receive that can be outstanding: never overrun.
                size: o.neg.tx_size + o.neg.rx_size + 64,
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: sys::FI_WAIT_FD,
                ..Default::default()
            };
            if sys::fi_cq_open(o.domain, &mut cq_attr, &mut o.cq, null_mut()) == 0 {
                let mut fd: i32 = -1;
                let ret =
                    sys::fi_control(&mut (*o.cq).fid, sys::FI_GETWAIT as i32, (&mut fd as *mut i32).cast());
                if ret == 0 && fd >= 0 {
                    o.wait_fd = fd;
                    o.neg.cq_wait_fd = true;
                }
            } else {
                cq_attr.wait_obj = sys::FI_WAIT_NONE;
                check(sys::fi_cq_open(o.domain, &mut cq_attr, &mut o.cq, null_mut()) as i64, "fi_cq_open")?;
            }
            check(sys::fi_endpoint(o.domain, info, &mut o.ep, null_mut()) as i64, "fi_endpoint")?;
            check(sys::fi_ep_bind(o.ep, &mut (*o.av).fid, 0) as i64, "fi_ep_bind(av)")?;
            let flags = (sys::FI_TRANSMIT | sys::FI_RECV) as u64;
            check(sys::fi_ep_bind(o.ep, &mut (*o.cq).fid, flags) as i64, "fi_ep_bind(cq)")?;
            check(sys::fi_enable(o.ep) as i64, "fi_enable")?;
        }
        Ok(o)
    }

    /// The main endpoint's data path.
    pub fn ep(&self) -> EpUse<'_> {
        let closed = self.ep_closed.read().unwrap_or_else(|e| e.into_inner());
        let ep = if *closed { null_mut() } else { self.ep };
        EpUse { ep: Ep { ep, cq: self.cq, delivery_complete: self.neg.delivery_complete }, _closed: closed }
    }

    /// This endpoint's address, for peers' address vectors.
    pub fn name(&self) -> FabricResult<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: buf holds len bytes; fi_getname writes at most len and updates it.
        let ret = unsafe { sys::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len) };
        check(ret as i64, "fi_getname")?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts peers' addresses (in rank order); returns their `fi_addr_t`s.
    pub fn insert(&self, addrs: &[Vec<u8>]) -> FabricResult<Vec<u64>> {
        av_insert(self.av, addrs)
    }

    /// Checks that the provider offers fetching atomics on `u64` for every weft operation.
    pub fn atomics_valid(&self) -> bool {
        let fetch =
            [sys::FI_ATOMIC_READ, sys::FI_ATOMIC_WRITE, sys::FI_SUM, sys::FI_BAND, sys::FI_BOR, sys::FI_BXOR];
        let mut count = 0usize;
        // SAFETY: the *valid calls only query the provider; count is a valid out-parameter.
        unsafe {
            fetch.iter().all(|&op| {
                sys::fi_fetch_atomicvalid(self.ep, sys::FI_UINT64, op, &mut count) == 0 && count >= 1
            }) && sys::fi_compare_atomicvalid(self.ep, sys::FI_UINT64, sys::FI_CSWAP, &mut count) == 0
                && count >= 1
        }
    }

    /// Registers `[addr, addr + len)` for local access, and for peers' reads and writes when
    /// `access` is [`Access::Remote`].
    pub fn register(&self, addr: usize, len: usize, access: Access) -> FabricResult<Mr> {
        register_in(
            self.domain,
            self.neg.mr_endpoint().then_some(self.ep),
            addr,
            len,
            access,
            self.neg.key_size,
        )
    }

    /// Opens an endpoint context: a new domain in this fabric, with an address vector holding
    /// `names` (every rank's main endpoint). `single_thread` asks for `FI_THREAD_DOMAIN`
    /// (the caller serialises every use of the domain and its endpoints: no provider locks).
    ///
    /// A domain for several threads gets a scalable endpoint with the provider's transmit
    /// contexts (`max_ep_tx_ctx`, at most [`SEP_CONTEXTS`]) where the provider offers more
    /// than one and binds registrations to no endpoint; its slots take the contexts in turn
    /// and get endpoints of their own once they are all taken, or where the scalable endpoint
    /// cannot be opened.
    pub fn open_domain(&self, names: &[Vec<u8>], single_thread: bool) -> FabricResult<Domain> {
        // SAFETY: self.info is a valid fi_info; fi_dupinfo deep-copies it.
        let info = InfoList(unsafe { sys::fi_dupinfo(self.info.0) });
        if info.0.is_null() {
            return Err(FabricError::Os { what: "fi_dupinfo".into(), errno: 12 });
        }
        let mut d = Domain {
            domain: null_mut(),
            av: null_mut(),
            addrs: Vec::new(),
            mr_endpoint: self.neg.mr_endpoint(),
            key_size: self.neg.key_size,
            delivery_complete: self.neg.delivery_complete,
            cq_size: self.neg.tx_size + 64,
            info,
            sep: null_mut(),
            sep_contexts: 0,
            sep_next: AtomicUsize::new(0),
        };
        // SAFETY: the info copy and its attribute structs are valid; out-pointers point into
        // `d`, whose Drop closes what was opened if a later step fails.
        unsafe {
            let i = &mut *d.info.0;
            (*i.domain_attr).threading =
                if single_thread { sys::FI_THREAD_DOMAIN } else { sys::FI_THREAD_SAFE };
            check(sys::fi_domain(self.fabric, i, &mut d.domain, null_mut()) as i64, "fi_domain")?;
            let mut av_attr = sys::fi_av_attr { type_: sys::FI_AV_TABLE, ..Default::default() };
            check(sys::fi_av_open(d.domain, &mut av_attr, &mut d.av, null_mut()) as i64, "fi_av_open")?;
        }
        d.addrs = av_insert(d.av, names)?;
        let contexts = self.neg.tx_contexts.min(SEP_CONTEXTS);
        if !single_thread && contexts > 1 && !d.mr_endpoint {
            d.open_scalable(contexts);
        }
        Ok(d)
    }

    /// Sleeps until the completion queue may have something to read, at most `ms`
    /// milliseconds, without holding anything: other threads keep reading the queue meanwhile
    /// (libfabric's `fi_trywait` protocol). `Some(true)` when something may be ready,
    /// `Some(false)` when `ms` passed, `None` at once where the CQ has no wait descriptor.
    ///
    /// A provider whose descriptor stays quiet while completions arrive (the sockets
    /// provider's, for this rank's own operations: each fetch-add waited the whole 2 ms) is
    /// found out after [`QUIET_WAKES`] such sleeps in a row: `None` from then on (the caller
    /// sleeps briefly instead).
    pub fn wait(&self, ms: i32) -> Option<bool> {
        if self.wait_fd < 0 || self.quiet_wakes.load(Ordering::Relaxed) >= QUIET_WAKES {
            return None;
        }
        let mut cq_fid = self.cq.cast::<sys::fid>();
        // SAFETY: fabric and cq are open; fi_trywait reads one fid pointer from the array.
        if unsafe { sys::fi_trywait(self.fabric, &mut cq_fid, 1) } != 0 {
            // Completions are waiting (or the provider needs a read first): do not sleep.
            return Some(true);
        }
        let mut p = libc::pollfd { fd: self.wait_fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: p is one valid pollfd; the descriptor belongs to the open CQ.
        let woken = unsafe { libc::poll(&mut p, 1, ms) } > 0;
        if woken {
            self.quiet_wakes.store(0, Ordering::Relaxed);
            return Some(true);
        }
        // SAFETY: as above.
        if unsafe { sys::fi_trywait(self.fabric, &mut cq_fid, 1) } != 0 {
            // Something came while the descriptor said nothing.
            self.quiet_wakes.fetch_add(1, Ordering::Relaxed);
            return Some(true);
        }
        self.quiet_wakes.store(0, Ordering::Relaxed);
        Some(false)
    }
}

/// Inserts `addrs` (in rank order) into `av`; returns their `fi_addr_t`s.
fn av_insert(av: *mut sys::fid_av, addrs: &[Vec<u8>]) -> FabricResult<Vec<u64>> {
    let mut out = Vec::with_capacity(addrs.len());
    for a in addrs {
        let mut fa: sys::fi_addr_t = 0;
        // SAFETY: av is open; a is one address in the provider's format (checked by the
        // provider); fa is a valid out-parameter for one address.
        let n = unsafe { sys::fi_av_insert(av, a.as_ptr().cast(), 1, &mut fa, 0, null_mut()) };
        if n != 1 {
            return Err(FabricError::Malformed {
                what: format!("peer address of {} bytes refused by fi_av_insert", a.len()),
            });
        }
        out.push(fa);
    }
    Ok(out)
}

/// Who may reach a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only this process's own operations (staging, receive buffers): no peer can read or
    /// write it, whatever key it presents.
    Local,
    /// Peers' reads and writes too (segments), under the registration's key.
    Remote,
    /// Peers' reads only (memory exposed for one transfer), under the registration's key.
    RemoteRead,
}

/// Registers `[addr, addr + len)` in `domain`, bound to `ep` where the provider wants
/// registrations bound (`FI_MR_ENDPOINT`). The requested key is random within the provider's
/// `key_size` bytes (a key in use is drawn again), so that nobody outside the job can guess
/// one: the key is all that guards a remotely accessible region from any process that
/// reaches the endpoint. Providers that choose keys themselves (`FI_MR_PROV_KEY`) ignore it.
fn register_in(
    domain: *mut sys::fid_domain,
    ep: Option<*mut sys::fid_ep>,
    addr: usize,
    len: usize,
    access: Access,
    key_size: usize,
) -> FabricResult<Mr> {
    let mut flags = (sys::FI_READ | sys::FI_WRITE | sys::FI_SEND | sys::FI_RECV) as u64;
    match access {
        Access::Local => {}
        Access::Remote => flags |= (sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE) as u64,
        Access::RemoteRead => flags |= sys::FI_REMOTE_READ as u64,
    }
    let mask = if key_size >= 8 { u64::MAX } else { (1u64 << (8 * key_size)) - 1 };
    let mut mr = null_mut();
    let mut tries = 0;
    // SAFETY: domain (and ep) are open; the range is memory this process mapped and keeps
    // mapped until the Mr is closed (the caller's invariant); out-pointer valid.
    unsafe {
        let ret = loop {
            let key = crate::os::random_u64()? & mask;
            let ret =
                sys::fi_mr_reg(domain, addr as *const c_void, len, flags, 0, key, 0, &mut mr, null_mut());
            tries += 1;
            if ret != -(sys::FI_ENOKEY as i32) || tries >= 8 {
                break ret;
            }
        };
        check(ret as i64, "fi_mr_reg")?;
        let m = Mr(mr);
        if let Some(ep) = ep {
            check(sys::fi_mr_bind(mr, &mut (*ep).fid, 0) as i64, "fi_mr_bind")?;
            check(sys::fi_mr_enable(mr) as i64, "fi_mr_enable")?;
        }
        Ok(m)
    }
}

/// [`Objects::ep`]: the endpoint, which stays open while this lives (once it is closed, its
/// operations return `-FI_ECANCELED`).
pub struct EpUse<'a> {
    ep: Ep,
    _closed: RwLockReadGuard<'a, bool>,
}

impl std::ops::Deref for EpUse<'_> {
    type Target = Ep;
    fn deref(&self) -> &Ep {
        &self.ep
    }
}

/// What an operation on a closed endpoint returns.
const CLOSED: isize = -(sys::FI_ECANCELED as isize);

/// The data path of one endpoint and the CQ its transmits complete in: a copyable view of
/// objects owned by [`Objects`] or an [`TxEndpoint`], valid while they are open.
#[derive(Clone, Copy)]
pub struct Ep {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    delivery_complete: bool,
}

impl Ep {
    /// Posts a receive for messages tagged `tag` into `buf` (registered, `desc`).
    pub fn post_recv(&self, buf: usize, len: usize, desc: usize, tag: u64, ctx: *mut c_void) -> isize {
        if self.ep.is_null() {
            return CLOSED;
        }
        // SAFETY: buf..buf+len is registered memory owned by the fabric, not touched until
        // the completion for ctx is read; ctx points to a live operation context.
        unsafe {
            sys::fi_trecv(
                self.ep,
                buf as *mut c_void,
                len,
                desc as *mut c_void,
                sys::FI_ADDR_UNSPEC,
                tag,
                0,
                ctx,
            )
        }
    }

    /// Sends `bytes` small enough to inject: no completion, buffer reusable at return.
    pub fn inject(&self, bytes: &[u8], dst: u64, tag: u64) -> isize {
        if self.ep.is_null() {
            return CLOSED;
        }
        // SAFETY: bytes is a live slice of at most inject_size bytes (the caller checks).
        unsafe { sys::fi_tinject(self.ep, bytes.as_ptr().cast(), bytes.len(), dst, tag) }
    }

    /// Sends `len` bytes at `buf` (registered, `desc`), completing `ctx`.
    pub fn send(&self, buf: usize, len: usize, desc: usize, dst: u64, tag: u64, ctx: *mut c_void) -> isize {
        if self.ep.is_null() {
            return CLOSED;
        }
        // SAFETY: the buffer stays untouched until ctx completes (a staging slot owned by ctx).
        unsafe { sys::fi_tsend(self.ep, buf as *const c_void, len, desc as *mut c_void, dst, tag, ctx) }
    }

    /// Writes `len` bytes at local `buf` to (`dst`, `addr`, `key`); `inject` copies the source
    /// before returning (only for up to inject_size bytes); `more` hints that another operation
    /// follows at once (`FI_MORE`).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        buf: usize,
        len: usize,
        desc: usize,
        dst: u64,
        addr: u64,
        key: u64,
        inject: bool,
        more: bool,
        ctx: *mut c_void,
    ) -> isize {
        if self.ep.is_null() {
            return CLOSED;
        }
        let iov = sys::iovec { iov_base: buf as *mut c_void, iov_len: len };
        let mut d = desc as *mut c_void;
        let rma = sys::fi_rma_iov { addr, len, key };
        let msg = sys::fi_msg_rma {
            msg_iov: &iov,
            desc: &mut d,
            iov_count: 1,
            addr: dst,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: ctx,
            data: 0,
        };
        let mut flags = sys::FI_COMPLETION as u64;
        if inject {
            flags |= sys::FI_INJECT as u64;
        }
        if more {
            flags |= sys::FI_MORE as u64;
        }
        if self.delivery_complete {
            flags |= sys::FI_DELIVERY_COMPLETE as u64;
        }
        // SAFETY: msg and what it points to live across the call; the source stays valid
        // until ctx completes unless inject (copied before return).
        unsafe { sys::fi_writemsg(self.ep, &msg, flags) }
    }

    /// Reads `len` bytes at (`src`, `addr`, `key`) into local `buf` (registered if the
    /// provider needs it), completing `ctx`.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        buf: usize,
        len: usize,
        desc: usize,
        src: u64,
        addr: u64,
        key: u64,
        ctx: *mut c_void,
    ) -> isize {
        if self.ep.is_null() {
            return CLOSED;
        }
        // SAFETY: buf..buf+len stays valid and untouched until ctx completes (the caller waits).
        unsafe { sys::fi_read(self.ep, buf as *mut c_void, len, desc as *mut c_void, src, addr, key, ctx) }
    }

    /// Fetching atomic `op` on the `u64` at (`dst`, `addr`, `key`): operand at `slot`, compare
    /// value at `slot + 8`, result to `slot + 16` (registered staging memory, `desc`).
    #[allow(clippy::too_many_arguments)]
    pub fn atomic(
        &self,
        slot: usize,
        desc: usize,
        dst: u64,
        addr: u64,
        key: u64,
        op: sys::fi_op,
        ctx: *mut c_void,
    ) -> isize {
        if self.ep.is_null() {
            return CLOSED;
        }
        let d = desc as *mut c_void;
        // SAFETY: the three words lie in a staging slot owned by ctx until it completes.
        unsafe {
            if op == sys::FI_CSWAP {
                sys::fi_compare_atomic(
                    self.ep,
                    slot as *const c_void,
                    1,
                    d,
                    (slot + 8) as *const c_void,
                    d,
                    (slot + 16) as *mut c_void,
                    d,
                    dst,
                    addr,
                    key,
                    sys::FI_UINT64,
                    op,
                    ctx,
                )
            } else {
                sys::fi_fetch_atomic(
                    self.ep,
                    slot as *const c_void,
                    1,
                    d,
                    (slot + 16) as *mut c_void,
                    d,
                    dst,
                    addr,
                    key,
                    sys::FI_UINT64,
                    op,
                    ctx,
                )
            }
        }
    }

    /// Reads up to `out.len()` completions; errors come back as `Err(entry)`.
    pub fn cq_read(&self, out: &mut [sys::fi_cq_data_entry]) -> Result<usize, sys::fi_cq_err_entry> {
        // SAFETY: out holds out.len() entries of the CQ's format (FI_CQ_FORMAT_DATA).
        let n = unsafe { sys::fi_cq_read(self.cq, out.as_mut_ptr().cast(), out.len()) };
        self.cq_result(n)
    }

    fn cq_result(&self, n: isize) -> Result<usize, sys::fi_cq_err_entry> {
        if n > 0 {
            return Ok(n as usize);
        }
        if n == EAVAIL {
            let mut e = sys::fi_cq_err_entry::default();
            // SAFETY: e is a valid error entry to fill.
            if unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) } > 0 {
                return Err(e);
            }
        }
        Ok(0)
    }
}

impl Objects {
    /// Closes the endpoint: nothing arrives into (or leaves from) registered memory after
    /// this returns, so the registrations and the memory behind them can go. Idempotent.
    /// Waits until no thread uses the endpoint (see [`Objects::ep`]); its later operations
    /// return `-FI_ECANCELED`.
    pub fn close_endpoint(&self) {
        let mut closed = self.ep_closed.write().unwrap_or_else(|e| e.into_inner());
        if !*closed && !self.ep.is_null() {
            // SAFETY: the endpoint was opened once by open_info and nobody uses it (the lock
            // is held for writing); it is closed once: `closed` says so to Drop and to `ep`.
            unsafe { sys::fi_close(&mut (*self.ep).fid) };
        }
        *closed = true;
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        let closed = *self.ep_closed.get_mut().unwrap_or_else(|e| e.into_inner());
        let ep = if closed { null_mut() } else { self.ep };
        let fids = [ep.cast(), self.cq.cast(), self.av.cast(), self.domain.cast(), self.fabric.cast()];
        // SAFETY: each object was opened once by open_info and is closed once here, children
        // before parents.
        unsafe { close_in_order(&fids) }
    }
}

/// A memory registration; closed on drop (which must happen before the domain closes).
pub struct Mr(*mut sys::fid_mr);

// SAFETY: a registration handle is only passed to libfabric, which is thread-safe here.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// The key peers use to reach it.
    pub fn key(&self) -> u64 {
        // SAFETY: self.0 is an open registration.
        unsafe { sys::fi_mr_key(self.0) }
    }
    /// The local descriptor for operations on it (as an address-sized integer).
    pub fn desc(&self) -> usize {
        // SAFETY: as above.
        unsafe { sys::fi_mr_desc(self.0) as usize }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: opened once by Objects::register, closed once here.
        unsafe { sys::fi_close(&mut (*self.0).fid) };
    }
}

/// An operation context as libfabric wants it: `fi_context2` scratch space first.
#[repr(C)]
pub struct Context<T> {
    _scratch: sys::fi_context2,
    pub op: T,
}

impl<T> Context<T> {
    /// Boxes `op` with its scratch space; the pointer goes to libfabric.
    pub fn into_raw(op: T) -> *mut c_void {
        Box::into_raw(Box::new(Context { _scratch: sys::fi_context2 { internal: [null_mut(); 8] }, op }))
            .cast()
    }
    /// Takes back a context made by [`Context::into_raw`] once its completion was read.
    ///
    /// # Safety
    /// `p` must come from `into_raw::<T>` and be taken back exactly once.
    pub unsafe fn from_raw(p: *mut c_void) -> Box<Context<T>> {
        // SAFETY: the caller's contract.
        unsafe { Box::from_raw(p.cast()) }
    }
}

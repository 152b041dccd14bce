//! Endpoint contexts: a domain with its address vector, and the transmit endpoints (or a
//! scalable endpoint's transmit contexts) the endpoint slots post through.

use super::*;

/// Most transmit contexts of one scalable endpoint weft asks for.
pub const SEP_CONTEXTS: usize = 64;

/// An endpoint context (see [`Objects::open_domain`]). Its endpoints ([`TxEndpoint`]) must
/// be closed before it.
pub struct Domain {
    pub(super) domain: *mut sys::fid_domain,
    pub(super) av: *mut sys::fid_av,
    /// Every rank's main endpoint in this domain's address vector.
    pub addrs: Vec<u64>,
    pub(super) mr_endpoint: bool,
    pub(super) key_size: usize,
    pub(super) delivery_complete: bool,
    pub(super) cq_size: usize,
    pub(super) info: InfoList,
    /// The scalable endpoint (null where none) and its transmit contexts, handed out in turn.
    pub(super) sep: *mut sys::fid_ep,
    pub(super) sep_contexts: usize,
    pub(super) sep_next: AtomicUsize,
}

// SAFETY: the domain and address vector are only used to open endpoints and registrations,
// which the fabric does from one thread at a time (endpoint creation is collective and
// sequential); the data path runs on the endpoints.
unsafe impl Send for Domain {}
// SAFETY: as above.
unsafe impl Sync for Domain {}

impl Domain {
    /// Opens the scalable endpoint with `contexts` transmit contexts; leaves none where the
    /// provider refuses (its slots then get endpoints of their own).
    pub(super) fn open_scalable(&mut self, contexts: usize) {
        let mut sep = null_mut();
        // SAFETY: domain, av and info are open/valid (info is this domain's own copy, changed
        // only here, before any endpoint is opened from it); sep is closed below on failure.
        let ok = unsafe {
            let i = &mut *self.info.0;
            let was = ((*i.ep_attr).tx_ctx_cnt, (*i.ep_attr).rx_ctx_cnt);
            ((*i.ep_attr).tx_ctx_cnt, (*i.ep_attr).rx_ctx_cnt) = (contexts, 0);
            let opened = sys::fi_scalable_ep(self.domain, i, &mut sep, null_mut()) == 0;
            ((*i.ep_attr).tx_ctx_cnt, (*i.ep_attr).rx_ctx_cnt) = was;
            opened && sys::fi_scalable_ep_bind(sep, &mut (*self.av).fid, 0) == 0 && sys::fi_enable(sep) == 0
        };
        if ok {
            (self.sep, self.sep_contexts) = (sep, contexts);
        } else {
            // SAFETY: sep is null or opened above and used by nothing.
            unsafe { close_in_order(&[sep.cast()]) }
        }
    }

    /// Opens a transmitting endpoint in this context with its own completion queue: the
    /// scalable endpoint's next transmit context while there is one, else an endpoint.
    pub fn open_endpoint(&self) -> FabricResult<TxEndpoint> {
        let mut t = TxEndpoint {
            ep: null_mut(),
            cq: null_mut(),
            delivery_complete: self.delivery_complete,
            scalable: false,
        };
        let next = if self.sep.is_null() { None } else { Some(self.sep_next.fetch_add(1, Ordering::AcqRel)) };
        let context = next.filter(|&k| k < self.sep_contexts);
        t.scalable = context.is_some();
        // SAFETY: domain, av, info (and sep where used) are open/valid; out-pointers point
        // into `t`, whose Drop closes what was opened if a later step fails.
        unsafe {
            let mut cq_attr = sys::fi_cq_attr {
                // Every transmit that can be outstanding: never overrun.
                size: self.cq_size,
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: sys::FI_WAIT_NONE,
                ..Default::default()
            };
            check(sys::fi_cq_open(self.domain, &mut cq_attr, &mut t.cq, null_mut()) as i64, "fi_cq_open")?;
            if let Some(k) = context {
                let at = k as i32;
                check(
                    sys::fi_tx_context(self.sep, at, null_mut(), &mut t.ep, null_mut()) as i64,
                    "fi_tx_context",
                )?;
                check(
                    sys::fi_ep_bind(t.ep, &mut (*t.cq).fid, sys::FI_TRANSMIT as u64) as i64,
                    "fi_ep_bind(cq)",
                )?;
            } else {
                check(
                    sys::fi_endpoint(self.domain, self.info.0, &mut t.ep, null_mut()) as i64,
                    "fi_endpoint",
                )?;
                check(sys::fi_ep_bind(t.ep, &mut (*self.av).fid, 0) as i64, "fi_ep_bind(av)")?;
                let flags = (sys::FI_TRANSMIT | sys::FI_RECV) as u64;
                check(sys::fi_ep_bind(t.ep, &mut (*t.cq).fid, flags) as i64, "fi_ep_bind(cq)")?;
            }
            check(sys::fi_enable(t.ep) as i64, "fi_enable")?;
        }
        Ok(t)
    }

    /// Registers `[addr, addr + len)` in this context for `ep`.
    pub fn register(&self, ep: &TxEndpoint, addr: usize, len: usize, access: Access) -> FabricResult<Mr> {
        register_in(self.domain, self.mr_endpoint.then_some(ep.ep), addr, len, access, self.key_size)
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: opened once by open_domain, closed once here, the scalable endpoint (whose
        // transmit contexts closed before, with their slots) and the AV before their domain.
        unsafe { close_in_order(&[self.sep.cast(), self.av.cast(), self.domain.cast()]) }
    }
}

/// An endpoint of a [`Domain`] with its own completion queue (one transmit slot).
pub struct TxEndpoint {
    pub(super) ep: *mut sys::fid_ep,
    pub(super) cq: *mut sys::fid_cq,
    pub(super) delivery_complete: bool,
    /// Whether it is a transmit context of its domain's scalable endpoint.
    pub scalable: bool,
}

// SAFETY: a transmit endpoint is used by its owner only (`&mut` through the runtime's slot),
// so moving it between threads is fine; its domain's threading level allows that.
unsafe impl Send for TxEndpoint {}

impl TxEndpoint {
    /// Its data path.
    pub fn ep(&self) -> Ep {
        Ep { ep: self.ep, cq: self.cq, delivery_complete: self.delivery_complete }
    }
}

impl Drop for TxEndpoint {
    fn drop(&mut self) {
        // SAFETY: opened once by open_endpoint, closed once here, the endpoint before its CQ.
        unsafe { close_in_order(&[self.ep.cast(), self.cq.cast()]) }
    }
}

/// Closes libfabric objects in order (children before parents); null ones were never opened.
///
/// # Safety
/// Each pointer is null or an open object (whose first field is its `fid`) that nothing uses
/// any more, and none is closed again.
pub(super) unsafe fn close_in_order(fids: &[*mut sys::fid]) {
    for &f in fids {
        if !f.is_null() {
            // SAFETY: the caller's contract.
            unsafe { sys::fi_close(f) };
        }
    }
}

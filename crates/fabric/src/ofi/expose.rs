//! Memory the caller owns, registered for one transfer (zero-copy RPC chunks; under
//! `FI_MR_LOCAL`, the buffers of puts and gets), and the fabric's counters.
//!
//! Local buffers under `FI_MR_LOCAL` (verbs, efa): memory weft registered already (segments,
//! the RPC pool, so `RmaVec`s) is used with its registration; any other buffer from the
//! zero-copy threshold up is registered for the one operation, which waits for its completion
//! before the registration closes. Nothing is cached by address, so memory freed and
//! allocated again is never reached through a stale registration (UCX's rcache and GASNet's
//! Firehose need memory hooks to allow that); smaller buffers go through staging.
//!
//! A registration made by [`Fabric::expose`](crate::Fabric::expose) allows remote reads only,
//! under a fresh random key that only the peer the chunk goes to learns; the
//! [`Registration`] the caller holds closes it when dropped. The registrations live in a table
//! the fabric owns (the caller's handle only names its entry), so that every one is closed
//! before the domain, even where a handle outlives the fabric.

use super::ffi::{Access, Mr};
use super::{Fabric, OfiFabric};
use crate::{Exposure, FabricError, FabricResult, FabricStats, Rank, Registration, RemoteRegion};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Registrations of caller memory, by number.
#[derive(Default)]
pub(super) struct Exposed {
    table: Arc<Mutex<HashMap<u64, Mr>>>,
    next: AtomicU64,
}

impl Exposed {
    /// Closes every registration still open (at finalize: nothing reads them any more).
    pub fn clear(&self) {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// What the fabric counts (shared with the endpoint slots and staged gets).
#[derive(Default)]
pub(super) struct Counters {
    pub staged: AtomicU64,
    pub registrations: AtomicU64,
    pub released: AtomicU64,
    pub cached: AtomicU64,
}

impl Counters {
    pub fn staged(&self, n: usize) {
        self.staged.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> FabricStats {
        FabricStats {
            staged_bytes: self.staged.load(Ordering::Relaxed),
            registrations: self.registrations.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
        }
    }
}

/// Closes its registration when the caller drops the [`Registration`].
struct Guard {
    table: Weak<Mutex<HashMap<u64, Mr>>>,
    id: u64,
    counters: Arc<Counters>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(t) = self.table.upgrade() {
            let mr = t.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
            drop(mr);
        }
        self.counters.released.fetch_add(1, Ordering::Relaxed);
    }
}

/// A registration of a local buffer for one operation (or none: a region weft holds), closed
/// when dropped.
pub(super) struct OpReg {
    mr: Option<Mr>,
    counters: Arc<Counters>,
}

impl OpReg {
    /// Holds `mr`, made for one operation (counted as a registration).
    pub fn new(mr: Mr, counters: &Arc<Counters>) -> Self {
        counters.registrations.fetch_add(1, Ordering::Relaxed);
        OpReg { mr: Some(mr), counters: counters.clone() }
    }
}

impl Drop for OpReg {
    fn drop(&mut self) {
        if self.mr.take().is_some() {
            self.counters.released.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl OfiFabric {
    /// The descriptor of `len` bytes at `addr` of this process for an operation under
    /// `FI_MR_LOCAL`: a region this fabric registered that holds them, else a registration
    /// made for the operation (keep the [`OpReg`] until the operation completed).
    pub(super) fn local_desc(&self, addr: usize, len: usize) -> FabricResult<(usize, OpReg)> {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| FabricError::Malformed { what: format!("{len} bytes at {addr:#x}") })?;
        let held = {
            let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
            regions.iter().flatten().find_map(|r| {
                let base = r.map.as_ptr() as usize;
                (addr >= base && end <= base + r.map.len()).then(|| r.mr.desc())
            })
        };
        if let Some(desc) = held {
            self.counters.cached.fetch_add(1, Ordering::Relaxed);
            return Ok((desc, OpReg { mr: None, counters: self.counters.clone() }));
        }
        let mr = self.obj.register(addr, len, Access::Local)?;
        Ok((mr.desc(), OpReg::new(mr, &self.counters)))
    }

    /// Whether an operation on a local buffer of `len` bytes registers it (or uses a region
    /// that holds it) instead of staging it.
    pub(super) fn registers_local(&self, len: usize) -> bool {
        self.obj.neg.mr_local() && len >= self.zcopy_bytes && len > self.obj.neg.inject
    }

    /// [`Fabric::expose`]: from the zero-copy threshold up, a read-only registration.
    pub(super) fn expose_memory(&self, rank: Rank, addr: usize, len: usize) -> FabricResult<Exposure> {
        if rank >= self.size {
            return Err(FabricError::Malformed { what: format!("exposing memory to rank {rank}") });
        }
        if len < self.zcopy_bytes || len == 0 {
            return Ok(Exposure::Copy);
        }
        let mr = self.obj.register(addr, len, Access::RemoteRead)?;
        let key = mr.key();
        let id = self.exposed.next.fetch_add(1, Ordering::Relaxed);
        self.exposed.table.lock().unwrap_or_else(|e| e.into_inner()).insert(id, mr);
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        let guard = Guard { table: Arc::downgrade(&self.exposed.table), id, counters: self.counters.clone() };
        let base = if self.obj.neg.virt_addr() { addr as u64 } else { 0 };
        Ok(Exposure::Registered(Registration { addr: base, key, _guard: Box::new(guard) }))
    }

    /// [`Fabric::read_exposed`]: a get from a region that names the peer's registration.
    pub(super) fn read_exposed_memory(
        &self,
        rank: Rank,
        addr: u64,
        key: u64,
        dst: &mut [u8],
    ) -> FabricResult<()> {
        if rank >= self.size {
            return Err(FabricError::Malformed { what: format!("reading memory of rank {rank}") });
        }
        if addr.checked_add(dst.len() as u64).is_none() {
            return Err(FabricError::Malformed { what: format!("{} bytes at address {addr:#x}", dst.len()) });
        }
        // The provider checks the key and the range against the peer's registration.
        let region = RemoteRegion { rank, id: u32::MAX, len: dst.len(), addr, key };
        self.get(&region, 0, dst)
    }
}

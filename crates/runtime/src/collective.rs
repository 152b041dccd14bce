//! Collectives the runtime needs for itself: a dissemination barrier and an all-gather of
//! small byte strings (used to exchange registration descriptors), both over AMs so that
//! they work on any fabric.

use crate::am::internal;
use crate::progress::Deps;
use crate::{AmMsg, Comm, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use weft_fabric::{AmClass, AmPayload};

const MAX_ROUNDS: usize = 32;

pub(crate) struct CollectiveState {
    /// Serialises this rank's collective calls (they must happen in the same order everywhere).
    order: Mutex<Counters>,
    /// Barrier messages received per dissemination round.
    arrived: [AtomicU64; MAX_ROUNDS],
    /// All-gather contributions received, by sequence number.
    gathered: Mutex<HashMap<u64, Vec<Option<Vec<u8>>>>>,
    size: u32,
}

#[derive(Default)]
struct Counters {
    barriers: u64,
    exchanges: u64,
}

impl CollectiveState {
    pub fn new(size: u32) -> Self {
        CollectiveState {
            order: Mutex::new(Counters::default()),
            arrived: std::array::from_fn(|_| AtomicU64::new(0)),
            gathered: Mutex::new(HashMap::new()),
            size,
        }
    }
}

impl Comm {
    /// Blocks until every rank has called `barrier` (dissemination algorithm: ⌈log2 N⌉ rounds
    /// of one short AM each). Fails if a rank dies or leaves meanwhile.
    pub fn barrier(&self) -> Result<()> {
        if crate::am::in_handler().is_some() {
            return Err(Error::Misuse("barrier inside an AM handler"));
        }
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.barriers += 1;
        let epoch = order.barriers;
        let (me, n) = (self.rank(), self.size());
        let mut dist = 1u32;
        let mut round = 0;
        while dist < n {
            let to = (me + dist) % n;
            self.send_am(to, internal::BARRIER, AmClass::Request, &[round as u64], AmPayload::Short)?;
            let arrived = &self.coll.arrived[round];
            self.wait(Deps::All, || arrived.load(Ordering::Acquire) >= epoch)?;
            round += 1;
            dist <<= 1;
        }
        Ok(())
    }

    pub(crate) fn on_barrier(&self, m: &AmMsg<'_>) {
        match m.args().first().map(|&r| r as usize) {
            Some(r) if r < MAX_ROUNDS => {
                self.coll.arrived[r].fetch_add(1, Ordering::AcqRel);
            }
            _ => self.record_error(Error::Remote(format!("malformed barrier message from rank {}", m.src()))),
        }
    }

    /// Collective all-gather of one small byte string per rank (at most the largest medium AM
    /// payload): entry `r` of the result is rank `r`'s string.
    pub fn exchange(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut order = self.coll.order.lock().unwrap_or_else(|p| p.into_inner());
        order.exchanges += 1;
        let seq = order.exchanges;
        for r in (0..self.size()).filter(|&r| r != self.rank()) {
            self.send_am(r, internal::EXCHANGE, AmClass::Request, &[seq], AmPayload::Medium(mine))?;
        }
        let others = self.size() as usize - 1;
        self.wait(Deps::All, || {
            let g = self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner());
            g.get(&seq).map_or(0, |v| v.iter().flatten().count()) == others
        })?;
        let mut all =
            self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner()).remove(&seq).unwrap_or_default();
        all.resize(self.size() as usize, None);
        all[self.rank() as usize] = Some(mine.to_vec());
        Ok(all.into_iter().map(Option::unwrap_or_default).collect())
    }

    pub(crate) fn on_exchange(&self, m: &AmMsg<'_>) {
        let Some(&seq) = m.args().first() else {
            return self
                .record_error(Error::Remote(format!("malformed exchange message from rank {}", m.src())));
        };
        let mut g = self.coll.gathered.lock().unwrap_or_else(|p| p.into_inner());
        let slots = g.entry(seq).or_insert_with(|| vec![None; self.coll.size as usize]);
        slots[m.src() as usize] = Some(m.payload().to_vec());
    }
}

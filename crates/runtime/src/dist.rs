//! Per-rank state under one id on every rank ([`Dist`]), and the world a remote function
//! runs in ([`current`]).
//!
//! A [`Dist`] is made collectively ([`Comm::dist`]): every rank registers its own instance,
//! and the objects are numbered in the order they are made, so one id names "this rank's
//! instance" everywhere. It travels as that id: in an AM's arguments ([`Dist::id`], then
//! [`Comm::dist_of`] at the target) or as a remote function's argument (its serde form),
//! which the target decodes into its own instance. An id from another rank is input like
//! any other: one that names no object, or an object of another type, is an error.

use crate::{Comm, Error, Result};
use std::any::Any;
use std::cell::Cell;
use std::sync::{Arc, Mutex, RwLock, Weak};

/// The objects of one world, by id.
#[derive(Default)]
pub(crate) struct DistTable {
    objects: RwLock<Vec<Arc<dyn Any + Send + Sync>>>,
    /// Held while an object is made: one at a time per rank.
    making: Mutex<()>,
}

/// Longest type name the creating exchange carries (to name both types on a mismatch).
const NAME_BYTES: usize = 200;

/// One rank's instance of a distributed object: dereferences to it. Clone it freely (it is
/// reference counted); send it to other ranks as its id or as an RPC argument. The world
/// keeps every object it made until it is dropped (ids are never reused): make objects once,
/// not per iteration.
///
/// ```no_run
/// # use weft_runtime as weft;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// let mut b = weft::World::builder();
/// // The handler finds the counter through the id the message carries.
/// let bump = b.handler("bump", |am| {
///     if let Ok(c) = am.comm().dist_of::<AtomicU64>(am.args()[0]) {
///         c.fetch_add(am.args()[1], Ordering::Relaxed);
///     }
/// });
/// let world = b.init()?;
/// let hits = world.dist(AtomicU64::new(0))?;
/// world.am_request_short((world.rank() + 1) % world.size(), bump, &[hits.id(), 5])?;
/// world.barrier()?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub struct Dist<T> {
    id: u64,
    local: Arc<T>,
}

impl<T> Clone for Dist<T> {
    fn clone(&self) -> Self {
        Dist { id: self.id, local: self.local.clone() }
    }
}

impl<T> std::ops::Deref for Dist<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.local
    }
}

impl<T> std::fmt::Debug for Dist<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dist(#{} of {})", self.id, std::any::type_name::<T>())
    }
}

impl<T> Dist<T> {
    /// The object's id, the same on every rank.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Comm {
    /// Collective over the world: registers `value` as this rank's instance of a new
    /// distributed object and returns it. Every rank must make its objects in the same order
    /// and of the same type; a rank that makes another one fails with [`Error::Mismatch`].
    pub fn dist<T: Send + Sync + 'static>(&self, value: T) -> Result<Dist<T>> {
        let local = Arc::new(value);
        // One at a time: two threads of one rank making objects at once would number them in
        // either order. The table itself is not locked across the exchange: handlers that
        // run meanwhile look objects up.
        let _making = self.dists.making.lock().unwrap_or_else(|p| p.into_inner());
        let id = {
            // In the table before the exchange: a peer that finishes first may send messages
            // naming the object before this rank's exchange returns.
            let mut objects = self.dists.objects.write().unwrap_or_else(|p| p.into_inner());
            objects.push(local.clone());
            objects.len() as u64 - 1
        };
        let name = std::any::type_name::<T>();
        let mut mine = id.to_le_bytes().to_vec();
        // The whole name's hash, then its first bytes (to name both types on a mismatch).
        mine.extend(fnv(name.as_bytes()).to_le_bytes());
        mine.extend(name.bytes().take(NAME_BYTES));
        let differs = match self.exchange(&mine) {
            Ok(all) => all.into_iter().enumerate().find(|(_, d)| d[..] != mine[..]).map(|(r, theirs)| {
                let (their_id, rest) = theirs.split_at(8.min(theirs.len()));
                let their_name = rest.get(8..).unwrap_or_default();
                Error::Mismatch(format!(
                    "dist: this rank makes object #{id} of type {name}, rank {r} makes #{} of type {}",
                    u64::from_le_bytes(their_id.try_into().unwrap_or([0xff; 8])),
                    String::from_utf8_lossy(their_name)
                ))
            }),
            Err(e) => Some(e),
        };
        if let Some(e) = differs {
            // Still the last one: objects are made one at a time.
            self.dists.objects.write().unwrap_or_else(|p| p.into_inner()).pop();
            return Err(e);
        }
        Ok(Dist { id, local })
    }

    /// This rank's instance of distributed object `id` (an id that an AM or another rank
    /// sent), which must hold a `T`: [`Error::NoSuchDist`] otherwise.
    pub fn dist_of<T: Send + Sync + 'static>(&self, id: u64) -> Result<Dist<T>> {
        let objects = self.dists.objects.read().unwrap_or_else(|p| p.into_inner());
        let any = usize::try_from(id).ok().and_then(|i| objects.get(i)).cloned();
        let wanted = std::any::type_name::<T>();
        let local = any.and_then(|a| a.downcast::<T>().ok()).ok_or(Error::NoSuchDist { id, wanted })?;
        Ok(Dist { id, local })
    }
}

/// FNV-1a of `bytes`.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

thread_local! {
    /// The id of the world whose remote function this thread runs (0: none).
    static SERVING: Cell<u64> = const { Cell::new(0) };
}

/// Every live world, by id, for [`current`].
static WORLDS: Mutex<Vec<(u64, Weak<Comm>)>> = Mutex::new(Vec::new());

pub(crate) fn register_world(id: u64, comm: Weak<Comm>) {
    let mut w = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
    w.retain(|(_, c)| c.strong_count() > 0);
    w.push((id, comm));
}

/// Runs `f` as code of `comm`'s (a remote function, its arguments' decoding): [`current`]
/// returns that world meanwhile.
pub fn serving<R>(comm: &Comm, f: impl FnOnce() -> R) -> R {
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERVING.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERVING.with(|s| s.replace(comm.id)));
    f()
}

/// The world whose remote function this thread is running (in an RPC layer's function or
/// while its arguments decode); `None` elsewhere. AM handlers have theirs in
/// [`crate::AmMsg::comm`].
///
/// ```no_run
/// # use weft_runtime as weft;
/// // Inside a remote function: RMA, AMs and collectives' state through the world.
/// if let Some(world) = weft::current() {
///     println!("running on rank {} of {}", world.rank(), world.size());
/// }
/// ```
pub fn current() -> Option<Arc<Comm>> {
    let id = SERVING.with(|s| s.get());
    if id == 0 {
        return None;
    }
    let w = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
    w.iter().find(|(i, _)| *i == id).and_then(|(_, c)| c.upgrade())
}

impl<T> serde::Serialize for Dist<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u64(self.id)
    }
}

/// A `Dist` decodes into the instance of the world it is decoded in ([`current`]): the RPC
/// layer's arguments and results.
impl<'de, T: Send + Sync + 'static> serde::Deserialize<'de> for Dist<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let id = <u64 as serde::Deserialize>::deserialize(d)?;
        let world =
            current().ok_or_else(|| D::Error::custom("a Dist decodes only inside a world's remote call"))?;
        world.dist_of(id).map_err(D::Error::custom)
    }
}

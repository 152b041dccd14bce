//! # weft-array — distributed arrays with aggregated batch operations
//!
//! An [`AtomicArray`] spreads `len` integers over the ranks ([`Distribution`]: block, cyclic,
//! block-cyclic). Any rank reads and updates any element, one at a time (remote atomics) or in
//! batches: [`AtomicArray::batch_add`], [`AtomicArray::batch_fetch_add`],
//! [`AtomicArray::batch_load`] (an index gather) and [`AtomicArray::batch_store`] (a scatter)
//! take any iterator of global indices, check them all before anything is sent, and pack the
//! operations for each rank into few messages (`weft-agg`). They return owned handles
//! ([`BatchHandle`]) to wait on or `.await`.
//!
//! ```no_run
//! # use weft_runtime as weft;
//! use weft_array::AtomicArray;
//! let world = weft::World::init()?;
//! // A histogram: 1 M random updates per rank into 100 k counters spread over the ranks.
//! let counts = AtomicArray::<u64>::new(&world, 100_000)?;
//! let mut x = world.rank() as u64 + 1;
//! let picks = (0..1_000_000).map(move |_| { x = x.wrapping_mul(6364136223846793005).wrapping_add(1); (x >> 33) as usize % 100_000 });
//! counts.batch_add(picks, 1)?.wait()?;
//! world.barrier()?;
//! assert_eq!(counts.sum()?, 1_000_000 * world.size() as u64);
//! # Ok::<(), weft::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod atomic;
mod batch;
mod layout;

pub use atomic::{AtomicArray, Element, Mapped};
pub use batch::BatchHandle;
pub use layout::Distribution;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use weft_runtime::layer::{Layer, LayerBuilder};
use weft_runtime::{Builder, Comm, Segment};

/// What a rank holds of one array, found by the id that travels in its operations.
pub(crate) struct Part {
    pub seg: Segment<u64>,
    pub layout: layout::Layout,
}

/// The arrays of a world (the layer's state).
#[derive(Default)]
pub(crate) struct Arrays {
    parts: RwLock<HashMap<u32, Arc<Part>>>,
    pub requests: batch::Requests,
    /// How batches reach owners' memory this process maps (`WEFT_ARRAY_MAPPED`, a
    /// `mapped_code`).
    pub mapped: std::sync::atomic::AtomicU8,
}

impl Arrays {
    pub fn of(comm: &Comm) -> weft_runtime::Result<&Arrays> {
        comm.extension_ref::<Arrays>().ok_or(weft_runtime::Error::Misuse(
            "this world has no array layer (the program does not link weft-array)",
        ))
    }
    pub fn part(&self, id: u32) -> Option<Arc<Part>> {
        self.parts.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }
    fn add(&self, id: u32, part: Arc<Part>) {
        self.parts.write().unwrap_or_else(|p| p.into_inner()).insert(id, part);
    }
    fn remove(&self, id: u32) {
        self.parts.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }
}

#[linkme::distributed_slice(weft_runtime::LAYERS)]
static ARRAY_LAYER: fn(&mut Builder) = install;

fn install(b: &mut Builder) {
    b.extension(Arc::new(Arrays::default()));
    b.on_start(Box::new(|c: &Comm| {
        let expect = "loads, direct or messages";
        let how = match weft_runtime::config::parse::<String>("WEFT_ARRAY_MAPPED", expect)?
            .as_deref()
            .map(str::trim)
        {
            None | Some("loads") => Mapped::Loads,
            Some("direct") => Mapped::Direct,
            Some("messages") => Mapped::Messages,
            Some(v) => {
                return Err(weft_runtime::Error::Config(format!(
                    "WEFT_ARRAY_MAPPED={v:?}: expected {expect}"
                )))
            }
        };
        Arrays::of(c)?.mapped.store(atomic::mapped_code(how), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }));
    b.liveness_hook(Arc::new(|c: &Comm, gone: &dyn Fn(u32) -> Option<weft_runtime::Error>| {
        Arrays::of(c).map_or(0, |a| a.requests.fail_gone(gone))
    }));
}

//! Per-rank state for handlers and remote functions: a `Dist` counter made collectively,
//! bumped by AMs that carry its id and by remote calls that take it as an argument (each
//! target updates its own instance), with every message acknowledged so that each rank knows
//! its bumps were applied.
//!
//! Run: `cargo run --release -- run -n 4 -- target/release/examples/dist_counter`
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use weft::{remote, Dist, RpcExt};

remote! {
    /// Adds `by` to the target's counter; returns its value before.
    fn bump(counter: Dist<AtomicU64>, by: u64) -> u64 { counter.fetch_add(by, Ordering::Relaxed) }
}

fn main() -> Result<(), weft::Error> {
    let mut b = weft::World::builder();
    let acks = Arc::new(AtomicU64::new(0));
    let a = acks.clone();
    let ack = b.handler("example.ack", move |_| {
        a.fetch_add(1, Ordering::Relaxed);
    });
    // The handler reaches the state through the world and the id in the message.
    let add = b.handler("example.add", move |am| {
        if let Ok(c) = am.comm().dist_of::<AtomicU64>(am.args()[0]) {
            c.fetch_add(am.args()[1], Ordering::Relaxed);
        }
        am.reply_short(ack, &[]).expect("a request handler replies once");
    });
    let world = b.init()?;
    let counter = world.dist(AtomicU64::new(0))?;
    let (me, n) = (world.rank(), world.size());
    for r in (0..n).filter(|&r| r != me) {
        world.am_request_short(r, add, &[counter.id(), 1])?;
        world.call(r, bump, (counter.clone(), 10)).wait()?;
    }
    world.wait_until(|| acks.load(Ordering::Relaxed) == u64::from(n - 1))?;
    world.barrier()?;
    let total = counter.load(Ordering::Relaxed);
    assert_eq!(total, 11 * u64::from(n - 1), "every other rank added 1 by AM and 10 by RPC");
    println!("rank {me}: counter {total}");
    world.barrier()
}

//! Remote functions with zero-copy arguments: every rank asks its neighbour to scale a vector
//! that lives in its registered pool; the vector travels by RMA both ways, with no copy into
//! or out of a message.

use weft::{remote, RmaVec, RpcExt};

remote! {
    /// Runs on the target; `v` arrives in the target's pool, and goes back the same way.
    pub fn scale(v: RmaVec<f64>, by: f64) -> RmaVec<f64> {
        let mut v = v;
        v.iter_mut().for_each(|x| *x *= by);
        v
    }
}

fn main() -> Result<(), weft::Error> {
    let world = weft::World::init()?;
    let next = (world.rank() + 1) % world.size();
    let v = RmaVec::from_slice(&world, &vec![1.0; 1 << 20])?; // 8 MiB in the pool
    let back = weft::block_on(world.call(next, scale, (v, 2.0)))?;
    assert!(back.iter().all(|&x| x == 2.0));
    println!("rank {}: rank {next} scaled {} values", world.rank(), back.len());
    world.barrier()
}

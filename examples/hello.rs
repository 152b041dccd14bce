//! Every rank says hello. Run: `cargo run --release -- run -n 4 -- target/release/examples/hello`
fn main() -> Result<(), weft::Error> {
    let world = weft::World::init()?;
    println!("hello from rank {} of {}", world.rank(), world.size());
    world.barrier()
}

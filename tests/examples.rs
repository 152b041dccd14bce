//! Every example runs through the launcher on 2 and 4 ranks and succeeds. `cargo test` builds
//! the examples beside this test (in the profile's `examples/` directory).

use std::path::PathBuf;
use std::process::Command;

/// The examples.
const EXAMPLES: &[&str] =
    &["hello", "ring_put", "am_pingpong", "rpc_sum", "endpoints", "async_tokio", "dist_counter"];

fn example(name: &str) -> PathBuf {
    let weft = PathBuf::from(env!("CARGO_BIN_EXE_weft"));
    weft.parent().expect("the weft binary is in a directory").join("examples").join(name)
}

fn run(name: &str, n: u32) -> Result<(), String> {
    let exe = example(name);
    if !exe.exists() {
        return Err(format!("{} is not built (cargo test builds the examples)", exe.display()));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "-n", &n.to_string(), "--timeout", "120", "--"])
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot start weft run: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(format!("{name} on {n} ranks: {}\n{text}", out.status));
    }
    Ok(())
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let trials = EXAMPLES
        .iter()
        .flat_map(|&name| {
            [2u32, 4].map(|n| {
                libtest_mimic::Trial::test(format!("{name}_{n}ranks"), move || {
                    run(name, n).map_err(Into::into)
                })
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

//! Every example runs through the launcher on 2 and 4 ranks and succeeds, also with 4 ranks on
//! Docker's default 64 MiB `/dev/shm` (a private mount namespace with a tmpfs of that size).
//! `cargo test` builds the examples beside this test (in the profile's `examples/` directory).

use std::path::PathBuf;
use std::process::Command;

/// The examples.
const EXAMPLES: &[&str] =
    &["hello", "ring_put", "am_pingpong", "rpc_sum", "endpoints", "async_tokio", "dist_counter", "histogram"];

fn example(name: &str) -> PathBuf {
    let weft = PathBuf::from(env!("CARGO_BIN_EXE_weft"));
    weft.parent().expect("the weft binary is in a directory").join("examples").join(name)
}

/// Runs example `name` on `n` ranks; with `shm_mib`, in a mount namespace of its own whose
/// `/dev/shm` is a tmpfs of that many MiB.
fn run(name: &str, n: u32, shm_mib: Option<u32>) -> Result<(), String> {
    let exe = example(name);
    if !exe.exists() {
        return Err(format!("{} is not built (cargo test builds the examples)", exe.display()));
    }
    let weft = env!("CARGO_BIN_EXE_weft");
    let args = ["run", "-n", &n.to_string(), "--timeout", "120", "--"];
    let mut cmd = match shm_mib {
        None => Command::new(weft),
        Some(mib) => {
            let mut c = Command::new("unshare");
            let script = format!("mount -t tmpfs -o size={mib}m tmpfs /dev/shm && exec \"$0\" \"$@\"");
            c.args(["-m", "sh", "-c", &script, weft]);
            c
        }
    };
    let out = cmd.args(args).arg(&exe).output().map_err(|e| format!("cannot start weft run: {e}"))?;
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
            [(2u32, None), (4, None), (4, Some(64))].map(|(n, shm)| {
                let label = shm.map_or(String::new(), |m| format!("_shm{m}mib"));
                libtest_mimic::Trial::test(format!("{name}_{n}ranks{label}"), move || {
                    run(name, n, shm).map_err(Into::into)
                })
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

//! What the multi-process test programs share.

use std::process::Output;

/// Ends a rank with the outcome of its case: status 0, or 1 after printing why.
pub fn exit_with(outcome: Result<(), String>) -> ! {
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// A job's output, for a failure message.
pub fn text(o: &Output) -> String {
    format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

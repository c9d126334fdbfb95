//! The `sluice` binary: the allocator, the runtime and the exit code around
//! [`sluice::run`], the command line.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match sluice::run().await {
        Ok(code) => code,
        // What was wrong and its causes, on one line: a refused configuration or a directory in
        // use is a finding for the user, not a crash, so no backtrace (even with
        // RUST_BACKTRACE set).
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

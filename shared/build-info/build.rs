//! Finds the source revision this build is made from, for `--version` and `sluice_build_info`:
//!
//! 1. `SLUICE_GIT_REVISION` when set and not empty: what `scripts/release.sh` and the image's
//!    build (`--build-arg SLUICE_GIT_REVISION=…`) pass, where the clone may have no `.git`;
//! 2. otherwise the commit checked out, `git rev-parse --short=12 HEAD`, when this is a git
//!    checkout and `git` is installed; rebuilt when HEAD moves (a commit, a checkout);
//! 3. otherwise `unknown` (a source archive without git).
//!
//! Uncommitted changes are not tracked here (that would rebuild on every edit of any file):
//! `scripts/release.sh` marks a release built from a modified tree `-dirty` itself.
//!
//! A few lines of `std::process::Command` rather than `vergen`/`built`: the order above, with
//! the environment first, is the whole of it (docs/decisions.md, "Release artifacts").

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_GIT_REVISION");
    println!("cargo:rerun-if-changed=build.rs");
    let revision = match std::env::var("SLUICE_GIT_REVISION") {
        Ok(given) if !given.trim().is_empty() => given.trim().to_owned(),
        _ => from_git().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=SLUICE_BUILD_REVISION={revision}");
}

/// `git` run in this crate's directory; its trimmed stdout when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn from_git() -> Option<String> {
    let revision = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Rebuilt when HEAD moves: HEAD itself (a checkout), the branch it points at (a commit) and
    // packed-refs (a branch whose ref was packed). `--git-path` resolves them in a worktree
    // too, where HEAD is per worktree and the refs are shared.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if PathBuf::from(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(revision)
}

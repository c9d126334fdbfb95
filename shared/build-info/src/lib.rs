//! What this build is: the workspace's version and the source revision it was built from (see
//! `build.rs` for where the revision comes from). Every binary's `--version` is
//! [`LONG_VERSION`]; the `sluice_build_info{version, revision}` metric reports [`VERSION`] and
//! [`REVISION`], so a scraped process and its binary name the same build.

/// The workspace's semantic version (`[workspace.package] version`, the one source of truth
/// the SDKs' versions are checked against).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source revision: `SLUICE_GIT_REVISION` at build time, else the commit checked out
/// (12 hex digits), else `unknown`.
pub const REVISION: &str = env!("SLUICE_BUILD_REVISION");

/// `0.1.0 (commit 3b3619f1a2b4)`: what `--version` prints after the binary's name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SLUICE_BUILD_REVISION"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_version_names_version_and_revision() {
        assert_eq!(LONG_VERSION, format!("{VERSION} (commit {REVISION})"));
        assert!(!REVISION.is_empty());
        assert!(!REVISION.contains(char::is_whitespace), "{REVISION:?}");
    }
}

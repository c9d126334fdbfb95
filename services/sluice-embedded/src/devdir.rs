//! What `sluice dev` keeps in its data directory besides the ledger: a lock, so a second
//! process on the same directory is refused (naming the holder's pid) instead of running a
//! second writer beside the first; and the generated admin token, so a restart keeps the token
//! the console and scripts were given; and the generated approval-link and callback keys, so
//! links and callback URLs given out before a restart still open and verify.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "sluice-dev.lock";
/// The generated admin token's file in the data directory (readable by its owner only).
pub const TOKEN_FILE: &str = "admin-token";
/// The generated approval-link key's file in the data directory (readable by its owner only):
/// links issued before a restart still open after it.
pub const LINK_KEY_FILE: &str = "approval-link.key";
/// The generated callback-signing key's file in the data directory (readable by its owner
/// only): callback URLs given to upstreams before a restart still verify after it.
pub const CALLBACK_KEY_FILE: &str = "callback.key";

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DevDirError {
    #[error(
        "{dir} is in use by another sluice process (pid {pid}); stop it, or give this one another data directory (ledger.data_dir, or SLUICE_LEDGER__DATA_DIR)"
    )]
    InUse { dir: PathBuf, pid: String },
    #[error("cannot use {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The data directory's lock, held until dropped (the process's end releases it too, even
/// after a SIGKILL: it is an advisory `flock`, not a file's presence).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes the data directory's lock, writing this process's pid into the lock file.
pub fn lock(dir: &Path) -> Result<DirLock, DevDirError> {
    let path = dir.join(LOCK_FILE);
    let io = |source| DevDirError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        return Err(DevDirError::InUse {
            dir: dir.to_owned(),
            pid: match pid.trim() {
                "" => "unknown".to_owned(),
                pid => pid.to_owned(),
            },
        });
    }
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(DirLock { _file: file })
}

/// The admin token kept in the data directory, or `generate()`'s, written there (mode 0600) for
/// the next start. Returns the token and whether it was generated now.
pub fn admin_token(
    dir: &Path,
    generate: impl FnOnce() -> String,
) -> Result<(String, bool), DevDirError> {
    kept_secret(dir, TOKEN_FILE, generate)
}

/// The secret kept in `file` of the data directory, or `generate()`'s, written there (mode
/// 0600) for the next start. Returns the secret and whether it was generated now.
pub fn kept_secret(
    dir: &Path,
    file: &str,
    generate: impl FnOnce() -> String,
) -> Result<(String, bool), DevDirError> {
    let path = dir.join(file);
    let io = |source| DevDirError::Io {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok((text.trim().to_owned(), false)),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(error)),
    }
    let token = generate();
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    writeln!(file, "{token}").map_err(io)?;
    Ok((token, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let held = lock(dir.path()).expect("the first lock");
        let err = lock(dir.path()).expect_err("held already");
        let message = err.to_string();
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        assert!(message.contains("ledger.data_dir"), "{message}");
        drop(held);
        lock(dir.path()).expect("free again once dropped");
    }

    #[test]
    fn the_admin_token_is_kept_across_starts_and_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (first, generated) = admin_token(dir.path(), || "sluice-abc".into()).expect("kept");
        assert!(generated);
        let (second, generated) =
            admin_token(dir.path(), || "sluice-other".into()).expect("read back");
        assert_eq!((second.as_str(), generated), (first.as_str(), false));
        let mode = std::fs::metadata(dir.path().join(TOKEN_FILE))
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "only its owner may read it: {mode:o}");
    }

    #[test]
    fn the_approval_link_key_is_kept_beside_the_token_and_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (first, generated) =
            kept_secret(dir.path(), LINK_KEY_FILE, || "k".repeat(64)).expect("kept");
        assert!(generated);
        let (second, generated) =
            kept_secret(dir.path(), LINK_KEY_FILE, || "other".into()).expect("read back");
        assert_eq!((second.as_str(), generated), (first.as_str(), false));
        assert!(!dir.path().join(TOKEN_FILE).exists(), "a file of its own");
        let mode = std::fs::metadata(dir.path().join(LINK_KEY_FILE))
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "only its owner may read it: {mode:o}");
    }
}

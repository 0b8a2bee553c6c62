//! The uids `isolated` attempts run as: one attempt holds a uid at a time, across every
//! process of the host. What marks a uid taken is an exclusive lock (`flock`) on a file
//! named after it, in a directory only this process's uid (root) may enter: the kernel
//! frees the lock when the holder exits however it exits (kill -9 included), so no lock
//! outlives its process, and no run can take, hold or even see one.

use std::fs::File;
use std::ops::RangeInclusive;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::fcntl::{Flock, FlockArg};

/// Where the locks live when the operator names no other place: beside the host's other
/// runtime state, which a container keeps to itself (workers that share a kernel but not
/// this directory need disjoint `KEEL_SANDBOX_UIDS`).
pub const DEFAULT_LOCKS: &str = "/run/keel/sandbox-uids";

/// A uid held for one attempt; dropping it gives the uid back.
#[derive(Debug)]
pub(crate) struct UidLease {
    pub(crate) uid: u32,
    _held: Flock<File>,
}

/// Takes a free uid of `range`, starting after the last one this process took, so uids
/// turn over rather than one being reused at once. `locks` is the directory of the locks.
pub(super) fn acquire(range: &RangeInclusive<u32>, locks: &Path) -> Result<UidLease, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let size = range.end().saturating_sub(*range.start()).saturating_add(1);
    if range.is_empty() || size == 0 {
        return Err("the sandbox uid range is empty".into());
    }
    private_directory(locks)?;
    let first = NEXT.fetch_add(1, Ordering::Relaxed);
    for step in 0..size {
        let uid = range.start() + first.wrapping_add(step) % size;
        if let Some(held) = hold(locks, uid)? {
            NEXT.store(uid - range.start() + 1, Ordering::Relaxed);
            return Ok(UidLease { uid, _held: held });
        }
    }
    Err(format!(
        "every sandbox uid ({}-{}) is in use by a running attempt: widen KEEL_SANDBOX_UIDS",
        range.start(),
        range.end()
    ))
}

/// The lock of `uid`, or None when another attempt holds it.
fn hold(locks: &Path, uid: u32) -> Result<Option<Flock<File>>, String> {
    let path = locks.join(format!("{uid}.lock"));
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(Some(held)),
        Err((_, nix::Error::EWOULDBLOCK)) => Ok(None),
        Err((_, error)) => Err(format!("locking {}: {error}", path.display())),
    }
}

/// Creates `dir` (mode 0700) where missing, and refuses one that is not this uid's own or
/// that anyone else may enter.
fn private_directory(dir: &Path) -> Result<(), String> {
    let failed = |e: std::io::Error| format!("{}: {e}", dir.display());
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(failed)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(failed)?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} must be a directory of uid {me} that nobody else may enter (mode 0700): \
             it holds the sandbox uids' locks",
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_uid_is_not_handed_out_again_until_it_is_given_back() {
        let locks = tempfile::tempdir().unwrap();
        let locks = locks.path().join("uids");
        let range = 1_900_900_000..=1_900_900_001;
        let first = acquire(&range, &locks).unwrap();
        let second = acquire(&range, &locks).unwrap();
        assert_ne!(first.uid, second.uid);
        let full = acquire(&range, &locks).unwrap_err();
        assert!(full.contains("in use"), "{full}");
        let freed = first.uid;
        drop(first);
        assert_eq!(acquire(&range, &locks).unwrap().uid, freed);
        let mode = std::fs::metadata(&locks).unwrap().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_directory_others_may_enter_is_refused() {
        let locks = tempfile::tempdir().unwrap();
        let open = std::fs::Permissions::from_mode(0o711);
        std::fs::set_permissions(locks.path(), open).unwrap();
        let error = acquire(&(1..=1), locks.path()).unwrap_err();
        assert!(error.contains("mode 0700"), "{error}");
    }
}

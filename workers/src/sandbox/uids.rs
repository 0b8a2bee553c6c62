//! The uids `isolated` attempts run as: one attempt holds a uid at a time, across every
//! process of the host. What marks a uid taken is a bound abstract Unix socket named after
//! it: the kernel keeps the name unique within the network namespace, and frees it when
//! the holder exits however it exits (kill -9 included), so no lock outlives its process.

use std::ops::RangeInclusive;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// A uid held for one attempt; dropping it gives the uid back.
#[derive(Debug)]
pub(crate) struct UidLease {
    pub(crate) uid: u32,
    _held: UnixListener,
}

/// Takes a free uid of `range`, starting after the last one this process took, so uids
/// turn over rather than one being reused at once.
pub(super) fn acquire(range: &RangeInclusive<u32>) -> Result<UidLease, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let size = range.end().saturating_sub(*range.start()).saturating_add(1);
    if range.is_empty() || size == 0 {
        return Err("the sandbox uid range is empty".into());
    }
    let first = NEXT.fetch_add(1, Ordering::Relaxed);
    for step in 0..size {
        let uid = range.start() + first.wrapping_add(step) % size;
        if let Some(held) = hold(uid) {
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

fn hold(uid: u32) -> Option<UnixListener> {
    let name = format!("keel-sandbox-uid-{uid}");
    let address = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    UnixListener::bind_addr(&address).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_uid_is_not_handed_out_again_until_it_is_given_back() {
        // A range of its own, so parallel tests do not share it.
        let range = 1_900_900_000..=1_900_900_001;
        let first = acquire(&range).unwrap();
        let second = acquire(&range).unwrap();
        assert_ne!(first.uid, second.uid);
        let full = acquire(&range).unwrap_err();
        assert!(full.contains("in use"), "{full}");
        let freed = first.uid;
        drop(first);
        assert_eq!(acquire(&range).unwrap().uid, freed);
    }
}

//! A secret handed to a jail's processes as an inherited descriptor, never through their
//! environment, arguments or files: a sealed memory file at fd 3, which a process reads at
//! `/dev/fd/3` (opened anew each time, so every read gets all of it). Keel's own git reads
//! a repository's credential this way, through a credential helper; whatever else runs in
//! that jail inherits the descriptor too, so only Keel's own commands run there.

use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// Where a jail's processes find the secret.
pub const INHERITED_PATH: &str = "/dev/fd/3";
/// The descriptor it is at in the jail's first process.
const INHERITED_FD: i32 = 3;
/// Descriptors a child gets at fixed numbers, at most (the secret, and the jail's two
/// account files, [`super::accounts`]).
const MAX_HANDED: usize = 3;
/// Where the handover parks each descriptor first: above every number it hands to, and
/// below the least `RLIMIT_NOFILE` an attempt may have (which the child already took).
const PARKED_FROM: i32 = 10;

#[derive(Debug)]
pub struct InheritedSecret {
    fd: OwnedFd,
}

impl InheritedSecret {
    /// A sealed memory file holding `bytes`, closed on exec everywhere but in the child it
    /// is handed to.
    pub fn new(bytes: &[u8]) -> std::io::Result<InheritedSecret> {
        Ok(InheritedSecret {
            fd: sealed_memory_file("keel-secret", bytes)?,
        })
    }

    /// The secret at its number, for [`hand_over`].
    pub(crate) fn handed(&self) -> std::io::Result<(OwnedFd, i32)> {
        Ok((self.fd.try_clone()?, INHERITED_FD))
    }
}

/// A memory file holding `bytes` that nothing can change any more, closed on exec, and
/// read from its start by whoever reads the descriptor.
pub(super) fn sealed_memory_file(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let fd = memfd_create(name, flags)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.seek(std::io::SeekFrom::Start(0))?;
    let fd = OwnedFd::from(file);
    let seals = SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_SEAL;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(fd)
}

/// Puts each descriptor at its number in `command`'s child, between fork and exec: after
/// every other descriptor the spawn sets up, so it overwrites none of them. Each is parked
/// above the numbers first, so none is overwritten by another's move before its own.
#[allow(unsafe_code)]
pub(crate) fn hand_over(command: &mut tokio::process::Command, handed: Vec<(OwnedFd, i32)>) {
    assert!(
        handed.len() <= MAX_HANDED,
        "more descriptors than a handover holds"
    );
    let moves: Vec<(i32, i32)> = handed
        .iter()
        .map(|(fd, number)| (fd.as_raw_fd(), *number))
        .collect();
    // SAFETY: the closure runs in the forked child, where only async-signal-safe calls are
    // allowed: fcntl(2) and dup2(2), on descriptors the closure itself keeps open (it owns
    // `handed`), allocating nothing. The parked copies are closed on exec; dup2 clears
    // close-on-exec on the copy at each number.
    unsafe {
        command.pre_exec(move || {
            let _open = &handed;
            let mut parked = [-1; MAX_HANDED];
            for (park, (fd, _)) in parked.iter_mut().zip(&moves) {
                *park = nix::libc::fcntl(*fd, nix::libc::F_DUPFD_CLOEXEC, PARKED_FROM);
                if *park == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (park, (_, number)) in parked.iter().zip(&moves) {
                if nix::libc::dup2(*park, *number) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

//! A secret handed to a jail's processes as an inherited descriptor, never through their
//! environment, arguments or files: a sealed memory file at fd 3, which a process reads at
//! `/dev/fd/3` (opened anew each time, so every read gets all of it). Keel's own git reads
//! a repository's credential this way, through a credential helper; whatever else runs in
//! that jail inherits the descriptor too, so only Keel's own commands run there.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// Where a jail's processes find the secret.
pub const INHERITED_PATH: &str = "/dev/fd/3";
/// The descriptor it is at in the jail's first process.
const INHERITED_FD: i32 = 3;

#[derive(Debug)]
pub struct InheritedSecret {
    fd: OwnedFd,
}

impl InheritedSecret {
    /// A sealed memory file holding `bytes`, closed on exec everywhere but in the child it
    /// is handed to.
    pub fn new(bytes: &[u8]) -> std::io::Result<InheritedSecret> {
        let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let fd = memfd_create("keel-secret", flags)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        let fd = OwnedFd::from(file);
        let seals = SealFlag::F_SEAL_WRITE
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals))?;
        Ok(InheritedSecret { fd })
    }

    /// Puts the secret at fd 3 of `command`'s child, between fork and exec: after every
    /// other descriptor the spawn sets up, so it overwrites none of them.
    #[allow(unsafe_code)]
    pub(crate) fn pass_on_spawn(&self, command: &mut tokio::process::Command) {
        let fd = self.fd.as_raw_fd();
        // SAFETY: the closure runs in the forked child, where only async-signal-safe calls
        // are allowed: dup2(2) and fcntl(2), on a descriptor the parent keeps open until
        // the spawn returns (this secret outlives it), allocating nothing. dup2 clears
        // close-on-exec on the copy; when the secret already is fd 3, fcntl clears it.
        unsafe {
            command.pre_exec(move || {
                let copied = match fd == INHERITED_FD {
                    true => nix::libc::fcntl(fd, nix::libc::F_SETFD, 0),
                    false => nix::libc::dup2(fd, INHERITED_FD),
                };
                match copied {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                }
            });
        }
    }
}

//! What an `isolated` attempt's uid needs of the host's file system: its workspace owned by
//! it, and a way through the workspace's ancestors to reach it (bubblewrap mounts the
//! workspace with the attempt's own credentials).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use nix::unistd::{Gid, Uid, fchown, fchownat};

/// Search permission for others, the one bit the ancestors need.
const OTHERS_SEARCH: u32 = 0o001;

/// Gives the tree of the opened directory `root` to `uid` (as owner and group), file by
/// file, without following a symbolic link anywhere: every directory is opened relative
/// to its parent with `O_NOFOLLOW`, so a link an earlier attempt planted (to `/etc`, say),
/// or swapped in for a directory meanwhile, hands nothing outside the tree over.
pub(super) fn hand_over(root: &OwnedFd, uid: u32) -> Result<(), String> {
    let failed = |e: nix::Error| format!("handing the workspace to uid {uid}: {e}");
    let top = root
        .try_clone()
        .map_err(|e| format!("handing the workspace to uid {uid}: {e}"))?;
    let top = Dir::from_fd(top).map_err(failed)?;
    give(&top, &fstat(top.as_fd()).map_err(failed)?, None, uid).map_err(failed)?;
    let mut pending = vec![top];
    while let Some(mut dir) = pending.pop() {
        let names: Vec<_> = dir
            .iter()
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_owned())
            .filter(|name| name.to_bytes() != b"." && name.to_bytes() != b"..")
            .collect();
        for name in names {
            let stat = match fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                // Gone since the listing: nothing to hand over.
                Err(nix::Error::ENOENT) => continue,
                Err(e) => return Err(failed(e)),
            };
            give(&dir, &stat, Some(name.as_c_str()), uid).map_err(failed)?;
            if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
                let child = Dir::openat(
                    dir.as_fd(),
                    name.as_c_str(),
                    directory_flags(),
                    Mode::empty(),
                )
                .map_err(failed)?;
                pending.push(child);
            }
        }
    }
    Ok(())
}

fn directory_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Chowns `name` in `dir` (or `dir` itself) unless it already belongs to `uid`.
fn give(dir: &Dir, stat: &FileStat, name: Option<&std::ffi::CStr>, uid: u32) -> nix::Result<()> {
    if stat.st_uid == uid && stat.st_gid == uid {
        return Ok(());
    }
    let (owner, group) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid)));
    match name {
        Some(name) => fchownat(
            dir.as_fd(),
            name,
            owner,
            group,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
        None => fchown(dir.as_fd(), owner, group),
    }
}

/// Makes `root`, where Keel keeps workspaces, and its parent (the data directory) passable
/// by the sandbox's uids, adding search for others, never listing, to the ones this
/// process owns; then checks the ancestors above. Creates `root` when it is missing.
pub fn open_workspace_root(root: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    for dir in [root, root.parent().unwrap_or(root)] {
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if meta.uid() == me && meta.mode() & OTHERS_SEARCH == 0 {
            let mode = std::fs::Permissions::from_mode((meta.mode() | OTHERS_SEARCH) & 0o7777);
            std::fs::set_permissions(dir, mode).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    check_reachable(&root.join("workspace"))
}

/// Checks that a uid other than the directories' owners can pass through every ancestor
/// of `workspace`; the error names the first that stops it and what to change.
pub(super) fn check_reachable(workspace: &Path) -> Result<(), String> {
    let parent = workspace.parent().unwrap_or(workspace);
    check_passable(parent, &format!("the workspace {}", workspace.display()))
}

/// Checks that a uid other than the owners can pass through `dir` and its ancestors, to
/// reach `what`.
pub(super) fn check_passable(dir: &Path, what: &str) -> Result<(), String> {
    for ancestor in dir.ancestors() {
        let mode = std::fs::metadata(ancestor)
            .map_err(|e| format!("{}: {e}", ancestor.display()))?
            .mode();
        if mode & OTHERS_SEARCH == 0 {
            return Err(format!(
                "the sandbox's uids cannot reach {what}: {} (mode {:o}) has no search \
                 permission for others; give it one (chmod o+x), or keep it elsewhere",
                ancestor.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Skipped unless root: only root may give files away.
    #[test]
    fn handing_over_changes_the_tree_and_nothing_a_link_points_at() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("secret");
        std::fs::write(&target, "x").unwrap();
        let workspace = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(workspace.path().join("a/b")).unwrap();
        std::fs::write(workspace.path().join("a/b/file"), "y").unwrap();
        std::os::unix::fs::symlink(&target, workspace.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), workspace.path().join("dirlink")).unwrap();
        let uid = 1_900_900_100;
        let opened = crate::file::beneath::open_workspace(workspace.path()).unwrap();
        hand_over(&opened, uid).unwrap();
        for owned in ["", "a", "a/b", "a/b/file"] {
            let meta = std::fs::symlink_metadata(workspace.path().join(owned)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (uid, uid), "{owned}");
        }
        // The links themselves are handed over; what they point at is not.
        assert_eq!(std::fs::metadata(&target).unwrap().uid(), 0);
        assert_eq!(std::fs::metadata(outside.path()).unwrap().uid(), 0);
    }

    #[test]
    fn an_ancestor_without_search_for_others_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let workspace = parent.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let closed = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(parent.path(), closed).unwrap();
        let error = check_reachable(&workspace).unwrap_err();
        assert!(
            error.contains(&parent.path().display().to_string()),
            "{error}"
        );
        assert!(error.contains("chmod o+x"), "{error}");
        let open = std::fs::Permissions::from_mode(0o711);
        std::fs::set_permissions(parent.path(), open).unwrap();
        check_reachable(&workspace).unwrap();
    }
}

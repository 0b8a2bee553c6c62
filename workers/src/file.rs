//! File operations (write, append, delete) confined to the run's workspace.

use std::path::{Component, Path, PathBuf};

use crate::{ContextError, FileOperation, Outcome, RunContext, RunSpec, StepResult};

/// Checks that `path` names a file inside a workspace: relative, not empty, and with no
/// `..`, root or prefix component. The runtime refuses such paths at the API; the executor
/// checks again and also refuses every symbolic link and hard-linked file on the way.
pub fn validate_relative_path(path: &str) -> Result<PathBuf, &'static str> {
    let path = Path::new(path);
    if path.as_os_str().is_empty() {
        return Err("the path is empty");
    }
    if path.is_absolute() {
        return Err("the path must be relative to the workspace");
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err("the path must not leave the workspace (no '..' components)");
    }
    if !path.components().any(|c| matches!(c, Component::Normal(_))) {
        return Err("the path names the workspace itself, not a file in it");
    }
    Ok(path.to_path_buf())
}

pub(crate) async fn run<C: RunContext>(
    ctx: &C,
    spec: &RunSpec,
    path: &str,
    content: Option<&str>,
    operation: FileOperation,
) -> Result<Outcome, ContextError> {
    let name = match operation {
        FileOperation::Write => "file.write",
        FileOperation::Append => "file.append",
        FileOperation::Delete => "file.delete",
    };
    let input = serde_json::json!({
        "path": path,
        "bytes": content.map(str::len).unwrap_or(0),
        "checkpoint": spec.checkpoint,
    });
    let step = ctx.start_step(name, input).await?;
    match apply(&spec.workspace, path, content.unwrap_or(""), operation).await {
        Ok(size) => {
            let output = serde_json::json!({ "path": path, "size_bytes": size });
            ctx.finish_step(&step, StepResult::Completed { output })
                .await?;
            Ok(Outcome::Completed { exit_code: None })
        }
        Err(error) => crate::process::fail(ctx, &step, error).await,
    }
}

/// Applies the operation; returns the file's size afterwards (0 once deleted). The
/// system calls block, so they run off the async runtime.
async fn apply(
    workspace: &Path,
    path: &str,
    content: &str,
    operation: FileOperation,
) -> Result<u64, String> {
    let relative = validate_relative_path(path).map_err(|e| format!("{path}: {e}"))?;
    let (workspace, content) = (workspace.to_path_buf(), content.to_owned());
    let applied = tokio::task::spawn_blocking(move || {
        beneath::apply(&workspace, &relative, content.as_bytes(), operation)
    })
    .await
    .map_err(|e| format!("{path}: {e}"))?;
    applied.map_err(|e| format!("{path}: {e}"))
}

/// Every lookup goes through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from a
/// descriptor of the workspace (a writer's one component at a time): no symbolic link is followed (not
/// even one that stays inside, which could be swapped between a check and a use), nothing
/// outside the workspace is reached, and a missing directory is created with `mkdirat` in
/// the directory already opened, never by path.
/// Writes `content` to the file `relative` beneath `directory`, replacing it, following no
/// link anywhere: the runtime rewrites files of Keel's own in a directory a run has
/// written this way (a push repository's configuration).
pub async fn write_beneath(
    directory: &Path,
    relative: &'static str,
    content: &'static [u8],
) -> Result<(), String> {
    let directory = directory.to_path_buf();
    let write = FileOperation::Write;
    tokio::task::spawn_blocking(move || {
        beneath::apply(&directory, Path::new(relative), content, write).map(drop)
    })
    .await
    .map_err(|e| e.to_string())?
}

pub(crate) mod beneath {
    use std::ffi::OsStr;
    use std::fs::File;
    use std::io::{Read, Write};
    use std::os::fd::{AsFd, OwnedFd};
    use std::path::{Component, Path};

    use nix::errno::Errno;
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    use nix::sys::stat::{Mode, SFlag, fstat, mkdirat};
    use nix::unistd::{UnlinkatFlags, ftruncate, unlinkat};

    use crate::FileOperation;

    pub(crate) fn apply(
        workspace: &Path,
        relative: &Path,
        content: &[u8],
        operation: FileOperation,
    ) -> Result<u64, String> {
        let names = names(relative);
        let (file, parents) = names.split_last().ok_or("the path names no file")?;
        let create = !matches!(operation, FileOperation::Delete);
        let parent = open_directories(workspace, parents, create)?;
        match operation {
            FileOperation::Delete => {
                unlinkat(&parent, *file, UnlinkatFlags::NoRemoveDir).map_err(explain)?;
                Ok(0)
            }
            FileOperation::Write => write(&parent, file, content, OFlag::O_WRONLY),
            FileOperation::Append => write(&parent, file, content, OFlag::O_APPEND),
        }
    }

    /// Creates the directory `relative` beneath `workspace` and what is missing above it,
    /// following no link (the worker prepares a run's own directories this way, in a
    /// workspace an earlier attempt's processes could have filled with links).
    pub(crate) fn create_directories(workspace: &Path, relative: &Path) -> Result<(), String> {
        open_directories(workspace, &names(relative), true).map(drop)
    }

    fn names(relative: &Path) -> Vec<&OsStr> {
        relative
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name),
                _ => None,
            })
            .collect()
    }

    /// Opens the workspace directory itself, following no link anywhere on its path. The
    /// runtime hands workspaces over by their canonical path, so a link on the way is one
    /// somebody planted since: a run that owns a directory above another task's, swapping
    /// it for a link to a third party's tree.
    pub(crate) fn open_workspace(workspace: &Path) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(directory_flags())
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        openat2(nix::fcntl::AT_FDCWD, workspace, how)
    }

    /// Opens the directory `names` leads to from `workspace`, one component at a time.
    fn open_directories(
        workspace: &Path,
        names: &[&OsStr],
        create: bool,
    ) -> Result<OwnedFd, String> {
        let root = open_workspace(workspace).map_err(|e| format!("opening the workspace: {e}"))?;
        names
            .iter()
            .try_fold(root, |dir, name| open_directory(&dir, name, create))
    }

    /// Why [`read`] did not return a file's bytes.
    pub(crate) enum Unreadable {
        NotRegular,
        /// The file has other hard links: its other names may be outside the workspace,
        /// since a hard link can be made to any file its maker can read.
        Linked,
        TooLarge(u64),
        Failed(String),
    }

    /// The bytes of the regular file at `relative` in `workspace`, when it has no other
    /// link and at most `max` bytes; None when it does not exist. Opened non-blocking, so
    /// a FIFO swapped in for the file cannot stall the caller.
    pub(crate) fn read(
        workspace: &Path,
        relative: &Path,
        max: u64,
    ) -> Result<Option<Vec<u8>>, Unreadable> {
        let failed = |e: Errno| Unreadable::Failed(explain(e));
        let root = open_workspace(workspace).map_err(failed)?;
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = match openat2(&root, relative, confined(flags, Mode::empty())) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(error) => return Err(failed(error)),
        };
        let stat = fstat(fd.as_fd()).map_err(failed)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(Unreadable::NotRegular);
        }
        if stat.st_nlink > 1 {
            return Err(Unreadable::Linked);
        }
        let size = stat.st_size as u64;
        if size > max {
            return Err(Unreadable::TooLarge(size));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        File::from(fd)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Unreadable::Failed(e.to_string()))?;
        if bytes.len() as u64 > max {
            return Err(Unreadable::TooLarge(bytes.len() as u64));
        }
        Ok(Some(bytes))
    }

    fn directory_flags() -> OFlag {
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
    }

    fn confined(flags: OFlag, mode: Mode) -> OpenHow {
        OpenHow::new()
            .flags(flags)
            .mode(mode)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
    }

    /// Opens the directory `name` in `dir`, creating it first when asked and missing.
    fn open_directory(dir: &OwnedFd, name: &OsStr, create: bool) -> Result<OwnedFd, String> {
        let how = confined(directory_flags(), Mode::empty());
        match openat2(dir, name, how) {
            Err(Errno::ENOENT) if create => {
                match mkdirat(dir, name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => openat2(dir, name, how).map_err(explain),
                    Err(error) => Err(explain(error)),
                }
            }
            opened => opened.map_err(explain),
        }
    }

    /// Writes (`O_WRONLY`, replacing the content) or appends (`O_APPEND`) to a regular
    /// file with no other link: overwriting a hard link to a file elsewhere would change
    /// that file. Opened non-blocking, so a FIFO swapped in for the file cannot stall the
    /// caller (a regular file's writes ignore the flag).
    fn write(dir: &OwnedFd, name: &OsStr, content: &[u8], mode: OFlag) -> Result<u64, String> {
        let flags = mode | OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = openat2(dir, name, confined(flags, Mode::from_bits_truncate(0o644)))
            .map_err(explain)?;
        let stat = fstat(fd.as_fd()).map_err(explain)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err("not a regular file".into());
        }
        if stat.st_nlink > 1 {
            return Err("the file has other hard links; refusing to change it".into());
        }
        if !mode.contains(OFlag::O_APPEND) {
            ftruncate(&fd, 0).map_err(explain)?;
        }
        let mut file = File::from(fd);
        file.write_all(content).map_err(|e| e.to_string())?;
        Ok(file.metadata().map_err(|e| e.to_string())?.len())
    }

    /// The refusals in words; the kernel's own message for the rest.
    fn explain(error: Errno) -> String {
        match error {
            Errno::ELOOP => "the path goes through a symbolic link; refused".into(),
            Errno::EXDEV => "the path leads out of the workspace".into(),
            Errno::ENOSYS => {
                "sandbox_unavailable: this kernel has no openat2 (Linux 5.6 or later)".into()
            }
            other => other.desc().into(),
        }
    }
}

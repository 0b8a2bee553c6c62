//! Confinement of a tool's path arguments to the run's workspace: relative paths only, no
//! `..`, and every symbolic link on the way resolved and checked to stay inside. A link
//! that leads out, dangles or loops is refused, never followed.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// A path inside the workspace: `full` has no symbolic link in it (as of the check), and
/// `relative` is how the result names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Confined {
    pub full: PathBuf,
    pub relative: String,
}

/// Resolves `path` (relative to `workspace`, which is canonical) to a location inside it.
/// `.` or an empty path names the workspace itself. What does not exist yet resolves
/// through its nearest existing parent.
pub(super) fn confine(workspace: &Path, path: &str) -> Result<Confined, String> {
    // Canonical already, normally; resolved again so a caller's spelling cannot matter.
    let workspace = &std::fs::canonicalize(workspace).map_err(|e| {
        format!(
            "the workspace {} cannot be resolved: {e}",
            workspace.display()
        )
    })?;
    let given = Path::new(path);
    if given.is_absolute() {
        return Err(format!(
            "{path}: absolute paths are refused; give a path relative to the workspace"
        ));
    }
    if given
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{path}: '..' is refused; stay inside the workspace"
        ));
    }
    let mut existing = workspace.join(given);
    let mut missing = Vec::new();
    // symlink_metadata, not exists(): a dangling link "does not exist" but must be seen.
    loop {
        match std::fs::symlink_metadata(&existing) {
            Ok(_) => break,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let name = existing.file_name().map(|n| n.to_os_string());
                match name {
                    Some(name) if existing.pop() => missing.push(name),
                    _ => return Err(format!("{path}: cannot be resolved")),
                }
            }
            Err(e) => return Err(unresolvable(path, &e)),
        }
    }
    let resolved = std::fs::canonicalize(&existing).map_err(|e| unresolvable(path, &e))?;
    let Ok(inside) = resolved.strip_prefix(workspace) else {
        return Err(format!(
            "{path}: leads outside the workspace (through a symbolic link); refused"
        ));
    };
    let mut relative = inside.to_path_buf();
    let mut full = resolved.clone();
    for name in missing.iter().rev() {
        relative.push(name);
        full.push(name);
    }
    // Results and patches name the file by this text, and writers reach it by it again.
    let relative = match relative.to_str() {
        Some("") => ".".to_string(),
        Some(r) => r.to_string(),
        None => {
            return Err(format!(
                "{path}: resolves to a name that is not UTF-8; refused"
            ));
        }
    };
    Ok(Confined { full, relative })
}

/// Why a path that exists (as a name) cannot be resolved.
fn unresolvable(path: &str, error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(code) if code == nix::libc::ELOOP => format!("{path}: a symbolic link loop; refused"),
        _ if error.kind() == ErrorKind::NotFound => {
            format!("{path}: goes through a dangling symbolic link; refused")
        }
        _ => format!("{path}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/lib.rs"), "x").unwrap();
        (dir, root)
    }

    #[test]
    fn paths_inside_resolve_and_escapes_are_refused() {
        let (_dir, root) = workspace();
        let file = confine(&root, "src/./lib.rs").unwrap();
        assert_eq!(file.full, root.join("src/lib.rs"));
        assert_eq!(file.relative, "src/lib.rs");
        assert_eq!(confine(&root, "").unwrap().relative, ".");
        assert_eq!(
            confine(&root, "new/dir/f.txt").unwrap().relative,
            "new/dir/f.txt"
        );
        for bad in ["../x", "src/../../x", "src/..", "/etc/passwd"] {
            assert!(confine(&root, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn symlinks_out_dangling_or_looping_are_refused_and_inside_ones_resolve() {
        let (_dir, root) = workspace();
        let outside = tempfile::tempdir().unwrap();
        symlink("/etc", root.join("etc")).unwrap();
        symlink(outside.path(), root.join("out")).unwrap();
        symlink("/etc/passwd", root.join("passwd")).unwrap();
        symlink(outside.path().join("missing"), root.join("dangling")).unwrap();
        symlink(root.join("loop_b"), root.join("loop_a")).unwrap();
        symlink(root.join("loop_a"), root.join("loop_b")).unwrap();
        symlink("src", root.join("inner")).unwrap();
        for bad in [
            "etc/passwd",
            "etc",
            "passwd",
            "out/new.txt",
            "dangling",
            "loop_a/x",
        ] {
            let error = confine(&root, bad).unwrap_err();
            assert!(error.contains("refused"), "{bad}: {error}");
        }
        assert_eq!(
            confine(&root, "inner/lib.rs").unwrap().relative,
            "src/lib.rs"
        );
    }
}

//! The environment a run's processes start with: nothing of the worker's but `PATH` and
//! `LANG`, a home and a temporary directory inside the workspace, and what the runtime
//! hands over (the run's `KEEL_RUN_*` variables and the operator's passthrough names).

use std::path::Path;

use crate::FileOperation;
use crate::file::beneath;

/// `PATH` when the worker has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `LANG` when the worker has none.
const DEFAULT_LANG: &str = "C.UTF-8";
/// The run's private directories live under this workspace directory.
const STATE_DIR: &str = ".keel";

/// Builds the child environment and creates `<workspace>/.keel/{home,tmp}` (with a
/// `.gitignore` so a git workspace does not see them).
pub(crate) async fn environment(
    workspace: &Path,
    extra: impl IntoIterator<Item = (String, String)>,
) -> std::io::Result<Vec<(String, String)>> {
    let home = home(workspace);
    let tmp = workspace.join(STATE_DIR).join("tmp");
    let root = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || prepare_state_directory(&root))
        .await?
        .map_err(std::io::Error::other)?;
    let inherited = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|value| !value.is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    let path_of = |dir: &Path| dir.to_string_lossy().into_owned();
    Ok([
        ("PATH".to_string(), inherited("PATH", DEFAULT_PATH)),
        ("LANG".to_string(), inherited("LANG", DEFAULT_LANG)),
        ("HOME".to_string(), path_of(&home)),
        ("TMPDIR".to_string(), path_of(&tmp)),
    ]
    .into_iter()
    .chain(extra)
    .collect())
}

/// The run's `HOME`.
pub(super) fn home(workspace: &Path) -> std::path::PathBuf {
    workspace.join(STATE_DIR).join("home")
}

/// `.keel/{home,tmp}` and its `.gitignore`, made without following links: the workspace
/// belongs to the run, whose earlier attempt may have left `.keel` or `.gitignore` as a link
/// to a file of the worker's.
fn prepare_state_directory(workspace: &Path) -> Result<(), String> {
    let state = Path::new(STATE_DIR);
    for dir in ["home", "tmp"] {
        beneath::create_directories(workspace, &state.join(dir))?;
    }
    let ignore_all = b"*\n";
    beneath::apply(
        workspace,
        &state.join(".gitignore"),
        ignore_all,
        FileOperation::Write,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn makes_the_runs_directories_in_the_workspace() {
        let workspace = tempfile::tempdir().unwrap();
        let env = environment(workspace.path(), []).await.unwrap();
        let home = workspace.path().join(".keel/home");
        assert!(home.is_dir() && workspace.path().join(".keel/tmp").is_dir());
        assert!(env.contains(&("HOME".into(), home.to_string_lossy().into_owned())));
        let ignore = std::fs::read_to_string(workspace.path().join(".keel/.gitignore")).unwrap();
        assert_eq!(ignore, "*\n");
    }

    #[tokio::test]
    async fn follows_no_link_a_run_left_behind() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "the worker's").unwrap();

        let linked_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), linked_dir.path().join(".keel")).unwrap();
        assert!(environment(linked_dir.path(), []).await.is_err());
        assert!(!outside.path().join("home").exists());
        assert!(!outside.path().join(".gitignore").exists());

        let linked_file = tempfile::tempdir().unwrap();
        std::fs::create_dir(linked_file.path().join(".keel")).unwrap();
        std::os::unix::fs::symlink(&victim, linked_file.path().join(".keel/.gitignore")).unwrap();
        assert!(environment(linked_file.path(), []).await.is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the worker's");
    }
}

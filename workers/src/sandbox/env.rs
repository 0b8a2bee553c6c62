//! The environment a run's processes start with: nothing of the worker's but `PATH` and
//! `LANG`, a home and a temporary directory inside the workspace, and what the runtime
//! hands over (the run's `KEEL_RUN_*` variables and the operator's passthrough names).

use std::path::Path;

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
    let state = workspace.join(STATE_DIR);
    let home = state.join("home");
    let tmp = state.join("tmp");
    tokio::fs::create_dir_all(&home).await?;
    tokio::fs::create_dir_all(&tmp).await?;
    tokio::fs::write(state.join(".gitignore"), "*\n").await?;
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

//! Where a run works: its task's `in_place` directory, its task's persistent one, or an
//! ephemeral one of its own.

use std::path::{Path, PathBuf};

use crate::runs::RunRecord;
use crate::tasks::TaskRecord;
use crate::tasks::WorkspaceRoots;

/// Where a worker keeps its runs' ephemeral workspaces, one directory per run id, and its
/// tasks' persistent ones, one per task id.
pub(crate) fn ephemeral_root(data_dir: &Path) -> PathBuf {
    data_dir.join("workspaces")
}

/// The directory a run works in: its task's `in_place` directory, re-confined to the
/// workspace roots, or its ephemeral `<data_dir>/workspaces/<workspace owner>` (which may
/// not exist yet). Workers run there; the patches API reverts files there.
pub(crate) fn workspace_dir(
    roots: &WorkspaceRoots,
    data_dir: &Path,
    task: &TaskRecord,
    run: &RunRecord,
) -> Result<PathBuf, String> {
    match &task.working_directory {
        Some(directory) if task.workspace_mode == "in_place" => roots
            .confine(directory, task.sandbox_allowed_root.as_deref())
            .map_err(|e| format!("workspace_refused: {}: {}", e.field, e.message)),
        _ if task.workspace_mode == "persistent" => Ok(ephemeral_root(data_dir).join(&task.id)),
        _ => Ok(ephemeral_root(data_dir).join(run.workspace_owner())),
    }
}

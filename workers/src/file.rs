//! File operations (write, append, delete) confined to the run's workspace.

use std::path::{Component, Path, PathBuf};

use tokio::io::AsyncWriteExt;

use crate::{ContextError, FileOperation, Outcome, RunContext, RunSpec, StepResult};

/// Checks that `path` names a file inside a workspace: relative, not empty, and with no
/// `..`, root or prefix component. The runtime refuses such paths at the API; the executor
/// checks again and also refuses symlinks that lead out.
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
        Err(error) => {
            ctx.finish_step(
                &step,
                StepResult::Failed {
                    error: error.clone(),
                },
            )
            .await?;
            Ok(Outcome::Failed {
                exit_code: None,
                error,
            })
        }
    }
}

/// Applies the operation; returns the file's size afterwards (0 once deleted).
async fn apply(
    workspace: &Path,
    path: &str,
    content: &str,
    operation: FileOperation,
) -> Result<u64, String> {
    let target = confined(workspace, path).await?;
    let io = |e: std::io::Error| format!("{path}: {e}");
    match operation {
        FileOperation::Delete => {
            tokio::fs::remove_file(&target).await.map_err(io)?;
            return Ok(0);
        }
        FileOperation::Write => tokio::fs::write(&target, content).await.map_err(io)?,
        FileOperation::Append => {
            let mut file = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&target)
                .await
                .map_err(io)?;
            file.write_all(content.as_bytes()).await.map_err(io)?;
            file.flush().await.map_err(io)?;
        }
    }
    Ok(tokio::fs::metadata(&target).await.map_err(io)?.len())
}

/// Resolves `path` inside `workspace`, creating parent directories, and refuses a result
/// that a symlink leads out of the workspace.
async fn confined(workspace: &Path, path: &str) -> Result<PathBuf, String> {
    let relative = validate_relative_path(path).map_err(|e| format!("{path}: {e}"))?;
    let target = workspace.join(&relative);
    let parent = target.parent().unwrap_or(workspace);
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    let root = tokio::fs::canonicalize(workspace)
        .await
        .map_err(|e| format!("workspace: {e}"))?;
    let real_parent = tokio::fs::canonicalize(parent)
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    let leaves = !real_parent.starts_with(&root);
    let is_outward_link = match tokio::fs::symlink_metadata(&target).await {
        Ok(meta) if meta.file_type().is_symlink() => {
            let real = tokio::fs::canonicalize(&target).await.ok();
            real.is_none_or(|real| !real.starts_with(&root))
        }
        _ => false,
    };
    if leaves || is_outward_link {
        return Err(format!("{path}: the path leads out of the workspace"));
    }
    Ok(target)
}

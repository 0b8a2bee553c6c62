//! The tools that run processes: shell_exec (`sh -c`) and git. They start through
//! [`crate::process::start`], so they get exactly a shell run's containment, clean
//! environment and namespaces, and everything a call started is killed when it ends, times
//! out or is cancelled.

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::paths::confine;
use super::{Done, ToolEnv, ToolError};
use crate::process::{self, Exit, collect};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ShellExec {
    command: String,
}

pub(super) async fn shell_exec(
    env: &ToolEnv,
    args: ShellExec,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    let argv = vec!["sh".to_string(), "-c".to_string(), args.command];
    run(env, argv, cancel).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GitDiff {
    path: Option<String>,
}

pub(super) async fn git_status(
    env: &ToolEnv,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    run(env, git(&["status", "--short", "--branch"]), cancel).await
}

pub(super) async fn git_diff(
    env: &ToolEnv,
    args: GitDiff,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    let mut argv = git(&["diff", "--no-ext-diff", "--no-textconv", "--no-color"]);
    if let Some(path) = &args.path {
        argv.extend(["--".to_string(), confine(&env.workspace, path)?.relative]);
    }
    run(env, argv, cancel).await
}

/// git with the repository's own command hooks off: a workspace's `.git/config` must not
/// make a read-only tool run a program (core.fsmonitor) or page its output.
fn git(args: &[&str]) -> Vec<String> {
    ["git", "--no-pager", "-c", "core.fsmonitor=false"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect()
}

async fn run(
    env: &ToolEnv,
    argv: Vec<String>,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    let (mut child, mut containment) =
        process::start(&argv, &env.workspace, &env.env, env.sandbox).await?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let ended = CancellationToken::new();
    let timeout = Some(env.call_timeout);
    let waited = process::wait_and_end(&mut child, &mut containment, timeout, cancel, &ended);
    let cap = env.max_output_bytes;
    let (exit, stdout, stderr) = tokio::join!(
        waited,
        collect(stdout, cap, &ended),
        collect(stderr, cap, &ended)
    );
    let output = format!("[stdout]\n{stdout}[stderr]\n{stderr}");
    match exit {
        None => Err("the tool call was cancelled; its processes were killed".into()),
        Some(Exit::TimedOut(limit)) => Err(format!(
            "timed out after {} ms; the command and everything it started were killed\n{output}",
            limit.as_millis()
        )
        .into()),
        Some(Exit::Status(status)) => {
            let code = match status.code() {
                Some(code) => format!("exit code {code}"),
                None => "killed by a signal".to_string(),
            };
            Ok(Done {
                content: format!("{code}\n{output}"),
                failed: !status.success(),
                patches: Vec::new(),
            })
        }
    }
}

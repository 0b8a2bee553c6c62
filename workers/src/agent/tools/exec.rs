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
    let argv = ["status", "--short", "--branch", "--ignore-submodules=all"];
    read_only_git(env, &argv, cancel).await
}

pub(super) async fn git_diff(
    env: &ToolEnv,
    args: GitDiff,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    let mut argv = vec![
        "diff",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "--ignore-submodules=all",
    ];
    let path = match &args.path {
        Some(path) => Some(confine(&env.workspace, path)?.relative),
        None => None,
    };
    if let Some(path) = &path {
        argv.extend(["--", path]);
    }
    read_only_git(env, &argv, cancel).await
}

/// Runs a read-only git command with every way the repository's configuration (which a
/// run's own processes can write) could make it run a program switched off: no system or
/// global configuration, no fsmonitor, pager or hooks, no index write (whose hook git
/// would run), no submodules (each has a configuration of its own), and every configured
/// filter driver emptied (git runs a clean filter to compare a changed file). External
/// diff and textconv drivers are off by the diff's own flags.
async fn read_only_git(
    env: &ToolEnv,
    args: &[&str],
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    let mut overrides: Vec<(String, String)> = [
        ("core.fsmonitor", "false"),
        ("core.hooksPath", "/dev/null"),
        ("core.pager", "cat"),
    ]
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .into();
    for driver in filter_drivers(env, cancel).await? {
        for part in ["clean", "smudge", "process"] {
            overrides.push((format!("filter.{driver}.{part}"), String::new()));
        }
        overrides.push((format!("filter.{driver}.required"), "false".into()));
    }
    let mut argv = git(&["--no-pager", "--no-optional-locks"]);
    argv.extend(args.iter().map(|a| a.to_string()));
    run(&hardened(env, &overrides), argv, cancel).await
}

/// The names of the filter drivers the repository's configuration defines (its includes
/// followed). Reading configuration runs nothing.
async fn filter_drivers(
    env: &ToolEnv,
    cancel: &CancellationToken,
) -> Result<Vec<String>, ToolError> {
    let argv = git(&["config", "-z", "--name-only", "--get-regexp", r"^filter\."]);
    let listed = run(&hardened(env, &[]), argv, cancel).await?;
    // The content is `exit code N\n[stdout]\n…[stderr]\n…`; exit code 1 with nothing on
    // stdout: no filter is configured (or there is no repository).
    let names = listed
        .content
        .split_once("[stdout]\n")
        .and_then(|(_, rest)| rest.split_once("[stderr]\n"))
        .map_or("", |(stdout, _)| stdout);
    if names.contains("[… truncated: ") {
        return Err(
            "the repository configures more filter drivers than git_status and \
                    git_diff can switch off; refused"
                .into(),
        );
    }
    let mut drivers: Vec<String> = names
        .split('\0')
        .filter_map(|key| key.strip_prefix("filter."))
        .filter_map(|rest| rest.rsplit_once('.').map(|(driver, _)| driver.to_string()))
        .collect();
    drivers.sort();
    drivers.dedup();
    Ok(drivers)
}

/// `env` with git's system and global configuration off and `overrides` given as
/// command-line configuration (through `GIT_CONFIG_*`, so a key's text is never parsed
/// as `key=value`).
fn hardened(env: &ToolEnv, overrides: &[(String, String)]) -> ToolEnv {
    let mut hardened = env.clone();
    hardened.env.extend([
        ("GIT_CONFIG_NOSYSTEM".to_string(), "1".to_string()),
        ("GIT_CONFIG_GLOBAL".to_string(), "/dev/null".to_string()),
        ("GIT_CONFIG_COUNT".to_string(), overrides.len().to_string()),
    ]);
    for (n, (key, value)) in overrides.iter().enumerate() {
        hardened
            .env
            .push((format!("GIT_CONFIG_KEY_{n}"), key.clone()));
        hardened
            .env
            .push((format!("GIT_CONFIG_VALUE_{n}"), value.clone()));
    }
    hardened
}

fn git(args: &[&str]) -> Vec<String> {
    std::iter::once(&"git")
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
        process::start(&argv, &env.workspace, &env.env, &env.sandbox).await?;
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
            "{}\n{output}",
            containment.blame_limits(format!(
                "timed out after {} ms; the command and everything it started were killed",
                limit.as_millis()
            ))
        )
        .into()),
        Some(Exit::Status(status)) => {
            let code = match status.code() {
                Some(code) => format!("exit code {code}"),
                None => "killed by a signal".to_string(),
            };
            let code = match status.success() {
                true => code,
                false => containment.blame_limits(code),
            };
            Ok(Done {
                content: format!("{code}\n{output}"),
                failed: !status.success(),
                patches: Vec::new(),
            })
        }
    }
}

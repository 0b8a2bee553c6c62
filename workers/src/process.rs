//! Runs a child process in its own process group, streams its stdout and stderr into
//! artifacts while it runs, and kills the whole group on cancellation, timeout or exit.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::{ArtifactHandle, ContextError, Outcome, OutputStream, RunContext, RunSpec, StepResult};

/// Output is flushed to the runtime at least this often while a process writes...
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// ...or as soon as this much is pending.
const FLUSH_BYTES: usize = 64 * 1024;
/// How much of stderr's end goes into a failed run's `last_error`.
const STDERR_TAIL_BYTES: usize = 2048;

enum Exit {
    Status(std::process::ExitStatus),
    TimedOut(Duration),
    Interrupted,
}

pub(crate) async fn run<C: RunContext>(
    ctx: &C,
    step_name: &str,
    argv: Vec<String>,
    spec: &RunSpec,
) -> Result<Outcome, ContextError> {
    let step = ctx
        .start_step(step_name, serde_json::json!({ "argv": argv }))
        .await?;
    let stdout_artifact = ctx.open_output(OutputStream::Stdout).await?;
    let stderr_artifact = ctx.open_output(OutputStream::Stderr).await?;

    let mut child = match spawn(&argv, spec) {
        Ok(child) => child,
        Err(error) => {
            let error = format!("could not start {}: {error}", argv[0]);
            ctx.finish_step(
                &step,
                StepResult::Failed {
                    error: error.clone(),
                },
            )
            .await?;
            return Ok(Outcome::Failed {
                exit_code: None,
                error,
            });
        }
    };
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let waited = async {
        let exit = wait(ctx, &mut child, spec.timeout).await;
        // Whatever the process left behind in its group goes too: a background child
        // would otherwise keep the pipes open and outlive the run.
        kill_group(group);
        exit
    };
    let (exit, stdout_result, stderr_result) = tokio::join!(
        waited,
        pump(ctx, &stdout_artifact, stdout),
        pump(ctx, &stderr_artifact, stderr),
    );
    if matches!(exit, Exit::Interrupted) || ctx.cancellation().is_cancelled() {
        return Err(ContextError::Interrupted);
    }
    stdout_result?;
    let stderr_tail = stderr_result?;
    ctx.close_output(&stdout_artifact).await?;
    ctx.close_output(&stderr_artifact).await?;

    let outcome = outcome_of(exit, &stderr_tail);
    let step_result = match &outcome {
        Outcome::Completed { exit_code } => StepResult::Completed {
            output: serde_json::json!({ "exit_code": exit_code }),
        },
        Outcome::Failed { error, .. } => StepResult::Failed {
            error: error.clone(),
        },
        Outcome::Interrupted | Outcome::Retry { .. } => unreachable!("handled above"),
    };
    ctx.finish_step(&step, step_result).await?;
    Ok(outcome)
}

fn spawn(argv: &[String], spec: &RunSpec) -> std::io::Result<Child> {
    Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(&spec.workspace)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

async fn wait<C: RunContext>(ctx: &C, child: &mut Child, timeout: Option<Duration>) -> Exit {
    let deadline = timeout.map(|limit| (Instant::now() + limit, limit));
    let timer = async {
        match deadline {
            Some((at, limit)) => {
                tokio::time::sleep_until(at).await;
                limit
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Exit::Status(status),
            // wait() only fails if the child was already reaped; treat it as killed.
            Err(_) => Exit::Interrupted,
        },
        limit = timer => Exit::TimedOut(limit),
        _ = ctx.cancellation().cancelled() => Exit::Interrupted,
    }
}

fn kill_group(group: Option<Pid>) {
    if let Some(group) = group {
        // ESRCH (the group is already gone) is the expected case after a clean exit.
        let _ = killpg(group, Signal::SIGKILL);
    }
}

fn outcome_of(exit: Exit, stderr_tail: &str) -> Outcome {
    match exit {
        Exit::Status(status) if status.success() => Outcome::Completed { exit_code: Some(0) },
        Exit::Status(status) => {
            let exit_code = status.code();
            let cause = match exit_code {
                Some(code) => format!("exited with code {code}"),
                None => "was killed by a signal".to_string(),
            };
            let error = if stderr_tail.is_empty() {
                format!("process {cause}")
            } else {
                format!("process {cause}: {stderr_tail}")
            };
            Outcome::Failed { exit_code, error }
        }
        Exit::TimedOut(limit) => Outcome::Failed {
            exit_code: None,
            error: format!("timed out after {} ms", limit.as_millis()),
        },
        Exit::Interrupted => unreachable!("interrupted attempts have no outcome"),
    }
}

/// Copies a pipe into an artifact in batches; returns the stream's tail as text. After a
/// failed write it keeps draining the pipe (so the child never blocks on a full pipe) and
/// reports the first failure at the end.
async fn pump<C: RunContext>(
    ctx: &C,
    artifact: &ArtifactHandle,
    mut reader: impl AsyncRead + Unpin,
) -> Result<String, ContextError> {
    let mut pending = Vec::new();
    let mut tail = Vec::new();
    let mut failure = None;
    let mut buf = vec![0u8; 16 * 1024];
    let mut flush_at: Option<Instant> = None;
    loop {
        let read = match flush_at {
            Some(at) => match tokio::time::timeout_at(at, reader.read(&mut buf)).await {
                Ok(read) => read,
                Err(_) => {
                    flush(ctx, artifact, &mut pending, &mut failure).await;
                    flush_at = None;
                    continue;
                }
            },
            None => reader.read(&mut buf).await,
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        keep_tail(&mut tail, &buf[..n]);
        flush_at.get_or_insert_with(|| Instant::now() + FLUSH_INTERVAL);
        if pending.len() >= FLUSH_BYTES {
            flush(ctx, artifact, &mut pending, &mut failure).await;
            flush_at = None;
        }
    }
    flush(ctx, artifact, &mut pending, &mut failure).await;
    match failure {
        Some(error) => Err(error),
        None => Ok(String::from_utf8_lossy(&tail).trim().to_string()),
    }
}

async fn flush<C: RunContext>(
    ctx: &C,
    artifact: &ArtifactHandle,
    pending: &mut Vec<u8>,
    failure: &mut Option<ContextError>,
) {
    if failure.is_none()
        && !pending.is_empty()
        && let Err(error) = ctx.append_output(artifact, pending).await
    {
        *failure = Some(error);
    }
    pending.clear();
}

fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8]) {
    tail.extend_from_slice(bytes);
    if tail.len() > STDERR_TAIL_BYTES {
        tail.drain(..tail.len() - STDERR_TAIL_BYTES);
    }
}

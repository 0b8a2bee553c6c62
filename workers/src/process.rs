//! Runs a child process in its own containment (see [`crate::sandbox`]) with a clean
//! environment, streams its stdout and stderr into artifacts while it runs, and kills
//! everything it started on cancellation, timeout or exit.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sandbox::{self, Containment, EgressSummary, InheritedSecret, Jail};
use crate::{
    ArtifactHandle, ContextError, Outcome, OutputStream, RunContext, RunSpec, SandboxPolicy,
    StepResult,
};

/// Output is flushed to the runtime at least this often while a process writes...
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// ...or as soon as this much is pending.
const FLUSH_BYTES: usize = 64 * 1024;
/// How much of stderr's end goes into a failed run's `last_error`.
const STDERR_TAIL_BYTES: usize = 2048;
/// How long the pipes are still read once the run's processes are gone: a pipe a stray
/// process holds open must not keep the run going.
pub(crate) const DRAIN: Duration = Duration::from_millis(500);

/// How the process ended; None from [`wait`] when the attempt was interrupted instead.
pub(crate) enum Exit {
    Status(std::process::ExitStatus),
    TimedOut(Duration),
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

    ctx.clear_ahead().await?;
    let (mut child, mut containment) =
        match start(&argv, &spec.workspace, &spec.env, &spec.sandbox).await {
            Ok(started) => started,
            Err(error) => {
                // Nothing will be written to them: they end empty, not left writing.
                ctx.close_output(&stdout_artifact).await?;
                ctx.close_output(&stderr_artifact).await?;
                return fail(ctx, &step, error).await;
            }
        };
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let ended = CancellationToken::new();
    // Fired by the attempt's cancellation, or by a pump whose write was refused for good:
    // a run past its byte quota stops at once rather than run on into a void.
    let stop = ctx.cancellation().child_token();
    let waited = wait_and_end(&mut child, &mut containment, spec.timeout, &stop, &ended);
    let (exit, stdout_result, stderr_result) = tokio::join!(
        waited,
        pump(ctx, &stdout_artifact, stdout, (&ended, &stop)),
        pump(ctx, &stderr_artifact, stderr, (&ended, &stop)),
    );
    if ctx.cancellation().is_cancelled() {
        return Err(ContextError::Interrupted);
    }
    stdout_result?;
    let stderr_tail = stderr_result?;
    // Only a refused write, reported just above, stops the process without a cancellation.
    let Some(exit) = exit else {
        return Err(ContextError::Interrupted);
    };
    ctx.close_output(&stdout_artifact).await?;
    ctx.close_output(&stderr_artifact).await?;

    let (step_result, outcome) = ending_of(exit, &stderr_tail, &containment);
    ctx.finish_step(&step, step_result).await?;
    record_egress(ctx, containment.egress()).await?;
    Ok(outcome)
}

/// Records what a run's processes sent and received through the egress proxy, and what it
/// refused, as an `egress` step; nothing when they never used it.
async fn record_egress<C: RunContext>(
    ctx: &C,
    egress: Option<&EgressSummary>,
) -> Result<(), ContextError> {
    let Some(summary) = egress.filter(|summary| !summary.is_empty()) else {
        return Ok(());
    };
    let step = ctx.start_step("egress", serde_json::json!({})).await?;
    let output = serde_json::to_value(summary).unwrap_or_default();
    ctx.finish_step(&step, StepResult::Completed { output })
        .await
}

fn cannot_start(argv: &[String], error: std::io::Error) -> String {
    format!("could not start {}: {error}", argv[0])
}

/// Ends a run's step as failed with `error`, and the run with it (a process that never
/// started, a file operation refused).
pub(crate) async fn fail<C: RunContext>(
    ctx: &C,
    step: &crate::StepHandle,
    error: String,
) -> Result<Outcome, ContextError> {
    ctx.finish_step(
        step,
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

/// Starts `argv` in the workspace inside a fresh containment and its jail (shell and git
/// runs, hooks, and the agent tools that run processes). The error is the message the
/// caller reports: the process never started, or the host cannot provide the sandbox.
/// Ending (or dropping) the containment kills everything the child started.
pub(crate) async fn start(
    argv: &[String],
    workspace: &Path,
    env: &[(String, String)],
    sandbox: &SandboxPolicy,
) -> Result<(Child, Containment), String> {
    start_with(argv, workspace, env, sandbox, Stdio::null(), None).await
}

/// [`start`], with the child's stdin from `stdin` (an MCP server reads its requests there)
/// and `secret` at its fd 3 (Keel's git reads a repository's credential there).
pub(crate) async fn start_with(
    argv: &[String],
    workspace: &Path,
    env: &[(String, String)],
    sandbox: &SandboxPolicy,
    stdin: Stdio,
    secret: Option<&InheritedSecret>,
) -> Result<(Child, Containment), String> {
    let mut containment = Containment::prepare().map_err(|e| cannot_start(argv, e))?;
    let extra = env.iter().cloned().chain([containment.marker()]);
    // Before the jail: its `.keel/` directories are handed over with the workspace.
    let env = sandbox::environment(workspace, extra)
        .await
        .map_err(|e| cannot_start(argv, e))?;
    let jail = Jail::prepare(sandbox, workspace).await?;
    let inputs = Inputs { stdin, secret };
    let child = spawn(argv, workspace, env, &containment, jail.as_ref(), inputs)
        .map_err(|e| cannot_start(argv, e))?;
    containment.started(child.id(), jail);
    Ok((child, containment))
}

/// What a child reads besides its workspace and environment.
struct Inputs<'a> {
    stdin: Stdio,
    /// At its fd 3.
    secret: Option<&'a InheritedSecret>,
}

/// Starts the child from the given environment alone, inside its jail (if any).
fn spawn(
    argv: &[String],
    workspace: &Path,
    env: Vec<(String, String)>,
    containment: &Containment,
    jail: Option<&Jail>,
    inputs: Inputs,
) -> std::io::Result<Child> {
    let argv = match jail {
        Some(jail) => jail.wrap(argv),
        None => argv.to_vec(),
    };
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .current_dir(workspace)
        .env_clear()
        .envs(env)
        .stdin(inputs.stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // The cgroup joins outermost, so the jail itself is already contained.
    containment.enter_on_spawn(&mut command);
    match (jail, inputs.secret) {
        (Some(jail), secret) => jail.apply(&mut command, secret)?,
        (None, Some(secret)) => sandbox::hand_over(&mut command, vec![secret.handed()?]),
        (None, None) => {}
    }
    command.spawn()
}

/// Waits for the child (see [`wait`]), then ends the containment and fires `ended`, which
/// tells the pipe readers to stop soon.
pub(crate) async fn wait_and_end(
    child: &mut Child,
    containment: &mut Containment,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    ended: &CancellationToken,
) -> Option<Exit> {
    let exit = wait(child, timeout, cancel).await;
    // Whatever the process left behind goes too: a background child would otherwise keep
    // the pipes open and outlive the run.
    containment.end().await;
    ended.cancel();
    exit
}

/// Waits for the child's exit, its timeout, or `cancel` (None).
async fn wait(
    child: &mut Child,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
) -> Option<Exit> {
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
        // wait() only fails if the child was already reaped; treat it as killed.
        status = child.wait() => status.ok().map(Exit::Status),
        limit = timer => Some(Exit::TimedOut(limit)),
        _ = cancel.cancelled() => None,
    }
}

/// The step's result and the attempt's outcome for a process that ended; a failure names
/// the limits that stopped the attempt's processes first.
fn ending_of(exit: Exit, stderr_tail: &str, containment: &Containment) -> (StepResult, Outcome) {
    let (exit_code, error) = match exit {
        Exit::Status(status) if status.success() => {
            let output = serde_json::json!({ "exit_code": 0 });
            let completed = Outcome::Completed { exit_code: Some(0) };
            return (StepResult::Completed { output }, completed);
        }
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
            (exit_code, error)
        }
        Exit::TimedOut(limit) => (None, format!("timed out after {} ms", limit.as_millis())),
    };
    let error = containment.blame_limits(error);
    let step = StepResult::Failed {
        error: error.clone(),
    };
    (step, Outcome::Failed { exit_code, error })
}

/// Copies a pipe into an artifact in batches; returns the stream's tail as text. It stops
/// at the end of the pipe, or [`DRAIN`] after `ended` fires. After a failed write it keeps
/// draining the pipe (so the child never blocks on a full pipe) and reports the first
/// failure at the end; a write refused for good also fires `stop`, which ends the process.
async fn pump<C: RunContext>(
    ctx: &C,
    artifact: &ArtifactHandle,
    mut reader: impl AsyncRead + Unpin,
    (ended, stop): (&CancellationToken, &CancellationToken),
) -> Result<String, ContextError> {
    let mut pending = Vec::new();
    let mut tail = Vec::new();
    let mut failure = None;
    let mut buf = vec![0u8; 16 * 1024];
    let mut flush_at: Option<Instant> = None;
    let drained = async {
        ended.cancelled().await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::pin!(drained);
    loop {
        let flush_due = async {
            match flush_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let read = tokio::select! {
            read = reader.read(&mut buf) => read,
            _ = flush_due => {
                flush(ctx, artifact, &mut pending, &mut failure, stop).await;
                flush_at = None;
                continue;
            }
            _ = &mut drained => break,
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        keep_tail(&mut tail, &buf[..n]);
        flush_at.get_or_insert_with(|| Instant::now() + FLUSH_INTERVAL);
        if pending.len() >= FLUSH_BYTES {
            flush(ctx, artifact, &mut pending, &mut failure, stop).await;
            flush_at = None;
        }
    }
    flush(ctx, artifact, &mut pending, &mut failure, stop).await;
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
    stop: &CancellationToken,
) {
    if failure.is_none()
        && !pending.is_empty()
        && let Err(error) = ctx.append_output(artifact, pending).await
    {
        if matches!(error, ContextError::Refused(_)) {
            stop.cancel();
        }
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

/// Reads a pipe to its end (or [`DRAIN`] after `ended`), keeping the first `cap`
/// bytes, as text with a truncation marker when it kept less than it read.
pub(crate) async fn collect(
    mut reader: impl AsyncRead + Unpin,
    cap: usize,
    ended: &CancellationToken,
) -> String {
    let mut kept = Vec::new();
    let mut total = 0usize;
    let mut buf = vec![0u8; 16 * 1024];
    let drained = async {
        ended.cancelled().await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::pin!(drained);
    loop {
        let n = tokio::select! {
            read = reader.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = &mut drained => break,
        };
        total += n;
        let room = cap.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&buf[..room]);
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if total > kept.len() {
        text.push_str(&truncation_marker(total));
        text.push('\n');
    }
    text
}

/// What a bounded output says in place of what it left out.
pub(crate) fn truncation_marker(total: usize) -> String {
    format!("[… truncated: {} bytes total]", thousands(total as u64))
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

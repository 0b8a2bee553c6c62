//! Executor tests against an in-memory context (the second implementation of the trait).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;

#[derive(Default)]
struct Recorder {
    cancel: CancellationToken,
    steps: Mutex<Vec<(String, Option<StepResult>)>>,
    outputs: Mutex<HashMap<String, Vec<u8>>>,
    closed: Mutex<Vec<String>>,
}

impl RunContext for Recorder {
    fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        Ok(())
    }

    async fn start_step(
        &self,
        name: &str,
        _input: serde_json::Value,
    ) -> Result<StepHandle, ContextError> {
        let mut steps = self.steps.lock().unwrap();
        steps.push((name.to_string(), None));
        Ok(StepHandle((steps.len() - 1).to_string()))
    }

    async fn finish_step(&self, step: &StepHandle, result: StepResult) -> Result<(), ContextError> {
        let index: usize = step.0.parse().unwrap();
        self.steps.lock().unwrap()[index].1 = Some(result);
        Ok(())
    }

    async fn open_output(&self, stream: OutputStream) -> Result<ArtifactHandle, ContextError> {
        self.outputs
            .lock()
            .unwrap()
            .insert(stream.name().to_string(), Vec::new());
        Ok(ArtifactHandle(stream.name().to_string()))
    }

    async fn append_output(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        if self.cancel.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        self.outputs
            .lock()
            .unwrap()
            .get_mut(&artifact.0)
            .unwrap()
            .extend_from_slice(bytes);
        Ok(())
    }

    async fn close_output(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        self.closed.lock().unwrap().push(artifact.0.clone());
        Ok(())
    }
}

impl Recorder {
    fn output(&self, name: &str) -> String {
        String::from_utf8(self.outputs.lock().unwrap()[name].clone()).unwrap()
    }
}

fn spec(dir: &tempfile::TempDir, execution: Execution) -> RunSpec {
    RunSpec {
        execution,
        workspace: dir.path().to_path_buf(),
        timeout: None,
        env: vec![("KEEL_RUN_ID".into(), "run_x".into())],
        // A jail with network needs the keel binary as its shim: tests/it runs those.
        sandbox: SandboxPolicy {
            network: false,
            read_only: false,
            workspace_id: None,
        },
        checkpoint: None,
    }
}

fn shell(command: &str) -> Execution {
    Execution::Shell {
        command: command.to_string(),
    }
}

#[tokio::test]
async fn shell_captures_stdout_and_stderr_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let outcome = execute(
        &spec(
            &dir,
            shell("echo out; echo err >&2; pwd; echo $KEEL_RUN_ID"),
        ),
        &ctx,
    )
    .await;
    assert_eq!(outcome, Outcome::Completed { exit_code: Some(0) });
    let stdout = ctx.output("stdout");
    assert!(stdout.starts_with("out\n"), "{stdout}");
    assert!(stdout.contains(dir.path().file_name().unwrap().to_str().unwrap()));
    assert!(stdout.ends_with("run_x\n"), "{stdout}");
    assert_eq!(ctx.output("stderr"), "err\n");
    assert_eq!(ctx.closed.lock().unwrap().len(), 2);
    let steps = ctx.steps.lock().unwrap();
    assert_eq!(steps[0].0, "shell");
    assert!(matches!(steps[0].1, Some(StepResult::Completed { .. })));
}

/// A process that never starts leaves its output artifacts closed (empty), not writing.
#[tokio::test]
async fn a_process_that_never_starts_closes_its_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let mut gone = spec(&dir, shell("true"));
    gone.workspace = dir.path().join("missing/workspace");
    let outcome = execute(&gone, &ctx).await;
    assert!(
        matches!(
            outcome,
            Outcome::Failed {
                exit_code: None,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(ctx.closed.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn nonzero_exit_fails_with_code_and_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let outcome = execute(&spec(&dir, shell("echo boom >&2; exit 3")), &ctx).await;
    assert_eq!(
        outcome,
        Outcome::Failed {
            exit_code: Some(3),
            error: "process exited with code 3: boom".into()
        }
    );
}

#[tokio::test]
async fn large_output_is_captured_in_full() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let outcome = execute(&spec(&dir, shell("seq 1 100000")), &ctx).await;
    assert_eq!(outcome, Outcome::Completed { exit_code: Some(0) });
    let expected: String = (1..=100000).map(|n| format!("{n}\n")).collect();
    assert_eq!(ctx.output("stdout"), expected);
}

#[tokio::test]
async fn timeout_kills_the_process_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let mut spec = spec(&dir, shell("sleep 30"));
    spec.timeout = Some(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let outcome = execute(&spec, &ctx).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        outcome,
        Outcome::Failed {
            exit_code: None,
            error: "timed out after 200 ms".into()
        }
    );
}

#[tokio::test]
async fn cancellation_interrupts_and_kills_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("child.pid");
    let ctx = Recorder::default();
    // Written whole and then renamed: the cancel fires as soon as the file exists, and a
    // file the shell had opened but not yet written would read empty.
    let command = format!(
        "sleep 600 & echo $! > {0}.tmp && mv {0}.tmp {0}; wait",
        marker.display()
    );
    let spec = spec(&dir, shell(&command));
    let cancel = ctx.cancel.clone();
    let marker_for_cancel = marker.clone();
    // The run's pids are its own PID namespace's: the host finds its processes by the
    // home directory their environment names, which is this test's alone.
    let home = format!("HOME={}", dir.path().join(".keel/home").display());
    let found = tokio::spawn(async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !marker_for_cancel.exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let sleeping = processes_with(&home, "sleep");
        cancel.cancel();
        sleeping
    });
    let outcome = tokio::time::timeout(Duration::from_secs(20), execute(&spec, &ctx))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Interrupted);
    let sleeping = found.await.unwrap();
    assert!(!sleeping.is_empty(), "the background sleep was never seen");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sleeping.iter().any(|pid| is_running(*pid)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let survivors: Vec<_> = sleeping.iter().filter(|pid| is_running(**pid)).collect();
    assert!(
        survivors.is_empty(),
        "the background sleep {survivors:?} survived the cancellation"
    );
}

/// Host pids of the live processes running `program` whose environment holds `entry`.
fn processes_with(entry: &str, program: &str) -> Vec<i32> {
    let pids = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok());
    pids.filter(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        comm.trim() == program && environ.split(|b| *b == 0).any(|e| e == entry.as_bytes())
    })
    .collect()
}

/// Alive and not a zombie waiting to be reaped.
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn git_runs_git_with_split_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let outcome = execute(
        &spec(
            &dir,
            Execution::Git {
                command: "init -q 'my repo'".into(),
            },
        ),
        &ctx,
    )
    .await;
    assert_eq!(outcome, Outcome::Completed { exit_code: Some(0) });
    assert!(dir.path().join("my repo/.git").is_dir());
}

#[tokio::test]
async fn file_write_append_delete() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Recorder::default();
    let file = |operation, content: Option<&str>| Execution::File {
        path: "notes/a.txt".into(),
        content: content.map(str::to_string),
        operation,
    };
    let ok = Outcome::Completed { exit_code: None };
    assert_eq!(
        execute(&spec(&dir, file(FileOperation::Write, Some("one\n"))), &ctx).await,
        ok
    );
    assert_eq!(
        execute(
            &spec(&dir, file(FileOperation::Append, Some("two\n"))),
            &ctx
        )
        .await,
        ok
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        execute(&spec(&dir, file(FileOperation::Delete, None)), &ctx).await,
        ok
    );
    assert!(!dir.path().join("notes/a.txt").exists());
    let again = execute(&spec(&dir, file(FileOperation::Delete, None)), &ctx).await;
    assert!(matches!(again, Outcome::Failed { .. }), "{again:?}");
}

#[tokio::test]
async fn file_paths_cannot_escape_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
    let ctx = Recorder::default();
    for path in ["../x", "/etc/passwd", "a/../../x", "link/x", ""] {
        let execution = Execution::File {
            path: path.into(),
            content: Some("x".into()),
            operation: FileOperation::Write,
        };
        let outcome = execute(&spec(&dir, execution), &ctx).await;
        assert!(
            matches!(outcome, Outcome::Failed { .. }),
            "{path}: {outcome:?}"
        );
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn relative_path_validation() {
    assert!(validate_relative_path("a/b.txt").is_ok());
    assert!(validate_relative_path("./a").is_ok());
    for bad in ["", ".", "/a", "../a", "a/../../b", "a/.."] {
        assert!(validate_relative_path(bad).is_err(), "{bad}");
    }
}

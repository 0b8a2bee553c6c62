//! `keel runs …`: runs listed, shown, watched and cancelled, their logs, steps and
//! artifacts, the new runs made from a finished one (retry, resume, continue,
//! retry-from-model-call) and client-orchestrated runs (`api/tasks.rs`'s runs,
//! `api/admission.rs`, `api/lineage.rs`, `api/client_runs.rs`). `runs events` is in
//! `events`, `runs patches` in `patches`, as in `api/`.

use clap::{Args, Subcommand};
use keel_client::{
    Call, Client, ClientArtifact, ClientEvent, ClientFinish, ClientOutcome, ClientRunRequest,
    ClientStep, ContinueRequest, Error, ObjectEnvelope, RetryFromModelCallRequest,
    RunEventsRequest, RunRecord, StartRequest, StepRecord,
};

use crate::cli::artifacts;
use crate::cli::events;
use crate::cli::output;
use crate::cli::output::{Format, OrderArgs, PageArgs, Table, or_dash, time};
use crate::cli::patches;
use crate::cli::patches::PatchCommand;
use crate::cli::transcript;
use crate::cli::watch;
use crate::cli::watch::Outcome;

/// What to do with a new run (start, retry, resume).
#[derive(Debug, Clone, Copy, Args)]
pub(crate) struct AdmitArgs {
    /// Stream the run live until it ends; the exit code is the run's.
    #[arg(long)]
    watch: bool,
    /// With --watch: exit with 3 as soon as the run waits for an approval.
    #[arg(long, requires = "watch")]
    no_wait: bool,
    /// Print only the new run's id.
    #[arg(long, short, conflicts_with = "watch")]
    quiet: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunCommand {
    /// Lists runs, newest first: a task's, or with no task every task's in the workspace.
    List {
        task_id: Option<String>,
        /// Only runs in this status (`running`, `failed`, …).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        order: OrderArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        run_id: String,
    },
    /// Streams the run live: a line per step, approval prompts, its output lines. Exit
    /// code: 0 completed, 1 failed, 2 cancelled, 3 awaiting approval (with --no-wait).
    Watch {
        run_id: String,
        /// Exit with 3 as soon as the run waits for an approval.
        #[arg(long)]
        no_wait: bool,
        /// While the run is active, a line every this many seconds (1 to 300): its time,
        /// current step, model calls and cost.
        #[arg(long, default_value_t = watch::HEARTBEAT_S,
              value_parser = clap::value_parser!(u32).range(1..=300))]
        heartbeat: u32,
    },
    /// Prints the run's output so far (stdout, and stderr on stderr); an agent loop
    /// run's, its transcript.
    Logs {
        run_id: String,
    },
    /// An agent loop run's transcript: the prompt, each model call's text with its
    /// tokens, cost and time, each tool call with its arguments and result, the
    /// approvals and file changes, then the answer.
    Transcript {
        run_id: String,
    },
    /// The prompt layers an agent loop run started from (the runtime's, the workspace's,
    /// the task's system prompts) and the message it started from.
    Context {
        run_id: String,
    },
    /// The run's steps, in order.
    Steps {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One step of the run, with its input and output (`--output json`).
    Step {
        run_id: String,
        step_id: String,
    },
    /// The run's event log, in order, after `--cursor` (a sequence).
    Events {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One artifact of the run: its kind, type, size and status.
    Artifact {
        run_id: String,
        artifact_id: String,
    },
    /// The run's artifacts (its output, patches, answers), oldest first.
    Artifacts {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Cancels the run (a finished run is left as it is).
    Cancel {
        run_id: String,
    },
    /// A new run of the task in a fresh workspace.
    Retry {
        run_id: String,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// A new run in the finished run's workspace, from its checkpoint.
    Resume {
        run_id: String,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// An agent loop's next turn: a new run carrying the finished run's conversation on
    /// with `--prompt`.
    Continue {
        run_id: String,
        /// The next user turn.
        #[arg(long)]
        prompt: String,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// A new run of an agent loop that re-issues the finished run's model call N and goes
    /// on from there.
    RetryFromModelCall {
        run_id: String,
        /// The model call to re-issue, 1-based.
        #[arg(long)]
        model_call: i64,
        /// Why, for the run's `run.created` event.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// An agent run's file changes: list, show, revert, apply or discard a proposal.
    #[command(subcommand)]
    Patches(PatchCommand),
    /// Starts a run you carry out yourself (an editor, a script): it prints the lease
    /// token every `runs append` needs.
    ClientStart {
        task_id: String,
        /// How long the lease lasts without an append, 1000 to 600000 (default 60000).
        #[arg(long)]
        lease_ms: Option<u32>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Records your client-orchestrated run's events, steps and end; renews its lease.
    Append(AppendArgs),
}

#[derive(Debug, Args)]
pub(crate) struct AppendArgs {
    run_id: String,
    /// The lease token `runs client-start` printed.
    #[arg(long, env = "KEEL_LEASE_TOKEN", hide_env_values = true)]
    token: String,
    /// KIND or KIND=JSON-object, repeatable: a `client.event`.
    #[arg(long = "event", value_name = "KIND[=JSON]")]
    events: Vec<String>,
    /// NAME or NAME=JSON-object (its output), repeatable: a completed step.
    #[arg(long = "step", value_name = "NAME[=JSON]")]
    steps: Vec<String>,
    /// NAME=PATH, repeatable: a text artifact with the file's content.
    #[arg(long = "artifact", value_name = "NAME=PATH")]
    artifacts: Vec<String>,
    /// Ends the run: `completed` or `failed`.
    #[arg(long)]
    finish: Option<String>,
    /// Why it failed (with `--finish failed`).
    #[arg(long, requires = "finish")]
    error: Option<String>,
}

/// A call the API answers with a run.
type RunCall<'a> = Call<'a, ObjectEnvelope<RunRecord>>;

/// A new run (start, retry, resume): shown, its id alone, or streamed to its end.
pub(super) async fn admitted(
    client: &Client,
    format: Format,
    call: RunCall<'_>,
    args: AdmitArgs,
) -> Result<Outcome, Error> {
    if args.watch {
        let run = call.await?.data;
        return watch::run(client, format, &run, (args.no_wait, watch::HEARTBEAT_S)).await;
    }
    let id = |r: &ObjectEnvelope<RunRecord>| r.data.id.clone();
    output::show_or_id(format, args.quiet, call, id, |r| run_fields(&r.data)).await?;
    Ok(Outcome::Done)
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: RunCommand,
) -> Result<Outcome, Error> {
    match command {
        RunCommand::List {
            task_id,
            status,
            order,
            page,
        } => {
            let filter = (task_id.as_deref(), status.as_deref());
            list(client, format, filter, order, &page).await?
        }
        RunCommand::Show { run_id } => show_run(client, format, &run_id, Client::get_run).await?,
        RunCommand::Watch {
            run_id,
            no_wait,
            heartbeat,
        } => {
            let run = client.find_run(&run_id).await?.data;
            return watch::run(client, format, &run, (no_wait, heartbeat)).await;
        }
        RunCommand::Logs { run_id } => {
            let run = client.find_run(&run_id).await?.data;
            let task = client.get_task(&run.task_id).await?.data;
            if task.execution_kind == "agent_loop" {
                transcript(client, Format::Table, &run).await?;
            } else {
                watch::print_logs(client, &run).await?;
            }
        }
        RunCommand::Transcript { run_id } => {
            let run = client.find_run(&run_id).await?.data;
            transcript(client, format, &run).await?;
        }
        RunCommand::Context { run_id } => {
            let run = client.find_run(&run_id).await?.data;
            let call = client.get_run_context(&run.task_id, &run.id);
            output::show_lines(format, call, |c| transcript::context_lines(&c.data)).await?;
        }
        RunCommand::Steps { run_id, page } => steps(client, format, &run_id, &page).await?,
        RunCommand::Step { run_id, step_id } => step(client, format, &run_id, &step_id).await?,
        RunCommand::Events { run_id, page } => {
            events::of_run(client, format, &run_id, page).await?
        }
        RunCommand::Artifact {
            run_id,
            artifact_id,
        } => artifact(client, format, &run_id, &artifact_id).await?,
        RunCommand::Artifacts { run_id, page } => {
            let task_id = client.task_of("run", &run_id).await?;
            artifacts::list(format, &page, client.list_artifacts(&task_id, &run_id)).await?;
        }
        RunCommand::Cancel { run_id } => {
            show_run(client, format, &run_id, Client::cancel_run).await?
        }
        RunCommand::Retry { run_id, watch } => {
            return retry_or_resume(client, format, &run_id, watch, Client::retry_run).await;
        }
        RunCommand::Resume { run_id, watch } => {
            return retry_or_resume(client, format, &run_id, watch, Client::resume_run).await;
        }
        RunCommand::Continue {
            run_id,
            prompt,
            watch,
        } => {
            let request = ContinueRequest { prompt };
            let operation = Client::continue_run;
            return carry_on(client, format, &run_id, &request, watch, operation).await;
        }
        RunCommand::RetryFromModelCall {
            run_id,
            model_call,
            reason,
            watch,
        } => {
            let request = RetryFromModelCallRequest {
                model_call_index: model_call,
                reason,
            };
            let operation = Client::retry_from_model_call;
            return carry_on(client, format, &run_id, &request, watch, operation).await;
        }
        RunCommand::Patches(command) => patches::run(client, format, command).await?,
        RunCommand::ClientStart {
            task_id,
            lease_ms,
            reason,
        } => client_start(client, format, &task_id, lease_ms, reason).await?,
        RunCommand::Append(args) => append(client, format, args).await?,
    }
    Ok(Outcome::Done)
}

async fn list(
    client: &Client,
    format: Format,
    (task_id, status): (Option<&str>, Option<&str>),
    order: OrderArgs,
    page: &PageArgs,
) -> Result<(), Error> {
    let call = match (task_id, status, order.oldest_first) {
        // A task alone, oldest first: its own list.
        (Some(task_id), None, true) => client.list_runs(task_id),
        _ => {
            // A task that does not exist is said to, not listed as having no runs.
            if let Some(task_id) = task_id {
                client.get_task(task_id).await?;
            }
            client
                .list_workspace_runs(status, task_id)
                .query("order", order.order())
        }
    };
    let headers = [
        "ID", "TASK", "NUMBER", "STATUS", "EXIT", "CREATED", "FINISHED",
    ];
    output::list(format, page, call, &headers, |r: &RunRecord| {
        vec![
            r.id.clone(),
            r.task_id.clone(),
            r.number.to_string(),
            r.status.to_string(),
            or_dash(r.exit_code),
            time(&r.created_at),
            or_dash(r.finished_at.as_ref().map(time)),
        ]
    })
    .await
}

async fn steps(
    client: &Client,
    format: Format,
    run_id: &str,
    page: &PageArgs,
) -> Result<(), Error> {
    let task_id = client.task_of("run", run_id).await?;
    let headers = [
        "ID", "INDEX", "NAME", "STATUS", "STARTED", "FINISHED", "ERROR",
    ];
    let call = client.list_steps(&task_id, run_id);
    output::list(format, page, call, &headers, |s: &StepRecord| {
        vec![
            s.id.clone(),
            s.index.to_string(),
            s.name.clone(),
            s.status.to_string(),
            time(&s.started_at),
            or_dash(s.finished_at.as_ref().map(time)),
            or_dash(s.error.as_ref()),
        ]
    })
    .await
}

async fn step(client: &Client, format: Format, run_id: &str, step_id: &str) -> Result<(), Error> {
    let task_id = client.task_of("run", run_id).await?;
    output::show(format, client.get_step(&task_id, run_id, step_id), |s| {
        let s = &s.data;
        Table::fields(&[
            ("id", s.id.clone()),
            ("index", s.index.to_string()),
            ("name", s.name.clone()),
            ("status", s.status.to_string()),
            ("input", s.input.to_string()),
            ("output", or_dash(s.output.as_ref())),
            ("error", or_dash(s.error.as_ref())),
            ("started", time(&s.started_at)),
            ("finished", or_dash(s.finished_at.as_ref().map(time))),
        ])
    })
    .await
    .map(drop)
}

async fn artifact(
    client: &Client,
    format: Format,
    run_id: &str,
    artifact_id: &str,
) -> Result<(), Error> {
    let task_id = client.task_of("run", run_id).await?;
    let call = client.get_artifact(&task_id, run_id, artifact_id);
    output::show(format, call, |a| {
        let a = &a.data;
        Table::fields(&[
            ("id", a.id.clone()),
            ("name", a.name.clone()),
            ("kind", a.kind.to_string()),
            ("type", a.content_type.clone()),
            ("bytes", a.size_bytes.to_string()),
            ("truncated", a.truncated.to_string()),
            ("status", a.status.to_string()),
            ("created", time(&a.created_at)),
        ])
    })
    .await
    .map(drop)
}

async fn transcript(client: &Client, format: Format, run: &RunRecord) -> Result<(), Error> {
    let call = client.get_transcript(&run.task_id, &run.id);
    output::show_lines(format, call, |t| transcript::lines(&t.data))
        .await
        .map(drop)
}

/// Shows the run as `operation` (one of the client's: a read or a cancel) answers.
async fn show_run(
    client: &Client,
    format: Format,
    run_id: &str,
    operation: for<'a> fn(&'a Client, &str, &str) -> RunCall<'a>,
) -> Result<(), Error> {
    let run = client.find_run(run_id).await?.data;
    let call = operation(client, &run.task_id, run_id);
    output::show(format, call, |r| run_fields(&r.data))
        .await
        .map(drop)
}

/// Retries or resumes the run (`operation`, one of the client's).
async fn retry_or_resume(
    client: &Client,
    format: Format,
    run_id: &str,
    watch: AdmitArgs,
    operation: for<'a> fn(&'a Client, &str, &str, &StartRequest) -> RunCall<'a>,
) -> Result<Outcome, Error> {
    let run = client.find_run(run_id).await?.data;
    let call = operation(client, &run.task_id, run_id, &StartRequest::default());
    admitted(client, format, call, watch).await
}

/// A new run that carries the agent loop's conversation on (`operation`, one of the
/// client's: continue or retry from a model call, with its request).
async fn carry_on<R>(
    client: &Client,
    format: Format,
    run_id: &str,
    request: &R,
    watch: AdmitArgs,
    operation: for<'a> fn(&'a Client, &str, &str, &R) -> RunCall<'a>,
) -> Result<Outcome, Error> {
    let task_id = client.task_of("run", run_id).await?;
    let call = operation(client, &task_id, run_id, request);
    admitted(client, format, call, watch).await
}

async fn client_start(
    client: &Client,
    format: Format,
    task_id: &str,
    lease_ms: Option<u32>,
    reason: Option<String>,
) -> Result<(), Error> {
    let request = ClientRunRequest { lease_ms, reason };
    output::show(format, client.start_client_run(task_id, &request), |c| {
        Table::fields(&[
            ("run", c.data.run.id.clone()),
            ("status", c.data.run.status.to_string()),
            ("lease token", c.data.lease_token.clone()),
            ("lease expires", time(&c.data.lease_expires_at)),
        ])
    })
    .await
    .map(drop)
}

async fn append(client: &Client, format: Format, args: AppendArgs) -> Result<(), Error> {
    let AppendArgs {
        run_id,
        token,
        events,
        steps,
        artifacts,
        finish,
        error,
    } = args;
    let run = client.find_run(&run_id).await?.data;
    let mut request = append_request(token, &events, &steps, finish.as_deref(), error)?;
    request.artifacts = artifacts
        .iter()
        .map(|a| text_artifact(a))
        .collect::<Result<_, _>>()?;
    let call = client.append_run_events(&run.task_id, &run_id, &request);
    output::show(format, call, |a| {
        Table::fields(&[
            ("run", a.data.run.id.clone()),
            ("status", a.data.run.status.to_string()),
            ("appended", a.data.appended.to_string()),
            (
                "lease expires",
                or_dash(a.data.lease_expires_at.as_ref().map(time)),
            ),
        ])
    })
    .await
    .map(drop)
}

fn run_fields(r: &RunRecord) -> Table {
    Table::fields(&[
        ("id", r.id.clone()),
        ("task", r.task_id.clone()),
        ("number", r.number.to_string()),
        ("status", r.status.to_string()),
        ("attempt", r.attempt.to_string()),
        ("exit code", or_dash(r.exit_code)),
        ("terminal code", or_dash(r.terminal_code)),
        ("error", or_dash(r.last_error.as_ref())),
        ("created", time(&r.created_at)),
        ("started", or_dash(r.started_at.as_ref().map(time))),
        ("finished", or_dash(r.finished_at.as_ref().map(time))),
    ])
    .with_text("answer", r.answer.as_deref())
}

/// An append's body from the command's options: `NAME[=JSON]` pairs become events and
/// completed steps.
fn append_request(
    lease_token: String,
    events: &[String],
    steps: &[String],
    finish: Option<&str>,
    error: Option<String>,
) -> Result<RunEventsRequest, Error> {
    let named = |option: &str, pair: &str| -> Result<(String, serde_json::Value), Error> {
        let (name, json) = pair.split_once('=').unwrap_or((pair, "{}"));
        let value = serde_json::from_str(json)
            .map_err(|e| Error::Usage(format!("{option} {pair}: not JSON: {e}")))?;
        Ok((name.to_string(), value))
    };
    let events = events
        .iter()
        .map(|pair| named("--event", pair).map(|(kind, data)| ClientEvent { kind, data }))
        .collect::<Result<_, _>>()?;
    let steps = steps
        .iter()
        .map(|pair| {
            named("--step", pair).map(|(name, output)| ClientStep {
                name,
                status: ClientOutcome::Completed,
                input: serde_json::json!({}),
                output: Some(output),
                error: None,
            })
        })
        .collect::<Result<_, _>>()?;
    let finish = match finish {
        None => None,
        Some("completed") => Some(ClientOutcome::Completed),
        Some("failed") => Some(ClientOutcome::Failed),
        Some(other) => {
            return Err(Error::Usage(format!(
                "--finish {other}: completed or failed"
            )));
        }
    };
    Ok(RunEventsRequest {
        lease_token,
        events,
        steps,
        artifacts: Vec::new(),
        finish: finish.map(|status| ClientFinish { status, error }),
    })
}

/// `NAME=PATH`: a text artifact with the file's content.
fn text_artifact(pair: &str) -> Result<ClientArtifact, Error> {
    let usage = |what: String| Error::Usage(format!("--artifact {pair}: {what}"));
    let (name, path) = pair
        .split_once('=')
        .ok_or_else(|| usage("expected NAME=PATH".into()))?;
    let text = std::fs::read_to_string(path).map_err(|e| usage(format!("cannot read it: {e}")))?;
    Ok(ClientArtifact {
        name: name.to_string(),
        content_type: None,
        text,
    })
}

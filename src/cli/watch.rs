//! Following a run or a media job live: a line per step with its elapsed time (a spinner
//! on a terminal, plain lines otherwise), approval prompts with the command that approves,
//! the run's output lines as they are written, and the exit code of the outcome. With
//! `--output json`, stdout carries the events alone instead: each one's object, one a line.
//!
//! Nothing is printed twice or lost across a reconnect: events resume by `Last-Event-ID`
//! (see `keel_client::sse`), and output is read from the byte offset already printed.

use std::io::{IsTerminal, Write};
use std::pin::pin;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_client::sse::{RECONNECT_FOR, RunItem};
use keel_client::{
    ApprovalStatus, Client, Error, EventRecord, MediaJobStatus, RunHeartbeat, RunRecord, RunStatus,
    cut_chars,
};

use crate::cli::output::{Format, call_figures, seconds, usd};

/// What a command ends with, as its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not a watch: the command did what it was asked.
    Done,
    Completed,
    Failed,
    Cancelled,
    /// The run waits for an approval (`--no-wait`).
    AwaitingApproval,
}

impl Outcome {
    pub(crate) fn code(self) -> u8 {
        match self {
            Outcome::Done | Outcome::Completed => 0,
            Outcome::Failed => 1,
            Outcome::Cancelled => 2,
            Outcome::AwaitingApproval => 3,
        }
    }
}

/// How often the output of a running run is read.
const LOG_POLL: Duration = Duration::from_millis(250);

/// Where progress goes: a spinner above which lines print, plain lines, or (`--output
/// json`) nowhere, the events' objects being all of stdout.
struct View {
    bar: Option<ProgressBar>,
    /// `--output json`: a program reads stdout line by line, so nothing else may be there.
    events: bool,
}

impl View {
    fn new(format: Format) -> View {
        let events = format == Format::Json;
        let bar = (!events && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
            let style = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .expect("a valid template");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        View { bar, events }
    }

    /// Plain text with no spinner, for `keel runs logs`.
    fn plain() -> View {
        View {
            bar: None,
            events: false,
        }
    }

    /// An event of the log, with `--output json`: its object as the API sent it, on one
    /// line, flushed so that a reader of a pipe sees it as it happens.
    fn event(&self, event: &EventRecord) {
        if !self.events {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        let line = serde_json::to_string(event).expect("an event serializes");
        // A closed pipe ends the output; the watch still ends with the run's exit code.
        let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
    }

    fn line(&self, text: &str) {
        if self.events {
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(text),
            None => println!("{text}"),
        }
    }

    fn error_line(&self, text: &str) {
        if self.events {
            return;
        }
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    /// What is going on now: the spinner's message (plain output has the lines only).
    fn status(&self, text: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(text);
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// One output artifact being followed: how much of it is printed.
struct Tail {
    artifact_id: String,
    to_stderr: bool,
    printed: u64,
    /// The bytes after the last newline, printed once the line is complete.
    partial: Vec<u8>,
}

/// A run's stdout and stderr, followed by byte offset.
struct Logs<'a> {
    run: &'a RunRecord,
    tails: Vec<Tail>,
}

impl<'a> Logs<'a> {
    fn new(run: &'a RunRecord) -> Self {
        Logs {
            run,
            tails: Vec::new(),
        }
    }

    /// Prints the complete lines written since the last read: one listing of the run's
    /// artifacts tells which output streams exist and which grew, and only those are read.
    /// A failed read leaves the offsets as they were, so the next one picks up from the
    /// same byte.
    async fn read(&mut self, client: &Client, view: &View) -> Result<(), Error> {
        // `--output json` prints events only: output that goes nowhere is not fetched.
        if view.events {
            return Ok(());
        }
        let (task_id, run_id) = (&self.run.task_id, &self.run.id);
        let artifacts = client
            .list_artifacts(task_id, run_id)
            .query("limit", Some(200))
            .await?
            .data;
        let outputs = artifacts
            .iter()
            .filter(|a| matches!(a.name.as_str(), "stdout" | "stderr"));
        for artifact in outputs {
            let tail = self.tail(&artifact.id, &artifact.name);
            if artifact.size_bytes.max(0) as u64 <= tail.printed {
                continue;
            }
            let call = client.artifact_content(task_id, run_id, &artifact.id);
            let bytes = call.tail(tail.printed).await?;
            tail.printed += bytes.len() as u64;
            tail.partial.extend_from_slice(&bytes);
            if let Some(end) = tail.partial.iter().rposition(|b| *b == b'\n') {
                let lines: Vec<u8> = tail.partial.drain(..=end).collect();
                for line in String::from_utf8_lossy(&lines[..end]).split('\n') {
                    emit(view, tail.to_stderr, line);
                }
            }
        }
        Ok(())
    }

    /// The tail of an output artifact, new at its first sight.
    fn tail(&mut self, artifact_id: &str, name: &str) -> &mut Tail {
        let index = match self.tails.iter().position(|t| t.artifact_id == artifact_id) {
            Some(index) => index,
            None => {
                self.tails.push(Tail {
                    artifact_id: artifact_id.to_string(),
                    to_stderr: name == "stderr",
                    printed: 0,
                    partial: Vec::new(),
                });
                self.tails.len() - 1
            }
        };
        &mut self.tails[index]
    }

    /// The last read once the run has ended (retried while the API is unreachable), and
    /// any last line without a newline.
    async fn finish(&mut self, client: &Client, view: &View) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + RECONNECT_FOR;
        loop {
            match self.read(client, view).await {
                Ok(()) => break,
                Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(LOG_POLL).await;
                }
                Err(error) => return Err(error),
            }
        }
        for tail in &mut self.tails {
            if !tail.partial.is_empty() {
                let rest = std::mem::take(&mut tail.partial);
                emit(view, tail.to_stderr, &String::from_utf8_lossy(&rest));
            }
        }
        Ok(())
    }
}

fn emit(view: &View, to_stderr: bool, line: &str) {
    if to_stderr {
        view.error_line(line);
    } else {
        view.line(line);
    }
}

/// What the run's events have told so far.
#[derive(Default)]
struct Progress {
    started_at: Option<DateTime<Utc>>,
    /// When each step started, by index.
    steps: Vec<(i64, DateTime<Utc>)>,
    outcome: Option<Outcome>,
    /// Live model text not yet printed (up to its next newline).
    model_text: String,
    /// Whether the current model call's text came live (a replay has none: its text is
    /// printed from the call's step instead).
    streamed: bool,
}

/// How often a watch prints how an active run is doing (`runs watch --heartbeat`).
pub(crate) const HEARTBEAT_S: u32 = 10;

/// Streams `run` until it ends (or, with `no_wait`, until it waits for an approval), with a
/// heartbeat line every `heartbeat_s` seconds while it is active.
pub async fn run(
    client: &Client,
    format: Format,
    run: &RunRecord,
    (no_wait, heartbeat_s): (bool, u32),
) -> Result<Outcome, Error> {
    let view = View::new(format);
    let outcome = follow(client, run, (no_wait, heartbeat_s), &view).await;
    view.done();
    outcome
}

async fn follow(
    client: &Client,
    run: &RunRecord,
    (no_wait, heartbeat_s): (bool, u32),
    view: &View,
) -> Result<Outcome, Error> {
    view.line(&format!(
        "run {} (task {}, #{}): {}",
        run.id, run.task_id, run.number, run.status
    ));
    view.status(format!("run {}", run.status));
    let mut logs = Logs::new(run);
    let mut progress = Progress::default();
    let stream = client.watch_run_events(&run.task_id, &run.id, None, heartbeat_s);
    let mut events = pin!(stream);
    let mut poll = tokio::time::interval(LOG_POLL);
    loop {
        tokio::select! {
            item = events.next() => match item {
                // The stream ends only after the run's terminal event.
                None => break,
                Some(Err(error)) => return Err(error),
                Some(Ok(RunItem::Delta(delta))) => model_text(view, &mut progress, &delta.text),
                Some(Ok(RunItem::Heartbeat(beat))) => view.line(&heartbeat_line(&beat)),
                Some(Ok(RunItem::Event(event))) => {
                    view.event(&event);
                    let waits = on_event(client, view, &mut logs, &mut progress, &event).await?;
                    if waits && no_wait {
                        logs.finish(client, view).await?;
                        return Ok(Outcome::AwaitingApproval);
                    }
                }
            },
            _ = poll.tick() => {
                // The API may be down for a moment: the next tick reads from the same offset.
                let _ = logs.read(client, view).await;
            }
        }
    }
    // The terminal event printed the last of the output (`on_event`).
    progress.outcome.ok_or_else(|| Error::Decode {
        url: format!("the stream of run {}", run.id),
        message: "it ended before the run did".into(),
    })
}

/// Prints what an event says; true when it is an approval the run now waits for.
async fn on_event(
    client: &Client,
    view: &View,
    logs: &mut Logs<'_>,
    progress: &mut Progress,
    event: &EventRecord,
) -> Result<bool, Error> {
    let data = &event.data;
    let at = event.occurred_at;
    match event.event_type.as_str() {
        "run.started" => {
            progress.started_at = Some(at);
            view.line(&format!("run started (attempt {})", data["attempt"]));
            view.status("running".into());
        }
        "step.started" => {
            let index = data["index"].as_i64().unwrap_or_default();
            progress.steps.push((index, at));
            view.status(format!("step {index} {}", step_name(data)));
        }
        "step.finished" | "step.failed" => {
            // The step's output first, where it belongs (a failed read is retried later).
            let _ = logs.read(client, view).await;
            if !progress.streamed {
                answered_text(view, data);
            }
            view.line(step_line(progress, event).trim_end());
            tool_call_lines(view, data, &logs.run.id);
        }
        "model.call.completed" => {
            flush_model_text(view, progress);
            progress.streamed = false;
            view.status(format!("model call {} done", data["model_call_index"]));
        }
        "approval.requested" => {
            let approval_id = text(data, "approval_id");
            return approval_requested(client, view, logs.run, &approval_id).await;
        }
        "approval.resolved" => {
            let by = text(data, "resolved_by");
            view.line(&format!(
                "approval {} {} by {by}",
                text(data, "approval_id"),
                text(data, "decision")
            ));
        }
        "run.finished" | "run.failed" | "run.cancelled" => {
            logs.finish(client, view).await?;
            flush_model_text(view, progress);
            let outcome = match event.event_type.as_str() {
                "run.finished" => Outcome::Completed,
                "run.failed" => Outcome::Failed,
                _ => Outcome::Cancelled,
            };
            progress.outcome = Some(outcome);
            view.line(&run_ended_line(progress, event, outcome));
        }
        _ => {}
    }
    Ok(false)
}

/// A string field of an event's data; absent or not a string reads as empty.
fn text(data: &serde_json::Value, key: &str) -> String {
    data[key].as_str().unwrap_or_default().to_string()
}

/// How the run is doing: `… 42.0s, step 5 tool_call shell_exec (running), 3 model calls,
/// $0.0123 of $1.0000`.
fn heartbeat_line(beat: &RunHeartbeat) -> String {
    let elapsed = beat.elapsed_ms.map_or("queued".into(), |ms| {
        seconds(chrono::TimeDelta::milliseconds(ms))
    });
    let step = beat.step.as_ref().map(|step| {
        let tool = step
            .tool
            .as_deref()
            .map(|t| format!(" {t}"))
            .unwrap_or_default();
        format!(
            ", step {} {}{tool} ({})",
            step.index, step.name, step.status
        )
    });
    let budget = beat.budget_micros_usd.map(|b| format!(" of {}", usd(b)));
    format!(
        "… {elapsed}{}, {} model calls, {}{}",
        step.unwrap_or_default(),
        beat.model_calls,
        usd(beat.cost_micros_usd),
        budget.unwrap_or_default()
    )
}

/// A step event's step: its name, and the tool a tool call called.
fn step_name(data: &serde_json::Value) -> String {
    let name = text(data, "name");
    match data["tool"].as_str() {
        Some(tool) => format!("{name} {tool}"),
        None => name,
    }
}

/// A finished or failed step, timed from its start event (when the watch saw it); may end
/// in spaces when the step's time is unknown.
fn step_line(progress: &Progress, event: &EventRecord) -> String {
    let data = &event.data;
    let index = data["index"].as_i64().unwrap_or_default();
    let began = progress
        .steps
        .iter()
        .find(|(i, _)| *i == index)
        .map(|(_, t)| *t);
    // The step's own times where the event carries them: a model call's step is written
    // whole once the call answered, its start and end events together.
    let time = |key: &str| serde_json::from_value::<DateTime<Utc>>(data[key].clone()).ok();
    let elapsed = match (time("started_at"), time("finished_at")) {
        (Some(start), Some(end)) => seconds(end - start),
        _ => began
            .map(|b| seconds(event.occurred_at - b))
            .unwrap_or_default(),
    };
    let (name, status) = (step_name(data), text(data, "status"));
    let mut line = format!("step {index} {name} {status} {elapsed}");
    if let Some(figures) = model_call_figures(&data["output"]) {
        line.push_str(&format!(" · {figures}"));
    }
    if let Some(error) = data["error"].as_str() {
        line.push_str(&format!(": {error}"));
    }
    line
}

/// A model call step's tokens and cost (`100 in, 20 out · $0.0004`, the cost `unknown`
/// when its model has no price); None for other steps.
fn model_call_figures(output: &serde_json::Value) -> Option<String> {
    let usage = output.pointer("/response/usage")?;
    let (prompt, completion) = (
        usage["prompt_tokens"].as_i64(),
        usage["completion_tokens"].as_i64(),
    );
    Some(call_figures(
        prompt,
        completion,
        output["cost_micros_usd"].as_i64(),
    ))
}

/// The most lines of a tool call's result the watch prints, and characters of each.
const RESULT_LINES: usize = 3;
const LINE_CHARS: usize = 160;

/// Under a tool call's step: the arguments it was called with and the start of its result.
fn tool_call_lines(view: &View, data: &serde_json::Value, run_id: &str) {
    if let Some(arguments) = data["arguments"].as_str() {
        view.line(&format!("    args: {}", cut_chars(arguments, LINE_CHARS).0));
    }
    let Some(result) = data
        .pointer("/output/result/content")
        .and_then(|c| c.as_str())
    else {
        return;
    };
    let lines: Vec<&str> = result.lines().collect();
    for (n, line) in lines.iter().take(RESULT_LINES).enumerate() {
        let label = if n == 0 { "result:" } else { "       " };
        view.line(&format!("    {label} {}", cut_chars(line, LINE_CHARS).0));
    }
    if lines.len() > RESULT_LINES {
        let more = lines.len() - RESULT_LINES;
        let hint = format!("keel runs transcript {run_id}");
        view.line(&format!("            … {more} more lines ({hint})"));
    }
}

/// Prints the approval asked for, and for a pending one the commands that resolve it; true
/// when the run waits for it now.
async fn approval_requested(
    client: &Client,
    view: &View,
    run: &RunRecord,
    approval_id: &str,
) -> Result<bool, Error> {
    let approval = client.get_approval(&run.task_id, approval_id).await?.data;
    view.line(&format!(
        "approval {approval_id} ({}) requested:",
        approval.kind
    ));
    for action in &approval.action_summary {
        view.line(&format!("    {action}"));
    }
    // Replayed history holds requests resolved since: only a pending one waits.
    if approval.status != ApprovalStatus::Pending {
        return Ok(false);
    }
    view.line(&format!(
        "  approve: {}",
        command(client, "approve", approval_id)
    ));
    view.line(&format!(
        "  reject:  {}",
        command(client, "reject", approval_id)
    ));
    let status = client.get_run(&run.task_id, &run.id).await?.data.status;
    Ok(status == RunStatus::AwaitingApproval)
}

/// The run's last line: how it ended, how long it took since the watch saw it start, and
/// who cancelled it or what it exited with.
fn run_ended_line(progress: &Progress, event: &EventRecord, outcome: Outcome) -> String {
    let data = &event.data;
    let elapsed = progress
        .started_at
        .map(|s| format!(" in {}", seconds(event.occurred_at - s)));
    let detail = match (outcome, data["exit_code"].as_i64()) {
        (Outcome::Cancelled, _) => format!(" by {}", text(data, "actor")),
        (_, Some(code)) => format!(" (exit code {code})"),
        // An agent run has no process of its own to exit.
        (_, None) => String::new(),
    };
    let error = data["error"]
        .as_str()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    let status = &event.event_type.as_str()["run.".len()..];
    format!("run {status}{}{detail}{error}", elapsed.unwrap_or_default())
}

/// The command line that resolves an approval against this same API.
fn command(client: &Client, decision: &str, approval_id: &str) -> String {
    let url = client.base_url();
    if url == keel_client::DEFAULT_URL {
        format!("keel approvals {decision} {approval_id}")
    } else {
        format!("keel --url {url} approvals {decision} {approval_id}")
    }
}

fn model_text(view: &View, progress: &mut Progress, text: &str) {
    progress.streamed = true;
    progress.model_text.push_str(text);
    if let Some(end) = progress.model_text.rfind('\n') {
        let lines: String = progress.model_text.drain(..=end).collect();
        model_lines(view, &lines);
    }
}

/// The model's text, a `model:` line for each of its lines.
fn model_lines(view: &View, text: &str) {
    for line in text.trim_end_matches('\n').split('\n') {
        view.line(&format!("model: {line}"));
    }
}

/// The text a model call's step recorded (`output.response.message.content`), a line at a
/// time; nothing for other steps.
fn answered_text(view: &View, data: &serde_json::Value) {
    let text = data.pointer("/output/response/message/content");
    if let Some(text) = text.and_then(|t| t.as_str()).filter(|t| !t.is_empty()) {
        model_lines(view, text);
    }
}

fn flush_model_text(view: &View, progress: &mut Progress) {
    if !progress.model_text.is_empty() {
        let rest = std::mem::take(&mut progress.model_text);
        model_lines(view, &rest);
    }
}

/// `keel runs logs`: the run's output so far, stdout to stdout and stderr to stderr.
pub(crate) async fn print_logs(client: &Client, run: &RunRecord) -> Result<(), Error> {
    let view = View::plain();
    Logs::new(run).finish(client, &view).await
}

/// How long the replay of a job that had already ended may take to reach its end event
/// (it comes at once: the bound only keeps a job whose end has no event from hanging).
const ENDED_REPLAY: Duration = Duration::from_secs(10);

/// Follows a media job until it ends: its progress events, then its artifacts. The feed
/// replays the job's events from its first, so a job that ended before the watch began
/// (a fast vendor) still shows every event, as one still running does.
pub(crate) async fn media(
    client: &Client,
    format: Format,
    media_job_id: &str,
    quiet: bool,
) -> Result<Outcome, Error> {
    let view = View::new(format);
    let outcome = |status: &MediaJobStatus| match status {
        MediaJobStatus::Succeeded => Some(Outcome::Completed),
        MediaJobStatus::Failed => Some(Outcome::Failed),
        MediaJobStatus::Cancelled => Some(Outcome::Cancelled),
        _ => None,
    };
    let job = client.get_media_job(media_job_id).await?.data;
    let already = outcome(&job.status);
    let mut ended = None;
    let mut events = pin!(client.stream_feed(Some(media_job_id), None));
    while ended.is_none() {
        let next = match already {
            Some(_) => tokio::time::timeout(ENDED_REPLAY, events.next())
                .await
                .unwrap_or(None),
            None => events.next().await,
        };
        let Some(event) = next else {
            break;
        };
        let event = event?;
        let status = event.event_type.as_str().trim_start_matches("media_job.");
        if !quiet {
            view.event(&event);
            let detail = event
                .data
                .get("progress")
                .map(|p| format!(" {p}"))
                .unwrap_or_default();
            view.line(&format!(
                "{} {status}{detail}",
                event.occurred_at.format("%H:%M:%S")
            ));
        }
        view.status(format!("media job {media_job_id}: {status}"));
        ended = MediaJobStatus::parse(status).and_then(|s| outcome(&s));
    }
    view.done();
    let job = client.get_media_job(media_job_id).await?.data;
    if !quiet {
        let error = job
            .last_error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        view.line(&format!("media job {} {}{error}", job.id, job.status));
        for artifact in &job.artifact_ids {
            view.line(&format!("  artifact {artifact}"));
        }
    }
    Ok(ended.or(already).unwrap_or(Outcome::Failed))
}

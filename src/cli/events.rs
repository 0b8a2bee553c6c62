//! `keel events list` and `keel runs events`: the workspace's feed and a run's event log
//! (`api/events.rs`).

use clap::Subcommand;
use keel_client::{Call, Client, Error, EventRecord};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum EventCommand {
    /// Lists the feed's events after `--cursor` (an event's `cursor`).
    List {
        /// Comma-separated event types (`run.finished,run.failed`).
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        media_job: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: EventCommand,
) -> Result<(), Error> {
    let EventCommand::List {
        event_type,
        task,
        media_job,
        page,
    } = command;
    let (after, page) = cursor_given(page);
    let call = client
        .list_feed(after.as_deref())
        .query("event_type", event_type)
        .query("task_id", task)
        .query("media_job_id", media_job);
    list(format, &page, call).await
}

/// `keel runs events`: a run's log, whose cursor is an event's sequence.
pub(super) async fn of_run(
    client: &Client,
    format: Format,
    run_id: &str,
    page: PageArgs,
) -> Result<(), Error> {
    let task_id = client.task_of("run", run_id).await?;
    let (after, page) = cursor_given(page);
    let after = after
        .map(|a| a.parse::<i64>())
        .transpose()
        .map_err(|_| Error::Usage("--cursor must be an event's sequence".into()))?;
    list(
        format,
        &page,
        client.list_run_events(&task_id, run_id, after),
    )
    .await
}

/// A list whose cursor goes back in a parameter of its own (`after_sequence`, `after`):
/// `--cursor` is taken out of the page, for the caller to give the call.
fn cursor_given(mut page: PageArgs) -> (Option<String>, PageArgs) {
    (page.cursor.take(), page)
}

/// A list of events: a run's log or the workspace's feed.
async fn list(
    format: Format,
    page: &PageArgs,
    call: Call<'_, keel_client::ListEnvelope<EventRecord>>,
) -> Result<(), Error> {
    let headers = [
        "SEQUENCE",
        "TYPE",
        "AT",
        "RUN",
        "MEDIA JOB",
        "CURSOR",
        "DATA",
    ];
    output::list(format, page, call, &headers, |e: &EventRecord| {
        vec![
            e.sequence.to_string(),
            e.event_type.to_string(),
            time(&e.occurred_at),
            or_dash(e.run_id.as_ref()),
            or_dash(e.media_job_id.as_ref()),
            e.cursor.clone(),
            e.data.to_string(),
        ]
    })
    .await
}

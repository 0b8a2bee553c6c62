//! `keel media …`: media jobs created and run, listed, shown, watched and cancelled, and
//! their artifacts (`api/media_jobs.rs`).

use clap::Subcommand;
use keel_client::{Call, Client, Error, MediaJobDraft, MediaJobRecord, ObjectEnvelope};

use crate::cli::artifacts;
use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};
use crate::cli::watch;
use crate::cli::watch::Outcome;

#[derive(Debug, Subcommand)]
pub(crate) enum MediaCommand {
    /// Creates a media job and runs it (sends it to a worker).
    Create {
        /// The provider preset (`api: media-job`).
        #[arg(long)]
        provider: String,
        /// `image_generate`, `image_edit` or `video_generate`.
        #[arg(long, default_value = "image_generate")]
        operation: String,
        #[arg(long)]
        prompt: String,
        /// Vendor options as a JSON object (`{"size":"1024x1024"}`).
        #[arg(long, default_value = "{}")]
        input: String,
        /// Print only the new job's id.
        #[arg(long, short)]
        quiet: bool,
        /// Only create the job; `POST /v1/media-jobs/{id}/run` starts it later.
        #[arg(long, conflicts_with = "watch")]
        no_run: bool,
        /// Follow the job until it ends; the exit code is its outcome.
        #[arg(long)]
        watch: bool,
    },
    /// Lists the workspace's media jobs.
    List {
        /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
        #[arg(long)]
        status: Option<String>,
        /// Only this provider preset's.
        #[arg(long)]
        provider: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        media_job_id: String,
    },
    /// Follows the job until it ends: 0 succeeded, 1 failed, 2 cancelled.
    Watch {
        media_job_id: String,
    },
    /// The job's artifacts (the images or videos it made).
    Artifacts {
        media_job_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Writes an artifact's bytes to stdout (`> out.png`).
    Content {
        media_job_id: String,
        artifact_id: String,
    },
    /// Cancels the job (an ended job is left as it is).
    Cancel {
        media_job_id: String,
    },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: MediaCommand,
) -> Result<Outcome, Error> {
    let fields = |j: &ObjectEnvelope<MediaJobRecord>| media_fields(&j.data);
    match command {
        MediaCommand::Create {
            provider,
            operation,
            prompt,
            input,
            quiet,
            no_run,
            watch,
        } => {
            let input = serde_json::from_str(&input)
                .map_err(|e| Error::Usage(format!("--input must be a JSON object: {e}")))?;
            let draft = MediaJobDraft {
                provider_id: provider,
                operation,
                prompt,
                input,
            };
            // What is printed is the last answer: the job as created, or as queued to run.
            let create = client.create_media_job(&draft);
            let job = if no_run {
                print_job(format, quiet, create).await?
            } else {
                let id = create.await?.data.id;
                print_job(format, quiet, client.run_media_job(&id)).await?
            };
            if watch {
                return watch::media(client, format, &job.id, quiet).await;
            }
        }
        MediaCommand::Show { media_job_id } => {
            output::show(format, client.get_media_job(&media_job_id), fields).await?;
        }
        MediaCommand::Watch { media_job_id } => {
            return watch::media(client, format, &media_job_id, false).await;
        }
        MediaCommand::Content {
            media_job_id,
            artifact_id,
        } => content(client, &media_job_id, &artifact_id).await?,
        MediaCommand::Artifacts { media_job_id, page } => {
            artifacts::list(format, &page, client.list_media_artifacts(&media_job_id)).await?;
        }
        MediaCommand::List {
            status,
            provider,
            page,
        } => list(client, format, status, provider, &page).await?,
        MediaCommand::Cancel { media_job_id } => {
            output::show(format, client.cancel_media_job(&media_job_id), fields).await?;
        }
    }
    Ok(Outcome::Done)
}

async fn list(
    client: &Client,
    format: Format,
    status: Option<String>,
    provider: Option<String>,
    page: &PageArgs,
) -> Result<(), Error> {
    let headers = ["ID", "PROVIDER", "OPERATION", "STATUS", "CREATED"];
    let call = client.list_media_jobs(status.as_deref(), provider.as_deref());
    output::list(format, page, call, &headers, |j: &MediaJobRecord| {
        vec![
            j.id.clone(),
            j.provider_id.clone(),
            j.operation.clone(),
            j.status.to_string(),
            time(&j.created_at),
        ]
    })
    .await
}

/// `keel media content`: the artifact's bytes as they arrive, not held whole in memory.
async fn content(client: &Client, media_job_id: &str, artifact_id: &str) -> Result<(), Error> {
    use futures_util::TryStreamExt;
    use std::io::Write;
    let call = client.media_artifact_content(media_job_id, artifact_id);
    let mut chunks = std::pin::pin!(call.bytes_stream().await?);
    let mut stdout = std::io::stdout().lock();
    while let Some(chunk) = chunks.try_next().await? {
        stdout
            .write_all(&chunk)
            .map_err(|e| Error::Usage(format!("writing stdout: {e}")))?;
    }
    stdout
        .flush()
        .map_err(|e| Error::Usage(format!("writing stdout: {e}")))
}

/// A media job answer: its id alone with `quiet`, else shown.
async fn print_job(
    format: Format,
    quiet: bool,
    call: Call<'_, ObjectEnvelope<MediaJobRecord>>,
) -> Result<MediaJobRecord, Error> {
    let id = |j: &ObjectEnvelope<MediaJobRecord>| j.data.id.clone();
    let job = output::show_or_id(format, quiet, call, id, |j| media_fields(&j.data)).await?;
    Ok(job.data)
}

fn media_fields(j: &MediaJobRecord) -> Table {
    Table::fields(&[
        ("id", j.id.clone()),
        ("provider", j.provider_id.clone()),
        ("operation", j.operation.clone()),
        ("status", j.status.to_string()),
        ("attempt", j.attempt.to_string()),
        ("error", or_dash(j.last_error.as_ref())),
        ("artifacts", j.artifact_ids.join(", ")),
        ("created", time(&j.created_at)),
    ])
}

//! `keel runs patches …`: a run's file changes, listed and shown, reverted, applied or
//! discarded (`api/patches.rs`).

use clap::Subcommand;
use keel_client::{Call, Client, Error, ObjectEnvelope, PatchDetail, PatchSummary};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum PatchCommand {
    /// Lists the run's patches, oldest first.
    List {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Shows a patch (`--output json`: with the file's content before and after).
    Show { run_id: String, patch_id: String },
    /// Puts the file back as it was before the patch.
    Revert { run_id: String, patch_id: String },
    /// Writes a proposed patch into its file (if the file is still as it was proposed over).
    Apply { run_id: String, patch_id: String },
    /// Drops a proposed patch; its file is never touched.
    Discard { run_id: String, patch_id: String },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: PatchCommand,
) -> Result<(), Error> {
    let fields = |p: &ObjectEnvelope<PatchDetail>| patch_fields(&p.data.summary);
    match command {
        PatchCommand::List { run_id, page } => {
            let task_id = client.task_of("run", &run_id).await?;
            let headers = ["ID", "STATUS", "BEFORE", "AFTER", "CREATED", "PATH"];
            let call = client.list_patches(&task_id, &run_id);
            output::list(format, &page, call, &headers, |p: &PatchSummary| {
                vec![
                    p.id.clone(),
                    p.status.clone(),
                    or_dash(p.before_bytes),
                    or_dash(p.after_bytes),
                    time(&p.created_at),
                    p.path.clone(),
                ]
            })
            .await
        }
        PatchCommand::Show { run_id, patch_id } => {
            let task_id = client.task_of("run", &run_id).await?;
            let call = client.get_patch(&task_id, &run_id, &patch_id);
            output::show(format, call, fields).await.map(drop)
        }
        PatchCommand::Revert { run_id, patch_id } => {
            change_patch(client, format, (run_id, patch_id), Client::revert_patch).await
        }
        PatchCommand::Apply { run_id, patch_id } => {
            change_patch(client, format, (run_id, patch_id), Client::apply_patch).await
        }
        PatchCommand::Discard { run_id, patch_id } => {
            change_patch(client, format, (run_id, patch_id), Client::discard_patch).await
        }
    }
}

/// Reverts, applies or discards a patch (`operation`, one of the client's).
async fn change_patch(
    client: &Client,
    format: Format,
    (run_id, patch_id): (String, String),
    operation: for<'a> fn(&'a Client, &str, &str, &str) -> Call<'a, ObjectEnvelope<PatchDetail>>,
) -> Result<(), Error> {
    let task_id = client.task_of("run", &run_id).await?;
    let call = operation(client, &task_id, &run_id, &patch_id);
    let fields = |p: &ObjectEnvelope<PatchDetail>| patch_fields(&p.data.summary);
    output::show(format, call, fields).await.map(drop)
}

fn patch_fields(p: &PatchSummary) -> Table {
    Table::fields(&[
        ("id", p.id.clone()),
        ("name", p.name.clone()),
        ("path", p.path.clone()),
        ("status", p.status.clone()),
        ("bytes before", or_dash(p.before_bytes)),
        ("bytes after", or_dash(p.after_bytes)),
        ("created", time(&p.created_at)),
    ])
}

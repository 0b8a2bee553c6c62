//! `keel external-work`: sources (a tracker target and its WORKFLOW.md), their polls, and
//! the items they found, as calls of the typed client.

use clap::Subcommand;
use keel_client::{Client, Error, ItemRecord, PollRequest, SourceRecord, SourceRequest};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum ExternalCommand {
    /// Sources: list, show, create, poll, delete.
    #[command(subcommand)]
    Sources(SourceCommand),
    /// A source's items.
    #[command(subcommand)]
    Items(ItemCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum SourceCommand {
    /// Lists sources, oldest first.
    List {
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        source_id: String,
    },
    /// Registers a source from a WORKFLOW.md (the existing one when its target is
    /// registered already).
    Create {
        /// The WORKFLOW.md to send (its text is kept on the source).
        #[arg(long, group = "workflow", required = true)]
        file: Option<std::path::PathBuf>,
        /// An absolute path the server reads at each use instead (local mode only).
        #[arg(long, group = "workflow")]
        path: Option<String>,
        /// Print only the source's id.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Polls the source now and prints what the poll did.
    Poll {
        source_id: String,
        /// Items read per list, 1 to 100.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Deletes the source, its items and its background polling; its tasks stay.
    Delete {
        source_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ItemCommand {
    /// Lists a source's items, oldest first.
    List {
        source_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Shows an item: where its import stands, and its task and run.
    Show { item_id: String },
}

pub async fn run(client: &Client, format: Format, command: ExternalCommand) -> Result<(), Error> {
    match command {
        ExternalCommand::Sources(command) => sources(client, format, command).await,
        ExternalCommand::Items(ItemCommand::List { source_id, page }) => {
            let headers = ["ID", "KIND", "IDENTIFIER", "STATE", "TASK", "TRACKER STATE"];
            output::list(
                format,
                &page,
                client.list_items(&source_id),
                &headers,
                |i: &ItemRecord| {
                    vec![
                        i.id.clone(),
                        i.kind.clone(),
                        i.identifier.clone(),
                        i.state.to_string(),
                        or_dash(i.task_id.as_ref()),
                        i.tracker_state.clone(),
                    ]
                },
            )
            .await
        }
        ExternalCommand::Items(ItemCommand::Show { item_id }) => {
            output::show(format, client.get_item(&item_id), |i| item_fields(&i.data))
                .await
                .map(drop)
        }
    }
}

fn item_fields(i: &ItemRecord) -> Table {
    Table::fields(&[
        ("id", i.id.clone()),
        ("source", i.source_id.clone()),
        ("kind", i.kind.clone()),
        ("identifier", i.identifier.clone()),
        ("state", i.state.to_string()),
        ("tracker state", i.tracker_state.clone()),
        ("task", or_dash(i.task_id.as_ref())),
        ("run", or_dash(i.run_id.as_ref())),
        ("last error", or_dash(i.last_error.as_ref())),
        ("updated", time(&i.updated_at)),
    ])
}

async fn sources(client: &Client, format: Format, command: SourceCommand) -> Result<(), Error> {
    match command {
        SourceCommand::List { page } => {
            let headers = ["ID", "TRACKER", "BACKGROUND", "LAST POLL", "TARGET"];
            output::list(
                format,
                &page,
                client.list_sources(),
                &headers,
                |s: &SourceRecord| {
                    vec![
                        s.id.clone(),
                        s.tracker_kind.clone(),
                        s.background_enabled.to_string(),
                        or_dash(s.last_poll_at.as_ref().map(time)),
                        s.target.clone(),
                    ]
                },
            )
            .await
        }
        SourceCommand::Show { source_id } => {
            output::show(format, client.get_source(&source_id), |s| {
                source_fields(&s.data)
            })
            .await
            .map(drop)
        }
        SourceCommand::Create { file, path, quiet } => {
            let workflow_markdown =
                match file {
                    Some(file) => Some(std::fs::read_to_string(&file).map_err(|e| {
                        Error::Usage(format!("cannot read {}: {e}", file.display()))
                    })?),
                    None => None,
                };
            let request = SourceRequest {
                workflow_markdown,
                workflow_path: path,
            };
            let call = client.create_source(&request);
            output::show_or_id(
                format,
                quiet,
                call,
                |s| s.data.id.clone(),
                |s| source_fields(&s.data),
            )
            .await
            .map(drop)
        }
        SourceCommand::Poll { source_id, limit } => {
            let call = client.poll_source(&source_id, &PollRequest { limit });
            output::show(format, call, |p| {
                let p = &p.data;
                Table::fields(&[
                    ("candidates", p.candidates.to_string()),
                    ("claimed", p.claimed.to_string()),
                    ("duplicates", p.duplicates.to_string()),
                    ("blocked", p.blocked.to_string()),
                    ("discovered", p.discovered.to_string()),
                    ("terminal", p.terminal.to_string()),
                    ("cancelled runs", p.cancelled_runs.to_string()),
                    ("not modified", p.not_modified.to_string()),
                    ("error", or_dash(p.error.as_ref())),
                ])
            })
            .await
            .map(drop)
        }
        SourceCommand::Delete { source_id } => {
            output::show(format, client.delete_source(&source_id), |d| {
                Table::fields(&[("deleted", d.id.clone())])
            })
            .await
            .map(drop)
        }
    }
}

fn source_fields(s: &SourceRecord) -> Table {
    Table::fields(&[
        ("id", s.id.clone()),
        ("tracker", s.tracker_kind.clone()),
        ("target", s.target.clone()),
        ("workflow path", or_dash(s.workflow_path.as_ref())),
        ("background", s.background_enabled.to_string()),
        ("last poll", or_dash(s.last_poll_at.as_ref().map(time))),
        ("last error", or_dash(s.last_error.as_ref())),
    ])
}

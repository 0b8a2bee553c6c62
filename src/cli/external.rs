//! `keel external-work`: sources (a tracker target and its WORKFLOW.md), their polls, and
//! the items they found, as calls of the typed client.

use clap::Subcommand;
use keel_client::{
    ActionKind, ActionListFilter, ActionRecord, ActionRequest, ActionStatus, BackgroundRequest,
    CancelActionRequest, Client, Error, ImportRequest, ItemKind, ItemListFilter, ItemRecord,
    ItemState, ObjectEnvelope, PollRequest, PollSummary, SourceRecord, SourceRequest, SourceStatus,
};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum ExternalCommand {
    /// Sources: list, show, create, poll, delete.
    #[command(subcommand)]
    Sources(SourceCommand),
    /// Items: list (a source's, or across sources by state and kind), show.
    #[command(subcommand)]
    Items(ItemCommand),
    /// Imports one issue or pull request (or a webhook payload holding one) into a source,
    /// as a poll would have found it.
    Import {
        #[arg(long)]
        source: String,
        /// A file with the JSON payload (`-`: stdin).
        #[arg(long)]
        payload: std::path::PathBuf,
    },
    /// Tracker actions proposed on items (a comment, labels, a review, a pull request):
    /// propose, list, show; once approved, execute (or cancel).
    #[command(subcommand)]
    Actions(ActionCommand),
    /// CI triage of pull request items: triage, scan, list, show, run (a record's fix).
    #[command(subcommand)]
    Ci(crate::cli::triage::TriageCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ActionCommand {
    /// Proposes an action on the item; it is sent once approved and executed.
    Propose {
        item_id: String,
        /// `comment` (`--body`), `labels` (`--add`, `--remove`), `review` (`--event`,
        /// `--body`) or `pull_request` (`--title`, `--body`, `--head`, `--base`).
        #[arg(long)]
        kind: String,
        #[arg(long)]
        body: Option<String>,
        /// A label to add; repeat for several.
        #[arg(long)]
        add: Vec<String>,
        /// A label to remove; repeat for several.
        #[arg(long)]
        remove: Vec<String>,
        /// A review's `COMMENT`, `APPROVE` or `REQUEST_CHANGES`.
        #[arg(long)]
        event: Option<String>,
        /// A pull request's title (default: the item's).
        #[arg(long)]
        title: Option<String>,
        /// A pull request's branch (default: the task's push_branch).
        #[arg(long)]
        head: Option<String>,
        /// The branch a pull request merges into (default: the task's base_branch).
        #[arg(long)]
        base: Option<String>,
        /// The run of the item's task proposing it (default: its current run).
        #[arg(long)]
        run: Option<String>,
    },
    /// Lists an item's actions, or the workspace's by status, kind and source; oldest
    /// first.
    List {
        /// Only this item's actions (the other filters then do not apply).
        item_id: Option<String>,
        /// `approved` lists those waiting for their execute.
        #[arg(long)]
        status: Option<ActionStatus>,
        #[arg(long)]
        kind: Option<ActionKind>,
        #[arg(long)]
        source: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        action_id: String,
    },
    /// Sends an approved action: the tracker is asked for its target again, and a changed
    /// one is refused (stale_target).
    Execute {
        action_id: String,
    },
    /// Cancels a pending or approved action; nothing is sent.
    Cancel {
        action_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
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
    /// The source's health: its workflow, secret, items and actions by state, background
    /// polling and last errors.
    Status {
        source_id: String,
    },
    /// Turns the source's background polling on or off.
    Background {
        source_id: String,
        /// `true` or `false`.
        #[arg(long, action = clap::ArgAction::Set)]
        enabled: bool,
    },
    /// Reconciles the source's items with the tracker now and prints what it did.
    Reconcile {
        source_id: String,
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
    /// Lists a source's items, or the workspace's by state and kind; oldest first.
    List {
        /// Only this source's items.
        source_id: Option<String>,
        #[arg(long)]
        state: Option<ItemState>,
        #[arg(long)]
        kind: Option<ItemKind>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Shows an item: where its import stands, and its task and run.
    Show { item_id: String },
}

pub async fn run(client: &Client, format: Format, command: ExternalCommand) -> Result<(), Error> {
    match command {
        ExternalCommand::Sources(command) => sources(client, format, command).await,
        ExternalCommand::Items(ItemCommand::List {
            source_id,
            state,
            kind,
            page,
        }) => {
            let headers = ["ID", "KIND", "IDENTIFIER", "STATE", "TASK", "TRACKER STATE"];
            let call = match (source_id, state, kind) {
                (Some(source_id), None, None) => client.list_items(&source_id),
                (source_id, state, kind) => client.list_work_items(&ItemListFilter {
                    source_id,
                    state,
                    kind,
                }),
            };
            output::list(format, &page, call, &headers, |i: &ItemRecord| {
                vec![
                    i.id.clone(),
                    i.kind.clone(),
                    i.identifier.clone(),
                    i.state.to_string(),
                    or_dash(i.task_id.as_ref()),
                    i.tracker_state.clone(),
                ]
            })
            .await
        }
        ExternalCommand::Items(ItemCommand::Show { item_id }) => {
            output::show(format, client.get_item(&item_id), |i| item_fields(&i.data))
                .await
                .map(drop)
        }
        ExternalCommand::Import { source, payload } => {
            let text = if payload.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(&payload)
            }
            .map_err(|e| Error::Usage(format!("cannot read {}: {e}", payload.display())))?;
            let payload = serde_json::from_str(&text)
                .map_err(|e| Error::Usage(format!("--payload must hold JSON: {e}")))?;
            let request = ImportRequest {
                source_id: source,
                payload,
            };
            output::show(format, client.import(&request), |i| {
                let i = &i.data;
                let mut table = item_fields(&i.item);
                table.row(vec!["duplicate".into(), i.duplicate.to_string()]);
                let cancelled = or_dash(i.cancelled_run_id.as_ref());
                table.row(vec!["cancelled run".into(), cancelled]);
                table
            })
            .await
            .map(drop)
        }
        ExternalCommand::Actions(command) => actions(client, format, command).await,
        ExternalCommand::Ci(command) => crate::cli::triage::run(client, format, command).await,
    }
}

async fn actions(client: &Client, format: Format, command: ActionCommand) -> Result<(), Error> {
    match command {
        ActionCommand::Propose {
            item_id,
            kind,
            body,
            add,
            remove,
            event,
            title,
            head,
            base,
            run,
        } => {
            let request = ActionRequest {
                kind: Some(kind),
                body,
                add: (!add.is_empty()).then_some(add),
                remove: (!remove.is_empty()).then_some(remove),
                event,
                title,
                head,
                base,
                run_id: run,
            };
            output::show(format, client.propose_action(&item_id, &request), |p| {
                let mut table = action_fields(&p.data.action);
                table.row(vec!["approval".into(), p.data.approval.id.clone()]);
                table
            })
            .await
            .map(drop)
        }
        ActionCommand::List {
            item_id,
            status,
            kind,
            source,
            page,
        } => {
            let headers = ["ID", "KIND", "STATUS", "RUN", "APPROVAL", "CREATED"];
            let call = match (item_id, status, kind, source) {
                (Some(item_id), None, None, None) => client.list_item_actions(&item_id),
                (item_id, status, kind, source_id) => client.list_actions(&ActionListFilter {
                    status,
                    kind,
                    item_id,
                    source_id,
                }),
            };
            output::list(format, &page, call, &headers, |a: &ActionRecord| {
                vec![
                    a.id.clone(),
                    a.kind.clone(),
                    a.status.to_string(),
                    a.run_id.clone(),
                    or_dash(a.approval_id.as_ref()),
                    time(&a.created_at),
                ]
            })
            .await
        }
        ActionCommand::Show { action_id } => {
            output::show(format, client.get_action(&action_id), |a| {
                action_fields(&a.data)
            })
            .await
            .map(drop)
        }
        ActionCommand::Execute { action_id } => {
            output::show(format, client.execute_action(&action_id), |a| {
                action_fields(&a.data)
            })
            .await
            .map(drop)
        }
        ActionCommand::Cancel { action_id, reason } => {
            let request = CancelActionRequest { reason };
            output::show(format, client.cancel_action(&action_id, &request), |a| {
                action_fields(&a.data)
            })
            .await
            .map(drop)
        }
    }
}

fn action_fields(a: &ActionRecord) -> Table {
    Table::fields(&[
        ("id", a.id.clone()),
        ("item", a.item_id.clone()),
        ("kind", a.kind.clone()),
        ("status", a.status.to_string()),
        ("task", a.task_id.clone()),
        ("run", a.run_id.clone()),
        ("approval", or_dash(a.approval_id.as_ref())),
        ("proposal", a.proposal.to_string()),
        (
            "execute asked",
            a.execute_requested_at.as_ref().map_or("-".into(), time),
        ),
        ("cancel reason", or_dash(a.cancel_reason.as_ref())),
        ("last error", or_dash(a.last_error.as_ref())),
        ("created", time(&a.created_at)),
    ])
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
            create_source(client, format, file, path, quiet).await
        }
        SourceCommand::Poll { source_id, limit } => {
            let call = client.poll_source(&source_id, &PollRequest { limit });
            output::show(format, call, poll_fields).await.map(drop)
        }
        SourceCommand::Reconcile { source_id } => {
            let call = client.reconcile_source(&source_id);
            output::show(format, call, poll_fields).await.map(drop)
        }
        SourceCommand::Background { source_id, enabled } => {
            let call = client.set_background(&source_id, &BackgroundRequest { enabled });
            output::show(format, call, |s| source_fields(&s.data))
                .await
                .map(drop)
        }
        SourceCommand::Status { source_id } => {
            let call = client.source_status(&source_id);
            output::show(format, call, status_fields).await.map(drop)
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

/// Sends the WORKFLOW.md's text when given a file, or only the path the server reads itself.
async fn create_source(
    client: &Client,
    format: Format,
    file: Option<std::path::PathBuf>,
    path: Option<String>,
    quiet: bool,
) -> Result<(), Error> {
    let workflow_markdown = match file {
        Some(file) => Some(
            std::fs::read_to_string(&file)
                .map_err(|e| Error::Usage(format!("cannot read {}: {e}", file.display())))?,
        ),
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

/// A source's health, one field per line; its last errors, one per kind of work, come last.
fn status_fields(s: &ObjectEnvelope<SourceStatus>) -> Table {
    let s = &s.data;
    let counts = |m: &std::collections::BTreeMap<String, i64>| {
        let pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v}")).collect();
        pairs.join(", ")
    };
    let mut fields = vec![
        ("source".to_string(), s.source_id.clone()),
        ("workflow valid".into(), s.workflow.valid.to_string()),
        ("workflow path".into(), or_dash(s.workflow.path.as_ref())),
        (
            "secret configured".into(),
            or_dash(s.secret.as_ref().map(|secret| secret.configured)),
        ),
        ("items".into(), counts(&s.records)),
        ("actions".into(), counts(&s.actions)),
        ("background".into(), s.background.status.clone()),
        (
            "last poll".into(),
            or_dash(s.background.last_poll_at.as_ref().map(time)),
        ),
    ];
    for (what, error) in &s.last_errors {
        let message = error.message.as_deref().unwrap_or("");
        fields.push((
            format!("last {what} error"),
            format!("{} {message}", error.code),
        ));
    }
    Table::fields(&fields)
}

/// What a poll or a reconcile did.
fn poll_fields(p: &ObjectEnvelope<PollSummary>) -> Table {
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

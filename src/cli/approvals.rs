//! `keel approvals …`: approvals listed and shown, approved and rejected
//! (`api/approvals.rs`).

use clap::Subcommand;
use keel_client::{ApprovalRecord, Client, Error, ResolveRequest};

use crate::cli::output;
use crate::cli::output::{Format, OrderArgs, PageArgs, Table};

#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalCommand {
    /// Shows an approval: its kind, status and what it would allow.
    Show { approval_id: String },
    /// Lists approvals (across tasks, or one task's), newest first.
    List {
        /// `pending`, `approved`, `rejected`, `cancelled` or `expired`.
        #[arg(long)]
        status: Option<String>,
        /// Only this task's.
        #[arg(long)]
        task: Option<String>,
        /// Only this run's.
        #[arg(long, conflicts_with = "task")]
        run: Option<String>,
        #[command(flatten)]
        order: OrderArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Approves: the last gate approved queues the run.
    Approve {
        approval_id: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Rejects: the run is cancelled.
    Reject {
        approval_id: String,
        #[arg(long)]
        note: Option<String>,
        /// A tool-call approval only: the model reads a refusal and the run goes on.
        #[arg(long = "continue")]
        continue_run: bool,
    },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: ApprovalCommand,
) -> Result<(), Error> {
    let (approval_id, decision, note, continue_run) = match command {
        ApprovalCommand::List {
            status,
            task,
            run,
            order,
            page,
        } => {
            let headers = ["ID", "TASK", "RUN", "KIND", "STATUS", "ACTION"];
            let status = status.as_deref();
            let call = match (&task, &run) {
                (Some(task), _) => client.list_task_approvals(task, status),
                (None, Some(run)) => client.list_run_approvals(run, status),
                (None, None) => client.list_approvals(status),
            }
            .query("order", order.order());
            return output::list(format, &page, call, &headers, |a: &ApprovalRecord| {
                vec![
                    a.id.clone(),
                    a.task_id.clone(),
                    a.run_id.clone(),
                    a.kind.clone(),
                    a.status.to_string(),
                    a.action_summary.join("; "),
                ]
            })
            .await;
        }
        ApprovalCommand::Show { approval_id } => {
            let task_id = client.task_of("approval", &approval_id).await?;
            let call = client.get_approval(&task_id, &approval_id);
            return output::show(format, call, |a| {
                let a = &a.data;
                Table::fields(&[
                    ("id", a.id.clone()),
                    ("task", a.task_id.clone()),
                    ("run", a.run_id.clone()),
                    ("kind", a.kind.clone()),
                    ("status", a.status.to_string()),
                    ("action", a.action_summary.join("; ")),
                ])
            })
            .await
            .map(drop);
        }
        ApprovalCommand::Approve { approval_id, note } => (approval_id, "approve", note, false),
        ApprovalCommand::Reject {
            approval_id,
            note,
            continue_run,
        } => (approval_id, "reject", note, continue_run),
    };
    let task_id = client.task_of("approval", &approval_id).await?;
    let request = ResolveRequest {
        decision: Some(decision.into()),
        note,
        continue_on_reject: continue_run.then_some(true),
    };
    output::show(
        format,
        client.resolve_approval(&task_id, &approval_id, &request),
        |r| {
            let (approval, run) = (&r.data.approval, &r.data.run);
            Table::fields(&[
                ("approval", approval.id.clone()),
                ("status", approval.status.to_string()),
                ("run", run.id.clone()),
                ("run status", run.status.to_string()),
            ])
        },
    )
    .await?;
    Ok(())
}

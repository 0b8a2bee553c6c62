//! `keel schedules …`: the workspace's schedules, and a task's schedule shown, set and
//! deleted with the times it fired (`api/schedules.rs`).

use clap::Subcommand;
use keel_client::{Client, Error, ObjectEnvelope, OccurrenceRecord, ScheduleDraft, ScheduleRecord};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Lists the workspace's schedules.
    List {
        /// Only this task's.
        #[arg(long)]
        task: Option<String>,
        /// Only enabled (`true`) or paused (`false`) ones.
        #[arg(long)]
        enabled: Option<bool>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// The times the task's schedule fired, and what each did.
    Occurrences {
        task_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        task_id: String,
    },
    /// Creates or replaces the task's schedule: `--cron` or `--at`.
    Set {
        task_id: String,
        /// A five-field cron expression, read on `--timezone`'s wall clock.
        #[arg(long, conflicts_with = "at", required_unless_present = "at")]
        cron: Option<String>,
        /// Once, at this RFC 3339 time.
        #[arg(long)]
        at: Option<String>,
        /// The IANA zone the schedule is read in.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Saved paused.
        #[arg(long)]
        disabled: bool,
        /// The revision you read: the edit fails if the schedule changed since.
        #[arg(long)]
        revision: Option<i64>,
    },
    Delete {
        task_id: String,
    },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: ScheduleCommand,
) -> Result<(), Error> {
    let fields = |s: &ObjectEnvelope<ScheduleRecord>| schedule_fields(&s.data);
    match command {
        ScheduleCommand::List {
            task,
            enabled,
            page,
        } => {
            let headers = ["ID", "TASK", "KIND", "ENABLED", "NEXT RUN", "WHEN"];
            let call = client.list_schedules(task.as_deref(), enabled);
            output::list(format, &page, call, &headers, |s: &ScheduleRecord| {
                let when = s.cron_expression.clone();
                vec![
                    s.id.clone(),
                    s.task_id.clone(),
                    s.kind.clone(),
                    s.enabled.to_string(),
                    or_dash(s.next_run_at.as_ref().map(time)),
                    or_dash(when.or_else(|| s.run_at.as_ref().map(time))),
                ]
            })
            .await?;
        }
        ScheduleCommand::Occurrences { task_id, page } => {
            let headers = ["ID", "SCHEDULED FOR", "STATUS", "RUN", "ERROR"];
            let call = client.list_occurrences(&task_id);
            output::list(format, &page, call, &headers, |o: &OccurrenceRecord| {
                vec![
                    o.id.clone(),
                    time(&o.scheduled_for),
                    o.status.to_string(),
                    or_dash(o.run_id.as_ref()),
                    or_dash(o.error.as_ref()),
                ]
            })
            .await?;
        }
        ScheduleCommand::Show { task_id } => {
            output::show(format, client.get_schedule(&task_id), fields).await?;
        }
        ScheduleCommand::Set {
            task_id,
            cron,
            at,
            timezone,
            disabled,
            revision,
        } => {
            let draft = ScheduleDraft {
                kind: Some(if cron.is_some() { "cron" } else { "once" }.into()),
                timezone: Some(timezone),
                enabled: Some(!disabled),
                run_at: at,
                cron_expression: cron,
                revision,
            };
            output::show(format, client.put_schedule(&task_id, &draft), fields).await?;
        }
        ScheduleCommand::Delete { task_id } => {
            client.delete_schedule(&task_id).await?;
            if format == Format::Table {
                println!("deleted the schedule of {task_id}");
            }
        }
    }
    Ok(())
}

fn schedule_fields(s: &ScheduleRecord) -> Table {
    Table::fields(&[
        ("id", s.id.clone()),
        ("task", s.task_id.clone()),
        ("kind", s.kind.clone()),
        ("cron", or_dash(s.cron_expression.as_ref())),
        ("run at", or_dash(s.run_at.as_ref().map(time))),
        ("timezone", s.timezone.clone()),
        ("enabled", s.enabled.to_string()),
        ("next run", or_dash(s.next_run_at.as_ref().map(time))),
        ("revision", s.revision.to_string()),
    ])
}

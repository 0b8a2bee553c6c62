//! `keel external-work ci`: CI triage of pull request items: triage (waiting for the
//! worker's scan with a spinner, up to a timeout), the scan, the records, and a record's
//! fix run, as calls of the typed client.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use clap::Subcommand;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_client::{
    Client, Error, ObjectEnvelope, ScanStatus, TriageListFilter, TriageRecord, TriageRequest,
    TriageScan, TriageStatus,
};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};

/// How often a waited-for scan is read again.
const SCAN_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Subcommand)]
pub(crate) enum TriageCommand {
    /// Triages a pull request item's CI: a worker reads its head's failing checks and
    /// jobs (GET only) and records each once, with a fix task unless --no-task.
    Triage {
        item_id: String,
        /// The most failing checks to record, 1 to 20 (default 5).
        #[arg(long)]
        limit: Option<u32>,
        /// Record the failures without making fix tasks.
        #[arg(long)]
        no_task: bool,
        /// Wait for the scan to end, showing progress, and print what it did.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up waiting after this many seconds (the scan goes on).
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Shows a scan: queued, or done with its counts and records, or failed with why.
    Scan {
        scan_id: String,
    },
    /// Lists triage records, oldest first.
    List {
        #[arg(long)]
        item: Option<String>,
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        status: Option<TriageStatus>,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        triage_id: String,
    },
    /// Starts the record's fix run (or shows the one it started).
    Run {
        triage_id: String,
    },
}

pub(crate) async fn run(
    client: &Client,
    format: Format,
    command: TriageCommand,
) -> Result<(), Error> {
    match command {
        TriageCommand::Triage {
            item_id,
            limit,
            no_task,
            wait,
            timeout_secs,
        } => {
            let request = TriageRequest {
                limit,
                create_task: no_task.then_some(false),
            };
            let call = client.triage_item(&item_id, &request);
            if !wait {
                return output::show(format, call, |s| scan_fields(&s.data))
                    .await
                    .map(drop);
            }
            let scan = call.send().await?.data;
            let timeout = Duration::from_secs(timeout_secs);
            waited(client, format, &scan.id, timeout).await
        }
        TriageCommand::Scan { scan_id } => {
            output::show(format, client.get_triage_scan(&scan_id), |s| {
                scan_fields(&s.data)
            })
            .await
            .map(drop)
        }
        TriageCommand::List {
            item,
            source,
            status,
            page,
        } => {
            let filter = TriageListFilter {
                item_id: item,
                source_id: source,
                status,
            };
            let headers = ["ID", "STATUS", "CHECK", "HEAD", "TASK", "RUN"];
            output::list(
                format,
                &page,
                client.list_triage(&filter),
                &headers,
                |r: &TriageRecord| {
                    vec![
                        r.id.clone(),
                        r.status.to_string(),
                        r.check_name.clone(),
                        r.head_sha.chars().take(12).collect(),
                        or_dash(r.task_id.as_ref()),
                        or_dash(r.run_id.as_ref()),
                    ]
                },
            )
            .await
        }
        TriageCommand::Show { triage_id } => {
            output::show(format, client.get_triage(&triage_id), |r| {
                record_fields(&r.data)
            })
            .await
            .map(drop)
        }
        TriageCommand::Run { triage_id } => {
            output::show(format, client.start_fix_run(&triage_id), |f| {
                let mut table = record_fields(&f.data.triage);
                table.row(vec!["run status".into(), f.data.run.status.to_string()]);
                table
            })
            .await
            .map(drop)
        }
    }
}

/// Reads the scan until it ends or `timeout` passes, a spinner on a terminal's stderr
/// meanwhile; prints it as `scan` does.
async fn waited(
    client: &Client,
    format: Format,
    scan_id: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style =
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("a valid template");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(120));
        bar.set_message(format!("scan {scan_id}: a worker reads GitHub"));
        bar
    });
    let started = Instant::now();
    let ended = loop {
        let scan = client.get_triage_scan(scan_id).send().await?.data;
        if scan.status != ScanStatus::Queued {
            break true;
        }
        if started.elapsed() >= timeout {
            break false;
        }
        tokio::time::sleep(SCAN_POLL).await;
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if !ended {
        return Err(Error::Usage(format!(
            "scan {scan_id} is still queued after {} s; `keel external-work ci scan {scan_id}` \
             reads it later",
            timeout.as_secs()
        )));
    }
    let call = client.get_triage_scan(scan_id);
    output::show(format, call, |s: &ObjectEnvelope<TriageScan>| {
        scan_fields(&s.data)
    })
    .await
    .map(drop)
}

fn scan_fields(s: &TriageScan) -> Table {
    let count = |field: &str| {
        s.summary
            .as_ref()
            .and_then(|summary| summary[field].as_u64())
            .map_or("-".into(), |n| n.to_string())
    };
    let records = s
        .summary
        .as_ref()
        .and_then(|summary| summary["triage_ids"].as_array())
        .map_or("-".into(), |ids| {
            ids.iter()
                .filter_map(|id| id.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        });
    Table::fields(&[
        ("id", s.id.clone()),
        ("item", s.item_id.clone()),
        ("status", s.status.to_string()),
        ("triaged", count("triaged")),
        ("task created", count("task_created")),
        ("duplicates", count("duplicates")),
        ("blocked", count("blocked")),
        ("stale", count("stale")),
        ("failed", count("failed")),
        ("records", records),
        ("last error", or_dash(s.last_error.as_ref())),
        ("created", time(&s.created_at)),
    ])
}

fn record_fields(r: &TriageRecord) -> Table {
    Table::fields(&[
        ("id", r.id.clone()),
        ("item", r.item_id.clone()),
        ("status", r.status.to_string()),
        (
            "pull request",
            format!("{}#{}", r.repository, r.subject_number),
        ),
        ("head", r.head_sha.clone()),
        ("check", r.check_name.clone()),
        ("conclusion", or_dash(r.conclusion.as_ref())),
        ("details", or_dash(r.details_url.as_ref())),
        ("reason", or_dash(r.reason.as_ref())),
        ("task", or_dash(r.task_id.as_ref())),
        ("run", or_dash(r.run_id.as_ref())),
        ("evidence", or_dash(r.artifact_id.as_ref())),
        ("idempotency key", r.idempotency_key.clone()),
        ("created", time(&r.created_at)),
    ])
}

//! `keel status`, `keel throughput`, `keel transitions list` and `keel leases list`: the
//! queue and its workers, the audit trail and the queue's leases (`api/system.rs`).

use clap::Subcommand;
use keel_client::{Client, Error, LeaseRecord, TransitionRecord};

use crate::cli::output;
use crate::cli::output::{Format, OrderArgs, PageArgs, Table, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum TransitionCommand {
    /// Lists state changes, newest first: every entity's, or one's.
    List {
        /// `task`, `run`, `step`, `approval`, `media_job`, …
        #[arg(long)]
        entity_type: Option<String>,
        #[arg(long)]
        entity_id: Option<String>,
        #[command(flatten)]
        order: OrderArgs,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum LeaseCommand {
    /// Lists queue leases: `active` (the default), `expired` or `released`.
    List {
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

pub(super) async fn status(client: &Client, format: Format) -> Result<(), Error> {
    output::show(format, client.system_stats(), |stats| {
        let stats = &stats.data;
        let mut fields = vec![
            ("version".to_string(), stats.version.clone()),
            ("live workers".into(), stats.workers.live.to_string()),
            ("active leases".into(), stats.active_leases.to_string()),
        ];
        for kind in &stats.queue {
            let oldest = kind
                .oldest_age_ms
                .map(|ms| format!("{:.1}s", ms as f64 / 1000.0));
            let figures = format!(
                "depth {}, ready {}, leased {}, oldest ready {}",
                kind.depth,
                kind.ready,
                kind.leased,
                or_dash(oldest)
            );
            fields.push((format!("queue {}", kind.kind), figures));
        }
        Table::fields(&fields)
    })
    .await
    .map(drop)
}

pub(super) async fn throughput(
    client: &Client,
    format: Format,
    minutes: Option<i64>,
) -> Result<(), Error> {
    output::show(format, client.system_throughput(minutes), |t| {
        let mut table = Table::new(&["KIND", "COMPLETED", "FAILED"]);
        for kind in &t.data.kinds {
            let figures = [kind.completed, kind.failed].map(|n| n.to_string());
            table.row([vec![kind.kind.clone()], figures.to_vec()].concat());
        }
        table
    })
    .await
    .map(drop)
}

pub(super) async fn transitions(
    client: &Client,
    format: Format,
    command: TransitionCommand,
) -> Result<(), Error> {
    let TransitionCommand::List {
        entity_type,
        entity_id,
        order,
        page,
    } = command;
    let headers = [
        "ID", "TYPE", "ENTITY", "FROM", "TO", "ACTOR", "AT", "REASON",
    ];
    let call = client
        .state_transitions(entity_type.as_deref(), entity_id.as_deref())
        .query("order", order.order());
    output::list(format, &page, call, &headers, |t: &TransitionRecord| {
        vec![
            t.id.to_string(),
            t.entity_type.clone(),
            t.entity_id.clone(),
            or_dash(t.from_status.as_ref()),
            t.to_status.clone(),
            t.actor.clone(),
            time(&t.occurred_at),
            or_dash(t.reason.as_ref()),
        ]
    })
    .await
}

pub(super) async fn leases(
    client: &Client,
    format: Format,
    command: LeaseCommand,
) -> Result<(), Error> {
    let LeaseCommand::List { status, page } = command;
    let headers = [
        "JOB", "KIND", "REF", "STATUS", "OWNER", "CLAIMED", "OUTCOME",
    ];
    let call = client.runtime_leases(status.as_deref());
    output::list(format, &page, call, &headers, |l: &LeaseRecord| {
        vec![
            l.job_id.to_string(),
            l.kind.clone(),
            l.ref_id.clone(),
            l.status.clone(),
            l.owner.clone(),
            time(&l.claimed_at),
            or_dash(l.outcome.as_ref()),
        ]
    })
    .await
}

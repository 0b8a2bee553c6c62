//! `keel usage summary|events`: model usage totals and the model calls (`api/usage.rs`).

use clap::Subcommand;
use keel_client::{Client, Error, Grouping, UsageEvent};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, time};

#[derive(Debug, Subcommand)]
pub(crate) enum UsageCommand {
    /// Totals, and per provider preset or workspace with `--scope`.
    Summary {
        /// `global` (the default), `provider` or `workspace`.
        #[arg(long)]
        scope: Option<String>,
    },
    /// The model calls, newest first.
    Events {
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        run: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: UsageCommand,
) -> Result<(), Error> {
    match command {
        UsageCommand::Summary { scope } => {
            let scope = scope
                .map(|s| {
                    Grouping::parse(&s).ok_or_else(|| {
                        Error::Usage(format!("--scope is {}, not '{s}'", Grouping::names()))
                    })
                })
                .transpose()?;
            output::show(format, client.usage_summary(scope), |u| {
                let mut table = Table::new(&["KEY", "CALLS", "PROMPT", "COMPLETION", "COST µUSD"]);
                let rows = u.data.rows.iter().map(|r| (r.key.as_str(), &r.totals));
                for (key, t) in std::iter::once(("total", &u.data.totals)).chain(rows) {
                    table.row(vec![
                        key.to_string(),
                        t.calls.to_string(),
                        t.prompt_tokens.to_string(),
                        t.completion_tokens.to_string(),
                        t.cost_micros_usd.to_string(),
                    ]);
                }
                table
            })
            .await
            .map(drop)
        }
        UsageCommand::Events { task, run, page } => {
            let headers = [
                "ID",
                "RUN",
                "PROVIDER",
                "MODEL",
                "PROMPT",
                "COMPLETION",
                "AT",
            ];
            let call = client
                .usage_events()
                .query("task_id", task)
                .query("run_id", run);
            output::list(format, &page, call, &headers, |e: &UsageEvent| {
                vec![
                    e.id.clone(),
                    e.run_id.clone(),
                    e.provider.clone(),
                    e.model.clone(),
                    e.prompt_tokens.to_string(),
                    e.completion_tokens.to_string(),
                    time(&e.created_at),
                ]
            })
            .await
        }
    }
}

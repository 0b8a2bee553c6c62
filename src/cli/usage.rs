//! `keel usage summary|events`: model usage totals and the model calls (`api/usage.rs`).

use clap::Subcommand;
use keel_client::{Client, Error, Grouping, UsageEvent, UsageTotals};

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
                        cost_of(t),
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
                "COST µUSD",
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
                    e.cost_micros_usd.map_or(UNKNOWN.into(), |c| c.to_string()),
                    time(&e.created_at),
                ]
            })
            .await
        }
    }
}

/// What a cost is shown as when the model had no price: never 0, which would say free.
const UNKNOWN: &str = "unknown";

/// The totals' cost: the priced calls' sum, and how many calls had no price (all of them:
/// unknown).
fn cost_of(totals: &UsageTotals) -> String {
    match totals.calls_without_price {
        0 => totals.cost_micros_usd.to_string(),
        n if n == totals.calls => UNKNOWN.to_string(),
        n => format!("{} + {n} unpriced", totals.cost_micros_usd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_without_a_price_is_unknown_never_zero() {
        let totals = |calls, cost_micros_usd, calls_without_price| UsageTotals {
            calls,
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: 0,
            cost_micros_usd,
            calls_without_price,
        };
        assert_eq!(cost_of(&totals(2, 1600, 0)), "1600");
        assert_eq!(cost_of(&totals(3, 1600, 1)), "1600 + 1 unpriced");
        assert_eq!(cost_of(&totals(2, 0, 2)), "unknown");
        assert_eq!(cost_of(&totals(0, 0, 0)), "0");
    }
}

//! How the operator commands print: tables fit to the terminal's width, `--output json` as
//! the API sent it, and errors as the envelope's user message, action and request id.

use std::io::Write;

use keel_client::{Call, Error, ListEnvelope};
use serde::de::DeserializeOwned;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
}

/// Rows under headers; each cell one line.
pub(crate) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// Print the first column alone, without its header (`--quiet`).
    ids_only: bool,
    /// Free text printed whole under the table, after its heading: what one cell would cut
    /// to a line (an agent's answer).
    text: Option<(&'static str, String)>,
}

impl Table {
    pub(crate) fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
            ids_only: false,
            text: None,
        }
    }

    /// The table with `text` printed whole under it, headed `heading:`.
    pub(crate) fn with_text(mut self, heading: &'static str, text: Option<&str>) -> Table {
        self.text = text.map(|text| (heading, text.to_string()));
        self
    }

    /// A two-column table of a resource's fields.
    pub(crate) fn fields<K: AsRef<str>>(fields: &[(K, String)]) -> Table {
        let mut table = Table::new(&["FIELD", "VALUE"]);
        for (name, value) in fields {
            table.row(vec![name.as_ref().to_string(), value.clone()]);
        }
        table
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        // A cell is one line: newlines in commands or messages would break the columns.
        let cells = cells
            .into_iter()
            .map(|c| c.replace(['\n', '\r'], " "))
            .collect();
        self.rows.push(cells);
    }

    pub(crate) fn print(&self) {
        let mut stdout = std::io::stdout().lock();
        let lines = if self.ids_only {
            self.rows
                .iter()
                .filter_map(|r| r.first().cloned())
                .collect()
        } else {
            let mut lines = self.lines(terminal_width());
            if let Some((heading, text)) = &self.text {
                lines.extend(["".into(), format!("{heading}:")]);
                lines.extend(text.lines().map(str::to_string));
            }
            lines
        };
        for line in lines {
            // A closed pipe (`| head`) ends the output, not the command.
            if writeln!(stdout, "{}", line.trim_end()).is_err() {
                return;
            }
        }
    }

    /// The table's lines fit to `width`: the last column (free text: a command, a
    /// message, a value) is cut first, then the widest; cut cells end with `…`.
    fn lines(&self, width: Option<usize>) -> Vec<String> {
        use console::{measure_text_width, truncate_str};
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(measure_text_width(cell));
            }
        }
        if let Some(width) = width {
            const GAP: usize = 2;
            const NARROWEST: usize = 6;
            let total = |ws: &[usize]| ws.iter().sum::<usize>() + GAP * ws.len().saturating_sub(1);
            let last = widths.len() - 1;
            let over = total(&widths).saturating_sub(width);
            widths[last] = widths[last]
                .saturating_sub(over)
                .max(NARROWEST.min(widths[last]));
            while total(&widths) > width {
                let (widest, w) = widths
                    .iter()
                    .copied()
                    .enumerate()
                    .max_by_key(|(_, w)| *w)
                    .expect("a column");
                if w <= NARROWEST {
                    break;
                }
                widths[widest] = w - 1;
            }
        }
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        std::iter::once(&header)
            .chain(&self.rows)
            .map(|row| {
                row.iter()
                    .zip(&widths)
                    .map(|(cell, w)| {
                        let cell = truncate_str(cell, *w, "…");
                        let pad = w.saturating_sub(measure_text_width(&cell));
                        format!("{cell}{}", " ".repeat(pad))
                    })
                    .collect::<Vec<_>>()
                    .join("  ")
            })
            .collect()
    }
}

/// The terminal's width when stdout is one; None (no cutting) for a pipe or a file.
fn terminal_width() -> Option<usize> {
    console::Term::stdout()
        .size_checked()
        .map(|(_, columns)| columns as usize)
}

/// Prints one answer: its JSON as sent, or the table `render` makes of it.
pub(crate) async fn show<T: DeserializeOwned>(
    format: Format,
    call: Call<'_, T>,
    render: impl FnOnce(&T) -> Table,
) -> Result<T, Error> {
    present(format, call, |value| render(value).print()).await
}

/// Prints one answer: its JSON as sent, or the lines `render` makes of it (text that is
/// no table: a transcript).
pub(crate) async fn show_lines<T: DeserializeOwned>(
    format: Format,
    call: Call<'_, T>,
    render: impl FnOnce(&T) -> Vec<String>,
) -> Result<T, Error> {
    present(format, call, |value| {
        let mut stdout = std::io::stdout().lock();
        for line in render(value) {
            // A closed pipe (`| head`) ends the output, not the command.
            if writeln!(stdout, "{}", line.trim_end()).is_err() {
                return;
            }
        }
    })
    .await
}

/// The answer's JSON as sent, or `print` of it.
async fn present<T: DeserializeOwned>(
    format: Format,
    call: Call<'_, T>,
    print: impl FnOnce(&T),
) -> Result<T, Error> {
    match format {
        Format::Json => {
            let (value, raw) = call.fetch().await?;
            print_raw(&raw);
            Ok(value)
        }
        Format::Table => {
            let value = call.send().await?;
            print(&value);
            Ok(value)
        }
    }
}

/// Prints a new resource's id alone (`--quiet`, for `$(…)` in scripts), or the answer as
/// [`show`] does.
pub(crate) async fn show_or_id<T: DeserializeOwned>(
    format: Format,
    quiet: bool,
    call: Call<'_, T>,
    id: impl FnOnce(&T) -> String,
    render: impl FnOnce(&T) -> Table,
) -> Result<T, Error> {
    if !quiet {
        return show(format, call, render).await;
    }
    let value = call.send().await?;
    println!("{}", id(&value));
    Ok(value)
}

/// How much of a list to print.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PageArgs {
    /// Page size, 1 to 200.
    #[arg(long)]
    pub(crate) limit: Option<u32>,
    /// Start after this cursor (a page's `next_cursor`).
    #[arg(long)]
    pub(crate) cursor: Option<String>,
    /// Every page: a table of all rows, or with `--output json` one item per line.
    #[arg(long, conflicts_with = "cursor")]
    pub(crate) all: bool,
    /// Print only the ids (the first column), one a line.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// How a history list reads: newest first, unless asked otherwise.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct OrderArgs {
    /// Oldest first instead.
    #[arg(long)]
    pub(crate) oldest_first: bool,
}

impl OrderArgs {
    /// The list's `order` parameter: `desc` unless oldest first (the API's default).
    pub(crate) fn order(self) -> Option<&'static str> {
        (!self.oldest_first).then_some("desc")
    }
}

/// Prints a list: one page (as the API sent it, or a table with a hint to the next page),
/// or with `--all` every item of every page.
pub async fn list<T: DeserializeOwned + serde::Serialize + 'static>(
    format: Format,
    page: &PageArgs,
    call: Call<'_, ListEnvelope<T>>,
    headers: &[&'static str],
    row: impl Fn(&T) -> Vec<String>,
) -> Result<(), Error> {
    use futures_util::TryStreamExt;
    let call = call
        .query("limit", page.limit)
        .query("cursor", page.cursor.as_deref());
    let format = if page.quiet { Format::Table } else { format };
    let mut table = Table::new(headers);
    table.ids_only = page.quiet;
    if page.all {
        let mut items = std::pin::pin!(call.items());
        while let Some(item) = items.try_next().await? {
            match format {
                Format::Json => {
                    print_raw(serde_json::to_string(&item).expect("serializes").as_bytes())
                }
                Format::Table => table.row(row(&item)),
            }
        }
        if format == Format::Table {
            table.print();
        }
        return Ok(());
    }
    let page = show(format, call, |page| {
        for item in &page.data {
            table.row(row(item));
        }
        table
    })
    .await?;
    if let Some(cursor) = page
        .next_cursor
        .filter(|_| format == Format::Table && page.has_more)
    {
        eprintln!("more: --cursor {cursor} (or --all)");
    }
    Ok(())
}

/// Bytes as the API sent them, with a final newline.
pub(crate) fn print_raw(raw: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    let newline: &[u8] = if raw.ends_with(b"\n") { b"" } else { b"\n" };
    let _ = stdout
        .write_all(raw)
        .and_then(|_| stdout.write_all(newline));
}

/// An error in one or two lines: the envelope's user message and message with the
/// request id, then the operator action.
pub(crate) fn print_error(error: &Error) {
    match error.api() {
        Some(api) => {
            let body = &api.error;
            let request = body.request_id.as_deref().unwrap_or("none");
            eprintln!(
                "error: {} {} ({}, HTTP {}, request id {request})",
                body.user_message, body.message, body.kind, api.status
            );
            eprintln!("hint: {}", body.operator_action);
        }
        None => {
            eprintln!("error: {error}");
            if let Error::Transport { url, source } = error
                && source.is_connect()
            {
                eprintln!(
                    "hint: nothing answers at {url}: start Keel on this machine with \
                     `keel serve`, or point --url (KEEL_URL) at a running one"
                );
            }
        }
    }
}

/// Whether the tables show times in UTC (`--utc`) rather than in the local zone; set once,
/// before any is printed.
static UTC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

pub(crate) fn show_times_in_utc(utc: bool) {
    let _ = UTC.set(utc);
}

/// A time as the tables show it, to the second, with its zone: the machine's own
/// (`2026-12-07 19:52:57 +09:00`), or UTC with `--utc`.
pub(crate) fn time(at: &chrono::DateTime<chrono::Utc>) -> String {
    match UTC.get().copied().unwrap_or(false) {
        true => at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        false => at
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M:%S %:z")
            .to_string(),
    }
}

/// Micro-USD as dollars: `$0.0123`.
/// A model call's tokens and cost: `100 in, 20 out · $0.0004` (`?` for a count the
/// provider did not give, `cost unknown` when the model has no price).
pub(crate) fn call_figures(
    prompt: Option<i64>,
    completion: Option<i64>,
    cost: Option<i64>,
) -> String {
    let tokens = |n: Option<i64>| n.map_or("?".into(), |n| n.to_string());
    let cost = cost.map_or("cost unknown".into(), usd);
    format!("{} in, {} out · {cost}", tokens(prompt), tokens(completion))
}

pub(crate) fn usd(micros: i64) -> String {
    format!("${:.4}", micros as f64 / 1e6)
}

/// A duration to a tenth of a second: `2.4s` (never negative).
pub(crate) fn seconds(elapsed: chrono::TimeDelta) -> String {
    format!("{:.1}s", elapsed.num_milliseconds().max(0) as f64 / 1000.0)
}

pub(crate) fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn tables_fit_the_width() {
        let mut table = Table::new(&["ID", "COMMAND"]);
        table.row(vec![
            "task_1".into(),
            "echo a very long command line indeed".into(),
        ]);
        let lines = table.lines(Some(24));
        assert!(
            lines.iter().all(|l| console::measure_text_width(l) <= 24),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("task_1  echo"), "{lines:?}");
        assert!(lines[1].ends_with('…'), "{lines:?}");
        let lines = table.lines(None);
        assert!(lines[1].ends_with("indeed"), "{lines:?}");
    }
}

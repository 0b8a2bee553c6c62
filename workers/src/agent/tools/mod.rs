//! The tools an agent loop's model may call, each confined to the run's workspace and
//! sandbox: path arguments through [`paths::confine`], processes through the shell runs'
//! containment ([`exec`]), network through the public-address filter ([`http`]). A call
//! never panics: bad arguments, refusals and failures are results with `is_error`, in words
//! the model can act on, cut to the output limit.

mod diff;
mod exec;
mod files;
mod http;
mod paths;
mod specs;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::run_loop::Toolbox;
use super::{Patch, ToolCall, ToolResult, ToolSpec};
use crate::SandboxPolicy;
use crate::process::{thousands, truncation_marker};

pub use files::{RevertError, apply, revert};
pub use specs::specs;

/// The output limit per result when the configuration says nothing.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 * 1024;
/// The longest [`summarize`] line.
const MAX_SUMMARY_BYTES: usize = 512;

/// Every tool, in catalog order: the contract's list, which the API's document states.
pub const CATALOG: [&str; 11] = keel_api_types::AGENT_TOOLS;

/// The tools `sandbox_read_only` removes: they change the workspace or run arbitrary code.
pub const WRITERS: [&str; 4] = ["file_write", "file_edit", "apply_patch", "shell_exec"];

pub fn is_known(name: &str) -> bool {
    CATALOG.contains(&name)
}

/// The tools a run may call, in catalog order: those it asked for (None: the whole
/// catalog), without the writers when its workspace is read-only.
pub fn allowed(requested: Option<&[String]>, read_only: bool) -> Vec<String> {
    CATALOG
        .iter()
        .filter(|name| requested.is_none_or(|r| r.iter().any(|n| n == *name)))
        .filter(|name| !(read_only && WRITERS.contains(name)))
        .map(|name| name.to_string())
        .collect()
}

/// Where and how a run's tool calls act.
#[derive(Debug, Clone)]
pub struct ToolEnv {
    /// Exists, and is canonical.
    pub workspace: PathBuf,
    /// As for shell runs: network and read-only.
    pub sandbox: SandboxPolicy,
    /// The run's allowlisted variables (`RunSpec.env`) for the processes a call starts.
    pub env: Vec<(String, String)>,
    /// Per call of shell_exec, git_status, git_diff and http_request.
    pub call_timeout: Duration,
    /// Per result, into the conversation.
    pub max_output_bytes: usize,
    /// http_request may reach loopback and private addresses: tests only.
    pub allow_private_addresses: bool,
}

/// The workspace tools as the loop's [`Toolbox`]: one run's environment and allowed tools.
#[derive(Debug, Clone)]
pub struct WorkspaceTools {
    pub env: ToolEnv,
    /// From [`allowed`].
    pub allowed: Vec<String>,
}

impl Toolbox for WorkspaceTools {
    fn specs(&self) -> Vec<ToolSpec> {
        specs(&self.allowed)
    }

    fn summarize(&self, call: &ToolCall) -> String {
        summarize(call)
    }

    fn call(
        &self,
        tool_call: &ToolCall,
        write_paths: Option<&[String]>,
        cancel: &CancellationToken,
    ) -> impl Future<Output = ToolResult> + Send {
        let write_paths = write_paths.map(<[String]>::to_vec);
        async move { call(&self.env, &self.allowed, tool_call, write_paths, cancel).await }
    }
}

/// What a tool did: the text for the model, whether it counts as a failure (a non-zero
/// exit, an HTTP error status), and the files it changed.
struct Done {
    content: String,
    failed: bool,
    patches: Vec<Patch>,
}

impl Done {
    fn text(content: impl Into<String>) -> Done {
        Done {
            content: content.into(),
            failed: false,
            patches: Vec::new(),
        }
    }

    fn patched(content: String, patches: Vec<Patch>) -> Done {
        Done {
            content,
            failed: false,
            patches,
        }
    }
}

/// A refused or failed call, in words for the model.
enum ToolError {
    Message(String),
    /// A policy refuses the call (`policy`, and why, for the model).
    Blocked {
        policy: &'static str,
        message: String,
    },
    /// A failure that still changed files (a roll-back that could not finish): the
    /// result keeps their patches.
    Partial(Done),
}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        ToolError::Message(message)
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        ToolError::Message(message.to_string())
    }
}

/// Runs one tool call. Never panics; bad arguments, refusals and failures are results with
/// `is_error` and a message the model can act on. A call to a tool not in `allowed` is
/// refused the same way, and a write outside `write_paths`. Stops (killing its processes)
/// when `cancel` fires.
pub async fn call(
    env: &ToolEnv,
    allowed: &[String],
    call: &ToolCall,
    write_paths: Option<Vec<String>>,
    cancel: &CancellationToken,
) -> ToolResult {
    let (content, is_error, patches) = match dispatch(env, allowed, call, write_paths, cancel).await
    {
        Ok(done) | Err(ToolError::Partial(done)) => (done.content, done.failed, done.patches),
        Err(ToolError::Message(message)) => (message, true, Vec::new()),
        Err(ToolError::Blocked { policy, message }) => {
            return ToolResult::blocked(policy, message);
        }
    };
    ToolResult {
        content: bound(content, env.max_output_bytes),
        is_error,
        patches,
        blocked: None,
    }
}

async fn dispatch(
    env: &ToolEnv,
    allowed: &[String],
    call: &ToolCall,
    write_paths: Option<Vec<String>>,
    cancel: &CancellationToken,
) -> Result<Done, ToolError> {
    let name = call.name.as_str();
    if !is_known(name) {
        return Err(format!(
            "there is no tool {:?}; the tools are: {}",
            clean(name, 64),
            allowed.join(", ")
        )
        .into());
    }
    if env.sandbox.read_only && WRITERS.contains(&name) {
        return Err(ToolError::Blocked {
            policy: "sandbox_read_only",
            message: format!("{name} is refused: this run's workspace is read-only"),
        });
    }
    if !allowed.iter().any(|a| a == name) {
        return Err(ToolError::Blocked {
            policy: "tool_not_allowed",
            message: format!(
                "{name} is not available in this run; the tools are: {}",
                allowed.join(", ")
            ),
        });
    }
    let args = arguments(call)?;
    let ws = &env.workspace;
    match name {
        "read_file" => reading(ws, cancel, move |ws| files::read_file(ws, parse(args)?)).await,
        "list_dir" => reading(ws, cancel, move |ws| files::list_dir(ws, parse(args)?)).await,
        "grep" => reading(ws, cancel, move |ws| files::grep(ws, parse(args)?)).await,
        "glob" => reading(ws, cancel, move |ws| files::glob(ws, parse(args)?)).await,
        "file_write" | "file_edit" | "apply_patch" => {
            let name = name.to_string();
            writing(ws, move |ws| {
                let ws = files::Writable::new(ws, write_paths.as_deref());
                match name.as_str() {
                    "file_write" => files::file_write(&ws, parse(args)?),
                    "file_edit" => files::file_edit(&ws, parse(args)?),
                    _ => files::apply_patch(&ws, parse(args)?),
                }
            })
            .await
        }
        "shell_exec" => exec::shell_exec(env, parse(args)?, cancel).await,
        "git_status" => exec::git_status(env, cancel).await,
        "git_diff" => exec::git_diff(env, parse(args)?, cancel).await,
        "http_request" => http::http_request(env, parse(args)?, cancel).await,
        _ => unreachable!("every catalog tool is dispatched"),
    }
}

/// The call's arguments as a JSON object; an empty text is no arguments.
fn arguments(call: &ToolCall) -> Result<serde_json::Value, ToolError> {
    if call.arguments.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    match serde_json::from_str(&call.arguments) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(value),
        Ok(_) => Err("the arguments must be a JSON object".into()),
        Err(e) => Err(format!("the arguments are not valid JSON: {e}").into()),
    }
}

fn parse<T: DeserializeOwned>(args: serde_json::Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| format!("invalid arguments: {e}").into())
}

/// Runs a reading file tool off the async runtime; a cancelled call stops waiting for it
/// (the walk is bounded and changes nothing).
async fn reading(
    workspace: &Path,
    cancel: &CancellationToken,
    work: impl FnOnce(&Path) -> Result<Done, ToolError> + Send + 'static,
) -> Result<Done, ToolError> {
    tokio::select! {
        done = writing(workspace, work) => done,
        _ = cancel.cancelled() => Err("the tool call was cancelled".into()),
    }
}

/// Runs a file tool off the async runtime to its end, cancelled or not: a writer left
/// running behind a "cancelled" result would change files no patch records. Writers touch
/// a few files of bounded size, so this is short.
async fn writing(
    workspace: &Path,
    work: impl FnOnce(&Path) -> Result<Done, ToolError> + Send + 'static,
) -> Result<Done, ToolError> {
    let workspace = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || work(&workspace))
        .await
        .unwrap_or_else(|e| Err(format!("the tool failed: {e}").into()))
}

/// `content` cut to `max` bytes (at a char boundary), with a marker naming the full size.
pub(crate) fn bound(mut content: String, max: usize) -> String {
    if content.len() <= max {
        return content;
    }
    let total = content.len();
    let mut cut = max;
    while !content.is_char_boundary(cut) {
        cut -= 1;
    }
    content.truncate(cut);
    if !content.ends_with('\n') {
        content.push('\n');
    }
    content.push_str(&truncation_marker(total));
    content
}

/// The files a writer's call names, in the order its patches are recorded: the `path` of
/// `file_write` and `file_edit`, each file section of `apply_patch`'s diff; none for other
/// tools or arguments that do not read.
pub fn written_paths(call: &ToolCall) -> Vec<String> {
    let Ok(args) = arguments(call) else {
        return Vec::new();
    };
    let text = |key: &str| args.get(key).and_then(|v| v.as_str());
    match call.name.as_str() {
        "file_write" | "file_edit" => text("path").map(str::to_string).into_iter().collect(),
        "apply_patch" => text("patch")
            .and_then(|patch| diff::split(patch).ok())
            .map(|sections| sections.iter().map(|s| s.path().to_string()).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// A one-line description of a call for an approval's action summary: the tool's name and
/// its salient argument, so the approver sees what would happen: the command itself, the
/// pattern, the path, the request's method and URL (without its query, which may carry a
/// token). File contents, patch bodies and HTTP headers and bodies stay out; the runtime
/// redacts credential-looking values ([`ActionSummary`] in the runtime). At most 512 bytes.
pub fn summarize(call: &ToolCall) -> String {
    let name = clean(&call.name, 64);
    let args: serde_json::Value = match arguments(call) {
        Ok(args) => args,
        Err(_) => {
            let n = thousands(call.arguments.len() as u64);
            return cap(format!("{name}: unreadable arguments ({n} bytes)"));
        }
    };
    let text = |key: &str| args.get(key).and_then(|v| v.as_str());
    let size = |key: &str| thousands(text(key).map_or(0, str::len) as u64);
    let path = |key: &str| clean(text(key).unwrap_or("."), 200);
    let shown = |key: &str| one_line(text(key).unwrap_or_default());
    let line = match name.as_str() {
        "read_file" | "list_dir" | "git_diff" => format!("{name}: {}", path("path")),
        "git_status" => name.clone(),
        "grep" => format!("{name}: {} in {}", shown("pattern"), path("path")),
        "glob" => format!("{name}: {}", shown("pattern")),
        "file_write" => format!("{name}: {} ({} bytes)", path("path"), size("content")),
        "file_edit" => format!(
            "{name}: {} (replacing {} bytes with {} bytes{})",
            path("path"),
            size("old_string"),
            size("new_string"),
            if args.get("replace_all") == Some(&serde_json::Value::Bool(true)) {
                ", every occurrence"
            } else {
                ""
            }
        ),
        "apply_patch" => {
            let files = text("patch")
                .and_then(|p| diff::split(p).ok())
                .map(|sections| {
                    sections
                        .iter()
                        .map(|s| clean(s.path(), 100))
                        .collect::<Vec<_>>()
                        .join(", ")
                });
            match files {
                Some(files) => format!("{name}: a {}-byte patch to {files}", size("patch")),
                None => format!("{name}: a {}-byte patch", size("patch")),
            }
        }
        "shell_exec" => format!("{name}: {}", shown("command")),
        "http_request" => {
            let method = clean(text("method").unwrap_or("?"), 16).to_ascii_uppercase();
            let url = text("url")
                .and_then(|u| url::Url::parse(u).ok())
                .map(|u| without_query(&u))
                .unwrap_or_else(|| "an unreadable URL".into());
            format!("{name}: {method} {url}")
        }
        _ => format!("{name}: an unknown tool"),
    };
    cap(line)
}

/// `url` up to its path, userinfo dropped, and `?…` in place of a query (which may carry
/// a token).
fn without_query(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_fragment(None);
    let had_query = shown.query().is_some();
    shown.set_query(None);
    let mut text = clean(shown.as_str(), 300);
    if had_query {
        text.push_str("?…");
    }
    text
}

/// A multi-line argument on one line: each line break shown as ` ⏎ `, other control
/// characters as spaces, so the approver reads every line of it.
fn one_line(text: &str) -> String {
    clean(
        &text.replace("\r\n", "\n").replace('\n', " ⏎ "),
        MAX_SUMMARY_BYTES,
    )
}

/// `text` without control characters, cut to `max` bytes.
pub(crate) fn clean(text: &str, max: usize) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    cap_to(cleaned, max)
}

fn cap(line: String) -> String {
    cap_to(line, MAX_SUMMARY_BYTES)
}

fn cap_to(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max.saturating_sub('…'.len_utf8());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests;

//! What the model is told about each tool: a description and a JSON Schema of its arguments.

use serde_json::{Value, json};

use super::CATALOG;
use crate::agent::ToolSpec;

/// JSON-Schema specs of the `allowed` tools, in catalog order.
pub fn specs(allowed: &[String]) -> Vec<ToolSpec> {
    CATALOG
        .iter()
        .filter(|name| allowed.iter().any(|a| a == *name))
        .map(|name| spec(name))
        .collect()
}

fn spec(name: &'static str) -> ToolSpec {
    let (description, parameters) = match name {
        "read_file" => (
            "Read a UTF-8 text file of the workspace, as numbered lines.",
            object(
                json!({
                    "path": path("The file, relative to the workspace."),
                    "offset": {"type": "integer", "minimum": 1, "description": "The first line to read (1-based; default 1)."},
                    "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read (default 2000)."}
                }),
                &["path"],
            ),
        ),
        "list_dir" => (
            "List a directory of the workspace: directories end with '/', symbolic links with '@'.",
            object(
                json!({"path": path("The directory (default: the workspace).")}),
                &[],
            ),
        ),
        "grep" => (
            "Search the workspace's text files for lines matching a regular expression (Rust regex syntax); answers path:line:text.",
            object(
                json!({
                    "pattern": {"type": "string", "description": "The regular expression."},
                    "path": path("A file or directory to search (default: the workspace)."),
                    "glob": {"type": "string", "description": "Only files whose workspace-relative path matches this glob, e.g. '**/*.rs'."}
                }),
                &["pattern"],
            ),
        ),
        "glob" => (
            "List the workspace's files whose relative path matches a glob, e.g. 'src/**/*.rs'.",
            object(
                json!({"pattern": {"type": "string", "description": "The glob."}}),
                &["pattern"],
            ),
        ),
        "file_write" => (
            "Create or overwrite a text file of the workspace with the given content (parent directories are created).",
            object(
                json!({
                    "path": path("The file, relative to the workspace."),
                    "content": {"type": "string", "description": "The whole new content."}
                }),
                &["path", "content"],
            ),
        ),
        "file_edit" => (
            "Replace an exact string in a text file. old_string must occur exactly once unless replace_all is true.",
            object(
                json!({
                    "path": path("The file, relative to the workspace."),
                    "old_string": {"type": "string", "description": "The exact text to replace (with enough context to be unique)."},
                    "new_string": {"type": "string", "description": "The replacement."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
                    "propose": {"type": "boolean", "description": "Only propose the edit: the file stays as it is until an operator applies it (default false)."}
                }),
                &["path", "old_string", "new_string"],
            ),
        ),
        "apply_patch" => (
            "Apply a unified diff (as `git diff` or `diff -u` write it) to one or more files; /dev/null creates or deletes a file. All or nothing: if any hunk does not apply, no file changes.",
            object(
                json!({
                    "patch": {"type": "string", "description": "The unified diff, with ---/+++ headers and @@ hunks."},
                    "propose": {"type": "boolean", "description": "Only propose the changes: no file changes until an operator applies them (default false)."}
                }),
                &["patch"],
            ),
        ),
        "shell_exec" => (
            "Run a command with `sh -c` in the workspace; answers the exit code, stdout and stderr. The command is killed at the call timeout.",
            object(
                json!({"command": {"type": "string", "description": "The shell command."}}),
                &["command"],
            ),
        ),
        "git_status" => (
            "Show `git status --short --branch` of the workspace.",
            object(json!({}), &[]),
        ),
        "git_diff" => (
            "Show the workspace's unstaged changes (`git diff`), optionally of one path.",
            object(
                json!({"path": path("A file or directory (default: all).")}),
                &[],
            ),
        ),
        "http_request" => (
            "Make an HTTP(S) request to a public address; answers the status, content type and (bounded) body.",
            object(
                json!({
                    "method": {"type": "string", "description": "GET, POST, PUT, PATCH, DELETE, HEAD, …"},
                    "url": {"type": "string", "description": "An http:// or https:// URL."},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Request headers."},
                    "body": {"type": "string", "description": "The request body."}
                }),
                &["method", "url"],
            ),
        ),
        _ => unreachable!("{name} is not in the catalog"),
    };
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        parameters,
    }
}

fn path(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    })
}

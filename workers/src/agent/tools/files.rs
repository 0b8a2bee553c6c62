//! The file tools: reading, listing and searching the workspace, and the writers, which
//! return one [`Patch`] per file they changed. Everything here blocks, so [`super::call`]
//! runs it off the async runtime.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use globset::{Glob, GlobMatcher};
use regex::Regex;
use serde::Deserialize;

use super::paths::{Confined, confine};
use super::{Done, ToolError};
use crate::FileOperation;
use crate::agent::Patch;
use crate::file::beneath::{self, Unreadable};

/// Text files up to this size are read, edited and recorded in patches.
pub(super) const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// read_file's default number of lines.
const DEFAULT_LINES: usize = 2000;
/// Entries grep, glob and list_dir visit at most, so a huge tree cannot stall a call.
const MAX_VISITED: usize = 50_000;
/// Matching lines grep reports at most...
const MAX_MATCHES: usize = 500;
/// ...and file bytes it reads at most.
const MAX_GREP_BYTES: u64 = 64 * 1024 * 1024;
/// Directories the walks skip and the writers refuse: the repository's internals and the
/// run's private state.
const SKIPPED_DIRS: [&str; 2] = [".git", ".keel"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadFile {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

pub(super) fn read_file(ws: &Path, args: ReadFile) -> Result<Done, ToolError> {
    let file = confine(ws, &args.path)?;
    let text = read_text(ws, &file)?.ok_or_else(|| format!("{}: no such file", args.path))?;
    let first = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(DEFAULT_LINES).max(1);
    let total = text.lines().count();
    let mut out = String::new();
    for (n, line) in text.lines().enumerate().skip(first - 1).take(limit) {
        let _ = writeln!(out, "{:>6}\t{line}", n + 1);
    }
    if out.is_empty() {
        out = format!(
            "[{}: {total} lines; nothing from line {first}]",
            file.relative
        );
    } else if first - 1 + limit < total {
        let _ = writeln!(out, "[{total} lines in all; continue with offset]");
    }
    Ok(Done::text(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListDir {
    path: Option<String>,
}

pub(super) fn list_dir(ws: &Path, args: ListDir) -> Result<Done, ToolError> {
    let dir = confine(ws, args.path.as_deref().unwrap_or("."))?;
    let entries = fs::read_dir(&dir.full).map_err(|e| format!("{}: {e}", dir.relative))?;
    let mut names: Vec<String> = entries
        .take(MAX_VISITED)
        .filter_map(Result::ok)
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            match entry.file_type() {
                Ok(t) if t.is_dir() => format!("{name}/"),
                Ok(t) if t.is_symlink() => format!("{name}@"),
                _ => name,
            }
        })
        .collect();
    names.sort();
    if names.is_empty() {
        return Ok(Done::text(format!("[{} is empty]", dir.relative)));
    }
    Ok(Done::text(names.join("\n")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Grep {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
}

pub(super) fn grep(ws: &Path, args: Grep) -> Result<Done, ToolError> {
    let regex = Regex::new(&args.pattern).map_err(|e| format!("invalid pattern: {e}"))?;
    let filter = args.glob.as_deref().map(matcher).transpose()?;
    let start = confine(ws, args.path.as_deref().unwrap_or("."))?;
    let mut out = String::new();
    let mut matches = 0;
    let mut read = 0u64;
    walk(ws, &start, &mut |file| {
        if filter.as_ref().is_some_and(|g| !g.is_match(&file.relative)) {
            return true;
        }
        // Binary and oversize files are skipped: grep answers about text.
        let Ok(Some(text)) = read_text(ws, file) else {
            return true;
        };
        read += text.len() as u64;
        if read > MAX_GREP_BYTES {
            let _ = writeln!(
                out,
                "[stopped after reading {MAX_GREP_BYTES} bytes; narrow path or glob]"
            );
            return false;
        }
        for (n, line) in text.lines().enumerate() {
            if regex.is_match(line) {
                let _ = writeln!(out, "{}:{}:{line}", file.relative, n + 1);
                matches += 1;
                if matches == MAX_MATCHES {
                    let _ = writeln!(out, "[stopped at {MAX_MATCHES} matches]");
                    return false;
                }
            }
        }
        true
    })?;
    if out.is_empty() {
        out = "[no matches]".into();
    }
    Ok(Done::text(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GlobArgs {
    pattern: String,
}

pub(super) fn glob(ws: &Path, args: GlobArgs) -> Result<Done, ToolError> {
    let glob = matcher(&args.pattern)?;
    let root = confine(ws, ".")?;
    let mut found = Vec::new();
    walk(ws, &root, &mut |file| {
        if glob.is_match(&file.relative) {
            found.push(file.relative.clone());
        }
        true
    })?;
    found.sort();
    if found.is_empty() {
        return Ok(Done::text("[no files match]"));
    }
    Ok(Done::text(found.join("\n")))
}

fn matcher(pattern: &str) -> Result<GlobMatcher, String> {
    Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("invalid glob: {e}"))
}

/// Visits the regular files under `start` (depth first, symbolic links not followed, the
/// [`SKIPPED_DIRS`] skipped) until `visit` returns false or [`MAX_VISITED`] entries.
fn walk(
    ws: &Path,
    start: &Confined,
    visit: &mut dyn FnMut(&Confined) -> bool,
) -> Result<(), ToolError> {
    let meta = fs::symlink_metadata(&start.full).map_err(|e| format!("{}: {e}", start.relative))?;
    if meta.is_file() {
        visit(start);
        return Ok(());
    }
    let mut pending = vec![start.full.clone()];
    let mut visited = 0;
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.file_name()));
        for entry in entries {
            visited += 1;
            if visited > MAX_VISITED {
                return Ok(());
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let full = entry.path();
            if kind.is_dir() {
                let name = entry.file_name();
                if !SKIPPED_DIRS.iter().any(|s| name == *s) {
                    pending.push(full);
                }
            } else if kind.is_file() {
                let relative = full
                    .strip_prefix(ws)
                    .map(|r| r.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !visit(&Confined { full, relative }) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// A text file's content; None when it does not exist. It is opened beneath the workspace
/// without following any link; directories, other non-regular files, files with other
/// hard links (which may be outside the workspace), binary (not UTF-8) and oversize files
/// are errors.
fn read_text(ws: &Path, file: &Confined) -> Result<Option<String>, String> {
    let name = &file.relative;
    let bytes = match beneath::read(ws, Path::new(name), MAX_FILE_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(Unreadable::NotRegular) => return Err(format!("{name}: not a regular file")),
        Err(Unreadable::Linked) => {
            return Err(format!(
                "{name}: the file has other hard links (they may be outside the workspace); \
                 refused"
            ));
        }
        Err(Unreadable::TooLarge(size)) => {
            return Err(format!(
                "{name}: {size} bytes is more than the tools handle ({MAX_FILE_BYTES} bytes)"
            ));
        }
        Err(Unreadable::Failed(error)) => return Err(format!("{name}: {error}")),
    };
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| format!("{name}: a binary file (not UTF-8 text)"))
}

/// A file a writer is about to change: where, and its content now.
struct Target {
    file: Confined,
    before: Option<String>,
}

fn target(ws: &Path, path: &str) -> Result<Target, String> {
    let file = confine(ws, path)?;
    if file.relative == "." {
        return Err(format!("{path}: names the workspace, not a file"));
    }
    // A repository's internals hold configuration that makes git run programs (filters,
    // hooks), and `.keel` is the run's own state: neither is the model's to write. The
    // resolved path is checked, so a link to them is refused too.
    if let Some(dir) = Path::new(&file.relative)
        .components()
        .find_map(|c| SKIPPED_DIRS.into_iter().find(|d| c.as_os_str() == *d))
    {
        return Err(format!("{path}: writing under {dir}/ is refused"));
    }
    // Refuses a file with other hard links too: writing through one would change a file
    // that may be outside.
    let before = read_text(ws, &file)?;
    Ok(Target { file, before })
}

/// Where a writer works: the workspace, and the paths beneath which the approval policy
/// lets it write (None: anywhere in the workspace).
pub(super) struct Writable<'a> {
    ws: &'a Path,
    write_paths: Option<&'a [String]>,
}

impl<'a> Writable<'a> {
    pub(super) fn new(ws: &'a Path, write_paths: Option<&'a [String]>) -> Self {
        Writable { ws, write_paths }
    }

    /// The file a writer is about to change, refused as the policy's when its resolved
    /// path (links followed) lies outside the write paths.
    fn target(&self, path: &str) -> Result<Target, ToolError> {
        let target = target(self.ws, path)?;
        if !keel_api_types::is_beneath_write_paths(self.write_paths, &target.file.relative) {
            let paths = self.write_paths.unwrap_or_default().join(", ");
            return Err(ToolError::Blocked {
                policy: "approval_policy",
                message: format!(
                    "{path}: the workspace's approval policy lets file writers write only \
                     beneath: {paths}"
                ),
            });
        }
        Ok(target)
    }
}

/// Writes (or, with None, removes) the target's file; returns its patch.
fn commit(ws: &Path, target: &Target, after: Option<&str>) -> Result<Patch, String> {
    let patch = proposal(target, after.map(str::to_string))?;
    write_or_remove(ws, &patch.path, after).map_err(|e| format!("{}: {e}", patch.path))?;
    Ok(Patch {
        proposed: false,
        ..patch
    })
}

/// The target's change as a proposal, written nowhere; refused when the tools would not
/// write it.
fn proposal(target: &Target, after: Option<String>) -> Result<Patch, String> {
    let path = &target.file.relative;
    if let Some(text) = &after
        && text.len() as u64 > MAX_FILE_BYTES
    {
        return Err(format!(
            "{path}: {} bytes is more than the tools write ({MAX_FILE_BYTES} bytes)",
            text.len()
        ));
    }
    Ok(Patch {
        path: path.clone(),
        before: target.before.clone(),
        after,
        proposed: true,
    })
}

/// Writes the file (creating missing directories) or removes it, through the shell-free
/// file runs' `openat2` walk from the workspace: the confined path has no symbolic link,
/// and one swapped in since the check is refused rather than followed.
fn write_or_remove(ws: &Path, relative: &str, content: Option<&str>) -> Result<(), String> {
    let (bytes, operation) = match content {
        Some(text) => (text.as_bytes(), FileOperation::Write),
        None => (&[][..], FileOperation::Delete),
    };
    beneath::apply(ws, Path::new(relative), bytes, operation).map(|_| ())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileWrite {
    path: String,
    content: String,
}

pub(super) fn file_write(w: &Writable, args: FileWrite) -> Result<Done, ToolError> {
    let target = w.target(&args.path)?;
    let patch = commit(w.ws, &target, Some(&args.content))?;
    let verb = if target.before.is_some() {
        "overwrote"
    } else {
        "created"
    };
    let message = format!("{verb} {} ({} bytes)", patch.path, args.content.len());
    Ok(Done::patched(message, vec![patch]))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileEdit {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
    /// Leave the change as a proposal an operator applies, not in the file.
    #[serde(default)]
    propose: bool,
}

pub(super) fn file_edit(w: &Writable, args: FileEdit) -> Result<Done, ToolError> {
    if args.old_string.is_empty() {
        return Err("old_string is empty; use file_write to create a file".into());
    }
    let target = w.target(&args.path)?;
    let Some(before) = &target.before else {
        return Err(format!("{}: no such file", args.path).into());
    };
    let count = before.matches(&args.old_string).count();
    let after = match count {
        0 => return Err(format!("{}: old_string was not found", args.path).into()),
        1 => before.replacen(&args.old_string, &args.new_string, 1),
        _ if args.replace_all => before.replace(&args.old_string, &args.new_string),
        n => {
            return Err(format!(
                "{}: old_string occurs {n} times; give more context to make it unique, \
                 or set replace_all",
                args.path
            )
            .into());
        }
    };
    if args.propose {
        let patch = proposal(&target, Some(after))?;
        let message = format!(
            "proposed an edit of {} ({count} replacement(s)); the file is unchanged until an \
             operator applies it",
            patch.path
        );
        return Ok(Done::patched(message, vec![patch]));
    }
    let patch = commit(w.ws, &target, Some(&after))?;
    let message = format!("edited {}: {count} replacement(s)", patch.path);
    Ok(Done::patched(message, vec![patch]))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplyPatch {
    patch: String,
    /// Leave the changes as proposals an operator applies, not in the files.
    #[serde(default)]
    propose: bool,
}

/// Applies a unified diff of one or more files, all or nothing: every file's new content
/// is computed before anything is written, and a write that fails puts back the files
/// already written.
pub(super) fn apply_patch(w: &Writable, args: ApplyPatch) -> Result<Done, ToolError> {
    let ws = w.ws;
    let sections = super::diff::split(&args.patch)?;
    let mut planned: Vec<(Target, Option<String>)> = Vec::new();
    for section in &sections {
        let path = section.path();
        let target = w.target(path)?;
        if planned.iter().any(|(t, _)| t.file.full == target.file.full) {
            return Err(format!("{path}: appears twice in the patch").into());
        }
        let after = section.apply(target.before.as_deref())?;
        planned.push((target, after));
    }
    if args.propose {
        let patches = planned
            .into_iter()
            .map(|(target, after)| proposal(&target, after))
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<&str> = patches.iter().map(|p| p.path.as_str()).collect();
        let message = format!(
            "proposed changes to {} file(s): {}; no file is changed until an operator applies \
             them",
            names.len(),
            names.join(", ")
        );
        return Ok(Done::patched(message, patches));
    }
    let mut patches = Vec::new();
    for (target, after) in &planned {
        match commit(ws, target, after.as_deref()) {
            Ok(patch) => patches.push(patch),
            Err(error) => return Err(roll_back(ws, &planned, patches, error)),
        }
    }
    let names: Vec<&str> = patches.iter().map(|p| p.path.as_str()).collect();
    let message = format!("patched {} file(s): {}", names.len(), names.join(", "));
    Ok(Done::patched(message, patches))
}

/// Puts back the files a failed apply_patch already wrote. A file that cannot be put back
/// stays changed, so its patch is still returned (the runtime records it).
fn roll_back(
    ws: &Path,
    planned: &[(Target, Option<String>)],
    written: Vec<Patch>,
    error: String,
) -> ToolError {
    let mut stuck = Vec::new();
    let mut failures = Vec::new();
    for ((target, _), patch) in planned.iter().zip(written) {
        if let Err(e) = write_or_remove(ws, &target.file.relative, target.before.as_deref()) {
            failures.push(format!("{}: {e}", patch.path));
            stuck.push(patch);
        }
    }
    if stuck.is_empty() {
        return format!("{error}; no file was changed").into();
    }
    ToolError::Partial(Done {
        content: format!(
            "{error}; these files could not be put back and stay changed: {}",
            failures.join("; ")
        ),
        failed: true,
        patches: stuck,
    })
}

/// Why a patch could not be applied or reverted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevertError {
    /// The file is no longer what the patch expects: writing would lose a later change.
    #[error("{0}")]
    Drift(String),
    /// The path cannot be reached inside the workspace, or the file cannot be read/written.
    #[error("{0}")]
    Refused(String),
}

/// Restores `patch.before` in `workspace` (removes the file when it is None), only if the
/// file's content is `patch.after` (absent when None); the path is confined like a tool's.
pub fn revert(workspace: &Path, patch: &Patch) -> Result<(), RevertError> {
    let (expected, wanted) = (patch.after.as_deref(), patch.before.as_deref());
    replace_if(workspace, &patch.path, expected, wanted, "was applied")
}

/// Writes a proposed `patch.after` in `workspace` (removes the file when it is None), only
/// if the file's content is still `patch.before` (absent when None).
pub fn apply(workspace: &Path, patch: &Patch) -> Result<(), RevertError> {
    let (expected, wanted) = (patch.before.as_deref(), patch.after.as_deref());
    replace_if(workspace, &patch.path, expected, wanted, "was proposed")
}

/// Makes the file `wanted` if it is `expected` now, else leaves it as it is.
fn replace_if(
    workspace: &Path,
    path: &str,
    expected: Option<&str>,
    wanted: Option<&str>,
    since: &str,
) -> Result<(), RevertError> {
    let target = target(workspace, path).map_err(RevertError::Refused)?;
    if target.before.as_deref() != expected {
        return Err(RevertError::Drift(format!(
            "{path} changed since the patch {since}; it was left as it is"
        )));
    }
    write_or_remove(workspace, &target.file.relative, wanted)
        .map_err(|e| RevertError::Refused(format!("{path}: {e}")))
}

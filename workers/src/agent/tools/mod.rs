//! The tools an agent loop's model may call, each confined to the run's workspace and
//! sandbox.

/// Every tool, in catalog order.
pub const CATALOG: [&str; 11] = [
    "read_file",
    "list_dir",
    "grep",
    "glob",
    "file_write",
    "file_edit",
    "apply_patch",
    "shell_exec",
    "git_status",
    "git_diff",
    "http_request",
];

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_removes_the_writers_and_order_is_the_catalogs() {
        let asked = vec!["shell_exec".to_string(), "read_file".to_string()];
        assert_eq!(allowed(Some(&asked), false), ["read_file", "shell_exec"]);
        assert_eq!(allowed(Some(&asked), true), ["read_file"]);
        assert_eq!(allowed(None, true).len(), CATALOG.len() - WRITERS.len());
        assert!(is_known("grep") && !is_known("rm"));
    }
}

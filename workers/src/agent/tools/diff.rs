//! apply_patch's reading of a unified diff: the text is split into one section per file
//! (the `---`/`+++` headers and their hunks, counted by the hunk headers so a removed line
//! that itself starts with `-- ` is never taken for a header), and each section is applied
//! by `diffy`, which refuses a hunk whose context does not match.

/// One file's part of a patch. A path is None for `/dev/null` (created or deleted).
#[derive(Debug)]
pub(super) struct Section {
    old: Option<String>,
    new: Option<String>,
    text: String,
}

impl Section {
    /// The workspace-relative path the section changes.
    pub(super) fn path(&self) -> &str {
        self.new.as_deref().or(self.old.as_deref()).unwrap_or("")
    }

    /// The file's content after the section, from its content before (None: absent).
    pub(super) fn apply(&self, before: Option<&str>) -> Result<Option<String>, String> {
        let path = self.path();
        match (&self.old, before) {
            (None, Some(_)) => return Err(format!("{path}: the patch creates it, but it exists")),
            (Some(_), None) => return Err(format!("{path}: no such file")),
            _ => {}
        }
        let patch = diffy::Patch::from_str(&self.text)
            .map_err(|e| format!("{path}: the patch cannot be read: {e}"))?;
        let after = diffy::apply(before.unwrap_or(""), &patch)
            .map_err(|e| format!("{path}: the patch does not apply ({e}); read the file again"))?;
        Ok(self.new.as_ref().map(|_| after))
    }
}

/// Splits a unified diff into its files' sections; lines outside them (`diff --git`,
/// `index …`, prose) are ignored.
pub(super) fn split(patch: &str) -> Result<Vec<Section>, String> {
    let lines: Vec<&str> = patch.split_inclusive('\n').collect();
    let mut sections = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let is_header =
            lines[i].starts_with("--- ") && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ "));
        if !is_header {
            i += 1;
            continue;
        }
        let start = i;
        let old = header_path(&lines[i][4..]);
        let new = header_path(&lines[i + 1][4..]);
        i += 2;
        let mut hunks = 0;
        while i < lines.len() && lines[i].starts_with("@@") {
            let (mut old_left, mut new_left) = hunk_counts(lines[i])?;
            hunks += 1;
            i += 1;
            while (old_left > 0 || new_left > 0) && i < lines.len() {
                match lines[i].as_bytes().first() {
                    Some(b' ') | Some(b'\n') | Some(b'\r') => {
                        old_left = old_left.saturating_sub(1);
                        new_left = new_left.saturating_sub(1);
                    }
                    Some(b'-') => old_left = old_left.saturating_sub(1),
                    Some(b'+') => new_left = new_left.saturating_sub(1),
                    Some(b'\\') => {}
                    _ => return Err(format!("unexpected line in a hunk: {:?}", lines[i])),
                }
                i += 1;
            }
            while i < lines.len() && lines[i].starts_with('\\') {
                i += 1;
            }
        }
        let path = new.as_deref().or(old.as_deref()).unwrap_or("").to_string();
        if hunks == 0 {
            return Err(format!("{path}: the file's section has no hunks"));
        }
        if old.is_some() && new.is_some() && old != new {
            return Err(format!(
                "{path}: renames are not supported; delete and create the files instead"
            ));
        }
        if path.is_empty() {
            return Err("a section names /dev/null on both sides".into());
        }
        let text = lines[start..i].concat();
        sections.push(Section { old, new, text });
    }
    if sections.is_empty() {
        return Err("no file sections (`--- a/path` / `+++ b/path` headers) found".into());
    }
    Ok(sections)
}

/// The path of a `---`/`+++` header: up to a tab (diff's timestamp), without git's `a/`
/// and `b/` prefixes; None for /dev/null.
fn header_path(rest: &str) -> Option<String> {
    let path = rest.split('\t').next().unwrap_or("").trim_end();
    if path == "/dev/null" {
        return None;
    }
    let path = path
        .strip_prefix("a/")
        .or_else(|| path.strip_prefix("b/"))
        .unwrap_or(path);
    Some(path.to_string())
}

/// The old and new line counts of `@@ -a[,b] +c[,d] @@`.
fn hunk_counts(line: &str) -> Result<(usize, usize), String> {
    let bad = || format!("a malformed hunk header: {:?}", line.trim_end());
    let ranges = line
        .strip_prefix("@@ ")
        .and_then(|r| r.split(" @@").next())
        .ok_or_else(bad)?;
    let (old, new) = ranges.split_once(' ').ok_or_else(bad)?;
    let count = |range: &str, sign: char| -> Result<usize, String> {
        let range = range.strip_prefix(sign).ok_or_else(bad)?;
        match range.split_once(',') {
            Some((_, n)) => n.parse().map_err(|_| bad()),
            None => range.parse::<usize>().map(|_| 1).map_err(|_| bad()),
        }
    };
    Ok((count(old, '-')?, count(new, '+')?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_git_diff_splits_into_files_and_a_removed_dash_line_is_no_header() {
        let patch = "diff --git a/a.txt b/a.txt\nindex 1..2 100644\n--- a/a.txt\n+++ b/a.txt\n\
                     @@ -1,2 +1,2 @@\n--- old\n+++ new\n keep\n\
                     --- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n";
        let sections = split(patch).unwrap();
        assert_eq!(sections.len(), 2);
        assert_eq!(sections[0].path(), "a.txt");
        let after = sections[0].apply(Some("-- old\nkeep\n")).unwrap();
        assert_eq!(after.as_deref(), Some("++ new\nkeep\n"));
        assert_eq!(sections[1].path(), "new.txt");
        assert_eq!(sections[1].apply(None).unwrap().as_deref(), Some("hello\n"));
        assert!(sections[1].apply(Some("x")).is_err());
    }

    #[test]
    fn malformed_patches_are_refused() {
        assert!(split("just prose\n").is_err());
        assert!(split("--- a/x\n+++ b/x\n").is_err());
        assert!(split("--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n").is_err());
        assert!(split("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n*b\n").is_err());
    }
}

//! The layout's arrows (docs/architecture.md): each top-level module of `src/` may use only
//! the modules this table names, and the table itself has no cycle, so every arrow points
//! one way. A new `use crate::…` across modules fails here until the table (and the
//! document) say it belongs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each module and what it may use, from the bottom up.
const MAY_USE: &[(&str, &[&str])] = &[
    // Shared vocabulary and infrastructure.
    ("domain", &[]),
    ("telemetry", &[]),
    ("quotas", &[]),
    ("queue", &["domain", "telemetry"]),
    ("db", &["queue", "quotas"]),
    ("events", &["db", "domain"]),
    ("artifacts", &["db", "domain", "events"]),
    ("attempt", &["db", "domain", "events", "queue", "telemetry"]),
    // Features.
    ("providers", &["db", "domain"]),
    ("workspaces", &["db", "domain"]),
    ("system", &["db", "domain"]),
    ("tasks", &["db", "domain", "events", "providers"]),
    ("approvals", &["db", "domain", "events", "tasks"]),
    (
        "runs",
        &[
            "approvals",
            "artifacts",
            "attempt",
            "db",
            "domain",
            "events",
            "providers",
            "queue",
            "tasks",
        ],
    ),
    (
        "agent",
        &[
            "approvals",
            "attempt",
            "db",
            "domain",
            "events",
            "providers",
            "queue",
            "runs",
            "tasks",
        ],
    ),
    (
        "media",
        &[
            "artifacts",
            "attempt",
            "db",
            "domain",
            "events",
            "providers",
            "queue",
        ],
    ),
    (
        "external",
        &[
            "approvals",
            "artifacts",
            "attempt",
            "db",
            "domain",
            "events",
            "providers",
            "queue",
            "runs",
            "tasks",
        ],
    ),
    ("schedules", &["db", "domain", "events", "runs", "tasks"]),
    // The processes, composed of the features.
    (
        "config",
        &[
            "agent",
            "approvals",
            "artifacts",
            "providers",
            "queue",
            "quotas",
            "runs",
            "tasks",
            "telemetry",
        ],
    ),
    (
        "jobs",
        &[
            "agent",
            "artifacts",
            "attempt",
            "config",
            "db",
            "domain",
            "events",
            "external",
            "media",
            "providers",
            "queue",
            "runs",
        ],
    ),
    (
        "maintenance",
        &[
            "attempt",
            "db",
            "domain",
            "events",
            "external",
            "jobs",
            "media",
            "queue",
            "runs",
            "schedules",
            "system",
            "telemetry",
        ],
    ),
    (
        "api",
        &[
            "agent",
            "approvals",
            "artifacts",
            "config",
            "db",
            "domain",
            "events",
            "external",
            "media",
            "providers",
            "runs",
            "schedules",
            "system",
            "tasks",
            "telemetry",
            "workspaces",
        ],
    ),
    ("rpc", &["api"]),
    (
        "cli",
        &[
            "api",
            "config",
            "db",
            "external",
            "jobs",
            "maintenance",
            "queue",
            "rpc",
            "runs",
            "telemetry",
        ],
    ),
];

/// The top-level module a file of `src/` belongs to (`runs` for `src/runs/job/mod.rs`).
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The modules each module uses: every `crate::<module>` in its code (comments left out),
/// grouped imports (`use crate::{runs, tasks::TaskRecord}`) included.
fn uses() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let module = module_of(relative);
            let text = std::fs::read_to_string(&path).unwrap();
            let code: Vec<&str> = text
                .lines()
                .map(|l| l.split("//").next().unwrap())
                .collect();
            for used in crate_paths(&code.join("\n")) {
                if used != module {
                    found
                        .entry(module.clone())
                        .or_default()
                        .entry(used)
                        .or_default()
                        .insert(relative.display().to_string());
                }
            }
        }
    }
    found
}

/// The first segment of every path under `crate::` in `code`: `runs` for
/// `crate::runs::get`, and `runs` and `tasks` for `crate::{runs, tasks::{get, lock}}`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => modules.extend(group_heads(group)),
            None => {
                modules.insert(head(rest));
            }
        }
    }
    modules.remove("");
    modules
}

/// The first segment of each top-level item of a `{…}` group, `group` starting after its
/// `{`.
fn group_heads(group: &str) -> Vec<String> {
    let (mut depth, mut item_start, mut heads) = (0, 0, Vec::new());
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(head(group[item_start..at].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(head(group[item_start..at].trim_start()));
                item_start = at + 1;
            }
            _ => {}
        }
    }
    heads
}

/// The module name `path` starts with (`self` is the crate root: no module).
fn head(path: &str) -> String {
    let name: String = path
        .chars()
        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
        .collect();
    if name == "self" { String::new() } else { name }
}

#[test]
fn grouped_imports_are_read() {
    let code =
        "use crate::{\n    api, cli::{ops, output},\n    self,\n};\nlet x = crate::runs::get;";
    let found: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(found, ["api", "cli", "runs"]);
}

#[test]
fn each_module_uses_only_what_the_layout_allows() {
    let allowed: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    let mut unexpected = Vec::new();
    for (module, used) in uses() {
        if module == "lib" || module == "main" {
            continue;
        }
        let may = allowed
            .get(module.as_str())
            .unwrap_or_else(|| panic!("src/{module} is not in the layout's table"));
        for (target, files) in used {
            if !may.contains(&target.as_str()) {
                unexpected.push(format!("{module} -> {target} (in {files:?})"));
            }
        }
    }
    assert!(
        unexpected.is_empty(),
        "arrows the layout does not allow:\n{}",
        unexpected.join("\n")
    );
}

#[test]
fn the_layout_has_no_cycle() {
    // Every module may use only modules listed before it.
    let mut seen = BTreeSet::new();
    for (module, may) in MAY_USE {
        for used in *may {
            assert!(
                seen.contains(used),
                "{module} may use {used}, which is not below it"
            );
        }
        seen.insert(*module);
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = module_of(Path::new(&entry.unwrap().file_name()));
        assert!(
            // `bin/` holds the other binaries' mains, as `main` is keel's.
            ["lib", "main", "bin"].contains(&name.as_str()) || seen.contains(name.as_str()),
            "src/{name} is not in the layout's table"
        );
    }
}

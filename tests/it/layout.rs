//! The layout's arrows (docs/architecture.md): each top-level module of `src/` may use only
//! the modules this table names, and the table itself has no cycle, so every arrow points
//! one way. A new `use crate::…` across modules fails here until the table (and the
//! document) say it belongs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// Every `.rs` file under `src/`: its path relative to `src/`, and its text.
fn source_files() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (mut files, mut dirs) = (Vec::new(), vec![src.clone()]);
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                files.push((path.strip_prefix(&src).unwrap().to_path_buf(), text));
            }
        }
    }
    files
}

/// The modules each module uses: every `crate::<module>` in its code (comments left out),
/// grouped imports (`use crate::{runs, tasks::TaskRecord}`) included.
fn uses() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut found: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (relative, text) in source_files() {
        let module = module_of(&relative);
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect();
        for used in crate_paths(&code.join("\n")) {
            if used != module {
                let files = found.entry(module.clone()).or_default().entry(used);
                files.or_default().insert(relative.display().to_string());
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

/// Each table and the module that owns its rows (its SQL lives there).
const HOMES: &[(&str, &str)] = &[
    ("_sqlx_migrations", "db"),
    ("approval_policies", "approvals"),
    ("approvals", "approvals"),
    ("artifact_chunks", "artifacts"),
    ("artifacts", "artifacts"),
    ("ci_triage", "external"),
    ("ci_triage_scans", "external"),
    ("client_leases", "runs"),
    ("external_actions", "external"),
    ("external_sources", "external"),
    ("external_work_items", "external"),
    ("lease_history", "queue"),
    ("media_jobs", "media"),
    ("model_calls", "agent"),
    ("providers", "providers"),
    ("queue_jobs", "queue"),
    ("run_events", "events"),
    ("run_storage", "quotas"),
    ("runs", "runs"),
    ("runtime_identity", "system"),
    ("schedule_occurrences", "schedules"),
    ("state_transitions", "events"),
    ("steps", "runs"),
    ("task_schedules", "schedules"),
    ("tasks", "tasks"),
    ("workers", "queue"),
    ("workspace_limits", "workspaces"),
    ("workspace_storage", "quotas"),
];

/// The statements on another module's table, and why each stays where it is. Most are
/// one statement that must read or write two features' rows at once (a projection, a
/// guard, a write that lands whole); the others are read-only reports.
const ELSEWHERE: &[(&str, &str, &str)] = &[
    (
        "agent",
        "approvals",
        "a tool call's gate is read with the loop's replay of the run",
    ),
    (
        "agent",
        "runs",
        "a model call's counters land on the run with its ledger row",
    ),
    (
        "agent",
        "steps",
        "the loop's replay reads its own model and tool steps in order",
    ),
    (
        "approvals",
        "runs",
        "a gate records who requested its run in its own insert",
    ),
    (
        "external",
        "approvals",
        "an action's pending approval is read with the action",
    ),
    (
        "external",
        "runs",
        "an item's run status is read with the item",
    ),
    ("external", "tasks", "an item's task is read with the item"),
    (
        "media",
        "artifacts",
        "a job leaves `running` with its artifacts in one statement",
    ),
    (
        "providers",
        "media_jobs",
        "a preset in use by a media job is not deleted",
    ),
    (
        "queue",
        "workspace_limits",
        "the fair claim reads each workspace's limit",
    ),
    (
        "runs",
        "approval_policies",
        "admission checks the policy revision it decided by",
    ),
    (
        "runs",
        "artifacts",
        "a run's patches, conversation and step outputs are its artifacts",
    ),
    (
        "runs",
        "state_transitions",
        "a run's transition and its audit record land together",
    ),
    (
        "runs",
        "tasks",
        "admission moves the task's latest run with the run it writes",
    ),
    (
        "schedules",
        "tasks",
        "a schedule's task must exist in its workspace",
    ),
    (
        "system",
        "lease_history",
        "the leases and throughput reports, read only",
    ),
    (
        "system",
        "queue_jobs",
        "the queue figures and live leases, read only",
    ),
    (
        "system",
        "workers",
        "the worker figures, and forgetting workers that died",
    ),
    (
        "tasks",
        "artifacts",
        "a task's latest-run projection counts its artifacts",
    ),
    (
        "tasks",
        "providers",
        "a task's chat routes read the workspace's presets",
    ),
    (
        "tasks",
        "run_events",
        "deleting a task deletes its runs' events",
    ),
    (
        "tasks",
        "runs",
        "a task's latest-run projection reads its run",
    ),
    (
        "tasks",
        "state_transitions",
        "a task's creation and its audit record land together",
    ),
    (
        "tasks",
        "steps",
        "a task's latest-run projection counts its steps",
    ),
];

/// The tables each module's SQL names after FROM, JOIN, INTO or UPDATE, in its string
/// literals (`WITH` names and anything else that is not one of [`HOMES`] left out).
fn tables_used() -> BTreeMap<(String, String), BTreeSet<String>> {
    let homes: BTreeMap<&str, &str> = HOMES.iter().copied().collect();
    let mut found: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (relative, text) in source_files() {
        for table in sql_tables(&text) {
            if homes.contains_key(table.as_str()) {
                let files = found.entry((module_of(&relative), table)).or_default();
                files.insert(relative.display().to_string());
            }
        }
    }
    found
}

/// The names after FROM, JOIN, INTO and UPDATE in `text`.
fn sql_tables(text: &str) -> BTreeSet<String> {
    let words: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    words
        .windows(2)
        .filter(|pair| ["FROM", "JOIN", "INTO", "UPDATE"].contains(&pair[0]))
        .map(|pair| pair[1].to_string())
        .collect()
}

#[test]
fn sql_on_a_table_lives_in_its_home_or_says_why_not() {
    let homes: BTreeMap<&str, &str> = HOMES.iter().copied().collect();
    let allowed: BTreeSet<(&str, &str)> = ELSEWHERE.iter().map(|(m, t, _)| (*m, *t)).collect();
    let used = tables_used();
    let mut unexpected = Vec::new();
    for ((module, table), files) in &used {
        let home = homes[table.as_str()];
        // `db` applies migrations and counts: its SQL names every table.
        let elsewhere = module != home && module != "db";
        if elsewhere && !allowed.contains(&(module.as_str(), table.as_str())) {
            unexpected.push(format!("{module} -> {table} (home {home}, in {files:?})"));
        }
    }
    assert!(
        unexpected.is_empty(),
        "SQL on another module's table, not in ELSEWHERE with its reason:\n{}",
        unexpected.join("\n")
    );
    let stale: Vec<_> = ELSEWHERE
        .iter()
        .filter(|(m, t, _)| !used.contains_key(&(m.to_string(), t.to_string())))
        .collect();
    assert!(stale.is_empty(), "exceptions no statement needs: {stale:?}");
}

#[test]
fn every_table_of_the_migrations_has_a_home() {
    let homes: BTreeSet<&str> = HOMES.iter().map(|(t, _)| *t).collect();
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut created = BTreeSet::new();
    for entry in std::fs::read_dir(migrations).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let words: Vec<&str> = text.split_whitespace().collect();
        for at in 0..words.len().saturating_sub(2) {
            if words[at] == "CREATE" && words[at + 1] == "TABLE" {
                let name = words[at + 2..]
                    .iter()
                    .find(|w| !["IF", "NOT", "EXISTS"].contains(w));
                created.insert(name.unwrap().trim_end_matches('(').to_string());
            }
        }
    }
    let homeless: Vec<_> = created
        .iter()
        .filter(|t| !homes.contains(t.as_str()))
        .collect();
    assert!(
        homeless.is_empty(),
        "tables with no home in HOMES: {homeless:?}"
    );
}

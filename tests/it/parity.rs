//! Parity (issue 33): every operation of the OpenAPI document is a method of keel-client
//! named by its `operationId`, and a command of the CLI, or is excluded here with the
//! reason. The RPC's own check is `every_operation_of_the_api_is_bridged_or_excluded_with_a_reason`
//! in `src/rpc/methods.rs`. A new route fails these tests until the client and the CLI have
//! it (or a reviewed exclusion says why not).

use std::collections::BTreeSet;
use std::process::Stdio;

/// The method names, each referenced as `keel_client::Client::NAME`: a name that is not a
/// method does not compile.
macro_rules! client_methods {
    ($($name:ident),* $(,)?) => {{
        $(let _ = keel_client::Client::$name;)*
        [$(stringify!($name)),*]
    }};
}

/// keel-client's methods that are API operations.
fn client_operations() -> Vec<&'static str> {
    client_methods![
        // Probes and the document.
        healthz,
        readyz,
        openapi_json,
        // Tasks.
        create_task,
        list_tasks,
        get_task,
        delete_task,
        start_task,
        list_task_artifacts,
        // Runs.
        list_runs,
        list_workspace_runs,
        get_run,
        cancel_run,
        start_client_run,
        append_run_events,
        retry_run,
        resume_run,
        continue_run,
        retry_from_model_call,
        list_steps,
        get_step,
        get_transcript,
        get_run_context,
        list_run_events,
        stream_run_events,
        list_artifacts,
        get_artifact,
        artifact_content,
        list_patches,
        get_patch,
        revert_patch,
        apply_patch,
        discard_patch,
        // Approvals.
        list_approvals,
        list_task_approvals,
        get_approval,
        resolve_approval,
        // Schedules.
        list_schedules,
        get_schedule,
        put_schedule,
        delete_schedule,
        list_occurrences,
        // Media jobs.
        list_media_jobs,
        create_media_job,
        get_media_job,
        run_media_job,
        cancel_media_job,
        list_media_artifacts,
        media_artifact_content,
        // Providers and secrets.
        list_providers,
        get_provider,
        create_provider,
        patch_provider,
        delete_provider,
        check_provider,
        list_templates,
        secret_status,
        // External work.
        render,
        list_sources,
        create_source,
        get_source,
        delete_source,
        source_status,
        poll_source,
        reconcile_source,
        set_background,
        list_items,
        get_item,
        list_work_items,
        import,
        propose_action,
        list_item_actions,
        get_action,
        list_actions,
        execute_action,
        cancel_action,
        triage_item,
        get_triage_scan,
        list_triage,
        get_triage,
        start_fix_run,
        // Feed, audit trail, usage.
        list_feed,
        stream_feed,
        state_transitions,
        usage_summary,
        usage_events,
        // System and workspaces.
        system_stats,
        system_throughput,
        runtime_leases,
        shutdown,
        whoami,
        own_limits,
        get_limits,
        put_limits,
        get_policy,
        put_policy,
        delete_policy,
    ]
    .to_vec()
}

/// Operations keel-client has no method for, each with why. Empty: keep it so.
const CLIENT_EXCLUDED: &[(&str, &str)] = &[];

/// operationId → the CLI command that performs it (its words, then the options that
/// select this operation, if any).
const CLI_COMMANDS: &[(&str, &str)] = &[
    ("create_task", "tasks create"),
    ("list_tasks", "tasks list"),
    ("get_task", "tasks show"),
    ("delete_task", "tasks delete"),
    ("start_task", "tasks start"),
    ("list_runs", "runs list TASK_ID --oldest-first"),
    ("list_workspace_runs", "runs list"),
    ("get_run", "runs show"),
    ("cancel_run", "runs cancel"),
    ("retry_run", "runs retry"),
    ("resume_run", "runs resume"),
    ("stream_run_events", "runs watch"),
    ("artifact_content", "runs logs"),
    ("list_approvals", "approvals list"),
    ("list_task_approvals", "approvals list --task"),
    ("resolve_approval", "approvals approve"),
    ("get_schedule", "schedules show"),
    ("put_schedule", "schedules set"),
    ("delete_schedule", "schedules delete"),
    ("create_media_job", "media create"),
    ("run_media_job", "media create"),
    ("get_media_job", "media show"),
    ("stream_feed", "media watch"),
    ("list_providers", "providers list"),
    ("get_provider", "providers show"),
    ("create_provider", "providers create"),
    ("check_provider", "providers check"),
    ("list_sources", "external-work sources list"),
    ("get_source", "external-work sources show"),
    ("create_source", "external-work sources create"),
    ("poll_source", "external-work sources poll"),
    ("delete_source", "external-work sources delete"),
    ("list_items", "external-work items list"),
    ("get_item", "external-work items show"),
    ("system_stats", "status"),
    ("continue_run", "runs continue"),
    ("retry_from_model_call", "runs retry-from-model-call"),
    ("list_patches", "runs patches list"),
    ("get_patch", "runs patches show"),
    ("revert_patch", "runs patches revert"),
    ("start_client_run", "runs client-start"),
    ("append_run_events", "runs append"),
    ("apply_patch", "runs patches apply"),
    ("discard_patch", "runs patches discard"),
    ("list_schedules", "schedules list"),
    ("list_occurrences", "schedules occurrences"),
    ("list_media_jobs", "media list"),
    ("cancel_media_job", "media cancel"),
    ("patch_provider", "providers update"),
    ("delete_provider", "providers delete"),
    ("source_status", "external-work sources status"),
    ("set_background", "external-work sources background"),
    ("reconcile_source", "external-work sources reconcile"),
    ("import", "external-work import"),
    ("propose_action", "external-work actions propose"),
    ("list_item_actions", "external-work actions list"),
    ("get_action", "external-work actions show"),
    ("list_actions", "external-work actions list --status"),
    ("execute_action", "external-work actions execute"),
    ("cancel_action", "external-work actions cancel"),
    ("list_work_items", "external-work items list --state"),
    ("triage_item", "external-work ci triage"),
    ("get_triage_scan", "external-work ci scan"),
    ("list_triage", "external-work ci list"),
    ("get_triage", "external-work ci show"),
    ("start_fix_run", "external-work ci run"),
    ("state_transitions", "transitions list"),
    ("runtime_leases", "leases list"),
    ("list_steps", "runs steps"),
    ("list_artifacts", "runs artifacts"),
    ("list_task_artifacts", "tasks artifacts"),
    ("list_media_artifacts", "media artifacts"),
    ("get_approval", "approvals show"),
    ("list_templates", "providers templates"),
    ("whoami", "whoami"),
    ("get_step", "runs step"),
    ("get_transcript", "runs transcript"),
    ("get_run_context", "runs context"),
    ("list_run_events", "runs events"),
    ("get_artifact", "runs artifact"),
    ("media_artifact_content", "media content"),
    ("list_feed", "events list"),
    ("usage_summary", "usage summary"),
    ("usage_events", "usage events"),
    ("secret_status", "secrets status"),
    ("system_throughput", "throughput"),
    ("own_limits", "workspace show"),
    ("get_limits", "workspace show WORKSPACE_ID"),
    ("put_limits", "workspace set-limits"),
    ("get_policy", "workspace policy"),
    ("put_policy", "workspace set-policy"),
    ("delete_policy", "workspace reset-policy"),
    ("shutdown", "shutdown"),
];

/// Operations no CLI command performs, each with why.
const CLI_EXCLUDED: &[(&str, &str)] = &[
    (
        "openapi_json",
        "`keel openapi` prints the same document from the binary, no API needed",
    ),
    (
        "render",
        "`keel workflow render FILE --issue ISSUE.json` renders the same prompt from the file, \
         in process, no API needed",
    ),
    (
        "healthz",
        "a probe of the API's host for load balancers and orchestrators; `keel status` \
         answers an operator",
    ),
    (
        "readyz",
        "a probe of the API's host for load balancers and orchestrators; `keel status` \
         answers an operator",
    ),
];

/// Operations that want a command nobody has written yet: not a reason, a to-do. Remove an
/// entry when its command lands (the test fails on an entry that has one).
const NOT_YET: &[&str] = &[];

/// The document's operationIds.
fn operation_ids() -> BTreeSet<String> {
    let document = serde_json::to_value(keel::api::openapi()).unwrap();
    let mut ids = BTreeSet::new();
    for item in document["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            if let Some(id) = operation["operationId"].as_str() {
                ids.insert(id.to_string());
            }
        }
    }
    ids
}

/// Fails on an operation in none of `covered` and `excluded`, on a name in them that is no
/// operation, and on one in two of them.
fn assert_parity(what: &str, covered: &[&str], excluded: &[&str]) {
    let ids = operation_ids();
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !covered.contains(&id.as_str()) && !excluded.contains(&id.as_str()))
        .collect();
    assert!(missing.is_empty(), "operations {what} lacks: {missing:?}");
    let unknown: Vec<&&str> = covered
        .iter()
        .chain(excluded)
        .filter(|name| !ids.contains(**name))
        .collect();
    assert!(unknown.is_empty(), "{what}: not operations: {unknown:?}");
    for id in excluded {
        assert!(
            !covered.contains(id),
            "{what}: {id} is covered and excluded"
        );
    }
}

#[test]
fn every_operation_is_a_client_method_named_by_its_operation_id() {
    let methods = client_operations();
    let excluded: Vec<&str> = CLIENT_EXCLUDED.iter().map(|(id, _)| *id).collect();
    assert_parity("keel-client", &methods, &excluded);
    assert!(CLIENT_EXCLUDED.iter().all(|(_, why)| !why.is_empty()));
}

#[tokio::test]
async fn every_operation_is_a_cli_command_or_excluded_with_a_reason() {
    let covered: Vec<&str> = CLI_COMMANDS.iter().map(|(id, _)| *id).collect();
    let mut excluded: Vec<&str> = CLI_EXCLUDED.iter().map(|(id, _)| *id).collect();
    assert!(CLI_EXCLUDED.iter().all(|(_, why)| !why.is_empty()));
    for id in NOT_YET {
        assert!(
            !covered.contains(id) && !excluded.contains(id),
            "{id} has a command or an exclusion now: take it off NOT_YET"
        );
    }
    excluded.extend(NOT_YET);
    assert_parity("the CLI", &covered, &excluded);

    // Each command exists: its words (up to the first option or placeholder) answer
    // `--help` with success.
    let commands: BTreeSet<Vec<&str>> = CLI_COMMANDS
        .iter()
        .map(|(_, command)| {
            command
                .split(' ')
                .take_while(|word| {
                    !word.starts_with('-')
                        && word.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                })
                .collect()
        })
        .collect();
    for words in commands {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(&words)
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "`keel {} --help`: {}",
            words.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

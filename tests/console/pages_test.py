"""Browser tests of the console's schedules, media, providers, queue, external-work, usage
and policy pages and a run's file changes against a real `keel serve` (issue 20, part 2).
A tiny image vendor (Python's http.server, speaking the OpenAI images protocol) serves a
real PNG for the media job; a tiny chat vendor streams scripted tool calls for an agent.
Writes docs/screenshots/{queue,media,providers,schedules,...}.png.

    python3 tests/console/pages_test.py path/to/keel
"""

import base64
import http.server
import json
import os
import struct
import sys
import threading
import time
import zlib

sys.dont_write_bytecode = True  # noqa: E402  (no __pycache__ beside the sources)

from playwright.sync_api import expect

from console_test import api
from harness import NARROW, Console, ci_screenshot, element_screenshot, run_tests, screenshot

# A value that must never reach a page: the media preset's API key.
CANARY_ENV = "KEEL_SECRET_CONSOLE_CANARY_KEY"
CANARY = "sk-console-canary-7f3a9c"


def png(width=16, height=16):
    """A real PNG: a blue square (so the browser decodes it and the preview has a size)."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    rows = b"".join(b"\x00" + b"\x20\x60\xc0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


class Vendor(http.server.BaseHTTPRequestHandler):
    """`POST /v1/images/generations` answers one base64 image, as the OpenAI API does."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/images/generations":
            self.send_error(404)
            return
        body = json.dumps({"data": [{"b64_json": base64.b64encode(png()).decode()}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Chat(http.server.BaseHTTPRequestHandler):
    """`POST /v1/chat/completions` streamed as the OpenAI API streams it: `turns` in order,
    each a list of tool calls (name, arguments) or a text."""

    turns = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        turn = Chat.turns.pop(0) if Chat.turns else "done"
        if isinstance(turn, str):
            deltas, finish = [{"role": "assistant", "content": turn}], "stop"
        else:
            calls = [{"index": i, "id": f"call_{i}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments)}}
                     for i, (name, arguments) in enumerate(turn)]
            deltas, finish = [{"role": "assistant", "tool_calls": calls}], "tool_calls"
        chunk = lambda delta, done: {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                     "model": "fake-chat",
                                     "choices": [{"index": 0, "delta": delta, "finish_reason": done}]}
        frames = [chunk(d, None) for d in deltas] + [chunk({}, finish)]
        usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-chat",
                 "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for frame in frames + [usage]:
            self.wfile.write(f"data: {json.dumps(frame)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


class GitHub(http.server.BaseHTTPRequestHandler):
    """GitHub's REST API as CI triage reads it: pull request #4 of acme/widgets at head
    `abc123`, whose workflow `CI` failed in its job `test`."""

    ANSWERS = {
        "/repos/acme/widgets/pulls/4": {"id": 2004, "number": 4, "title": "console pull", "state": "open",
                                        "updated_at": "2026-01-01T00:00:00Z",
                                        "head": {"sha": "abc123", "ref": "feature"}},
        "/repos/acme/widgets/actions/runs": {"workflow_runs": [{"id": 31, "name": "CI", "conclusion": "failure"}]},
        "/repos/acme/widgets/actions/runs/31/jobs": {"jobs": [{"id": 501, "name": "test", "conclusion": "failure"}]},
        "/repos/acme/widgets/commits/abc123/check-runs": {"check_runs": []},
    }

    def do_GET(self):
        route = self.path.split("?")[0]
        if route == "/repos/acme/widgets/actions/jobs/501/logs":
            body, kind = b"error: the widget test failed\n", "text/plain"
        elif route in GitHub.ANSWERS:
            body, kind = json.dumps(GitHub.ANSWERS[route]).encode(), "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def ok(answer, status=(200, 201, 202)):
    code, body = answer
    assert code in status, (code, body)
    return body["data"]


def listed(page, path, deadline_s=30):
    """The first page of `path`'s list once it has an entry, polled from the page (a worker
    fills it); fails after `deadline_s`. (wait_for_function cannot wait on a fetch: it takes
    the promise an async predicate returns as truthy at once.)"""
    deadline = time.monotonic() + deadline_s
    while True:
        data = ok(api(page, "GET", path))
        if data:
            return data
        assert time.monotonic() < deadline, f"{path} stayed empty for {deadline_s} s"
        time.sleep(0.1)


def approved_run(page, command):
    """A shell task started and approved through the API from the page; returns the task."""
    task = ok(api(page, "POST", "/v1/tasks", {"execution_kind": "shell", "shell_command": command}))
    ok(api(page, "POST", f"/v1/tasks/{task['id']}/start", {}))
    approval = listed(page, f"/v1/tasks/{task['id']}/approvals?status=pending")[0]
    ok(api(page, "POST", f"/v1/tasks/{task['id']}/approvals/{approval['id']}/resolve", {"decision": "approve"}))
    return task


def open_page(page, route):
    page.goto(page.url.split("#")[0] + route)


def test_the_queue_page_shows_depth_and_the_chart_bars_after_runs(console):
    page = console.signed_in_page()
    # A paused workspace keeps its approved run in the queue: depth 1 for kind `run`.
    limits = "/v1/workspaces/default/limits"
    ok(api(page, "PUT", limits, {"max_concurrent": 0}))
    approved_run(page, "echo queued-run")
    open_page(page, "#/queue")
    row = page.locator("tr").filter(has=page.locator("span.kind", has_text="run"))
    expect(row.locator("td").nth(1)).to_have_text("1")
    # Unpaused, the run and two more finish: the chart draws their bucket.
    ok(api(page, "PUT", limits, {"max_concurrent": None}))
    approved_run(page, "echo second")
    approved_run(page, "echo third")
    expect(page.locator("svg.throughput rect.bar").first).to_be_visible()
    expect(page.locator("figure.chart figcaption")).to_contain_text("3 jobs completed")
    expect(row.locator("td").nth(1)).to_have_text("0")
    expect(page.get_by_role("heading", name="Live workers (1)")).to_be_visible()
    screenshot(page, "queue")


def test_a_media_job_shows_its_image_preview_and_providers_show_readiness_without_the_secret(console):
    vendor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Vendor)
    threading.Thread(target=vendor.serve_forever, daemon=True).start()
    try:
        page = console.signed_in_page()
        templates = ok(api(page, "GET", "/v1/provider-templates"))
        preset = dict(next(t for t in templates if t["template_id"] == "openai-images"))
        preset.pop("template_id", None)
        preset.pop("description", None)
        preset.update(base_url=f"http://127.0.0.1:{vendor.server_port}/v1", api_key_ref=f"env:{CANARY_ENV}", enabled=True)
        provider = ok(api(page, "POST", "/v1/providers", preset))
        job = ok(api(page, "POST", "/v1/media-jobs", {"provider_id": provider["id"], "operation": "image_generate",
                                                      "prompt": "a lighthouse at dusk"}))
        ok(api(page, "POST", f"/v1/media-jobs/{job['id']}/run"))

        open_page(page, "#/media")
        page.get_by_role("link", name=job["id"]).click()
        expect(page.locator(".details")).to_contain_text("succeeded")
        preview = page.locator("img.preview")
        expect(preview).to_be_visible()
        page.wait_for_function("(img) => img.complete && img.naturalWidth === 16", arg=preview.element_handle())
        expect(page.get_by_role("button", name="Cancel")).to_be_disabled()
        screenshot(page, "media-job")
        open_page(page, "#/media?status=succeeded")
        expect(page.get_by_role("link", name=job["id"])).to_be_visible()
        screenshot(page, "media")

        open_page(page, "#/providers")
        row = page.locator("tr").filter(has_text=provider["display_name"])
        expect(row.locator(".secret-status")).to_contain_text("ready")
        row.get_by_role("button", name="Check").click()
        expect(row.locator(".check-result")).to_contain_text("ready")
        screenshot(page, "providers")
        for text in (page.content(), page.inner_text("body")):
            assert CANARY not in text, "a secret value reached the page"
    finally:
        vendor.shutdown()


def test_the_schedules_page_shows_the_next_fire_time_in_its_zone(console):
    page = console.signed_in_page()
    task = ok(api(page, "POST", "/v1/tasks", {"execution_kind": "shell", "shell_command": "echo nightly"}))
    schedule = ok(api(page, "PUT", f"/v1/tasks/{task['id']}/schedule",
                      {"kind": "cron", "cron_expression": "0 3 * * *", "timezone": "Asia/Tokyo", "enabled": True}))
    open_page(page, "#/schedules")
    row = page.locator("tr").filter(has=page.get_by_role("link", name=task["id"]))
    expect(row.locator(".next-fire")).to_contain_text("Asia/Tokyo")
    expect(row.locator(".next-fire")).to_contain_text("3:00")
    # The browser's zone, with the UTC instant on hover.
    expect(row.locator("time")).to_have_attribute("datetime", schedule["next_run_at"])
    expect(row.locator("time")).to_have_attribute("title", schedule["next_run_at"].replace("T", " ").split(".")[0].rstrip("Z") + "Z (UTC)")
    row.get_by_role("button", name="Occurrences").click()
    expect(page.get_by_role("heading", name=f"Occurrences of {schedule['id']}")).to_be_visible()
    expect(page.get_by_text("It has not fired yet.")).to_be_visible()
    screenshot(page, "schedules")


def test_the_usage_and_external_work_pages_render(console):
    page = console.signed_in_page()
    github = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GitHub)
    threading.Thread(target=github.serve_forever, daemon=True).start()
    try:
        external_work_page(page, f"http://127.0.0.1:{github.server_address[1]}")
    finally:
        github.shutdown()
    open_page(page, "#/usage")
    expect(page.get_by_role("heading", name="Totals")).to_be_visible()
    expect(page.get_by_text("No model calls in this window.")).to_be_visible()
    screenshot(page, "usage")


def external_work_page(page, github):
    source = ok(api(page, "POST", "/v1/external-work/sources", {"workflow_markdown":
        f"---\ntracker: {{kind: github, repository: acme/widgets, endpoint: '{github}'}}\n"
        "task: {execution_kind: shell, shell_command: echo ext}\n---\nWork on {{ issue.title }}"}))
    payload = {"number": 3, "state": "open", "updated_at": "2026-01-01T00:00:00Z", "title": "console item"}
    ok(api(page, "POST", "/v1/external-work/import", {"source_id": source["id"], "payload": payload}))
    open_page(page, "#/external-work")
    row = page.locator("tr").filter(has_text=source["id"])
    expect(row).to_contain_text("total 1")
    row.get_by_role("button", name="Items").click()
    expect(page.get_by_role("heading", name=f"Items of {source['id']}")).to_be_visible()
    expect(page.locator("section").filter(has_text="Items of").locator("tbody tr")).to_have_count(1)
    # A tracker action approved through the API waits for its execute on this page; Cancel
    # withdraws it (an Execute would send it to api.github.com, which the test cannot reach).
    item = ok(api(page, "GET", f"/v1/external-work/sources/{source['id']}/items"))[0]
    proposed = ok(api(page, "POST", f"/v1/external-work/items/{item['id']}/actions",
                      {"kind": "comment", "body": "From the console test."}))
    approval = proposed["approval"]
    ok(api(page, "POST", f"/v1/tasks/{approval['task_id']}/approvals/{approval['id']}/resolve",
           {"decision": "approve"}))
    page.reload()
    action_row = page.locator("tr").filter(has_text=proposed["action"]["id"])
    expect(action_row.get_by_role("button", name="Execute")).to_be_visible()
    screenshot(page, "external-work")
    action_row.get_by_role("button", name="Cancel").click()
    expect(page.get_by_text("No approved action.")).to_be_visible()
    page.select_option("#action-status", "cancelled")
    expect(page.locator("tr").filter(has_text=proposed["action"]["id"])).to_contain_text("cancelled")
    # A pull request item's CI is triaged from its row: a worker's scan is queued.
    pull = {"id": 2004, "number": 4, "state": "open", "updated_at": "2026-01-01T00:00:00Z", "title": "console pull",
            "head": {"sha": "abc123", "ref": "feature"}}
    ok(api(page, "POST", "/v1/external-work/import", {"source_id": source["id"], "payload": pull}))
    page.reload()
    expect(page.get_by_role("heading", name="CI triage")).to_be_visible()
    expect(page.get_by_text("No triage record yet")).to_be_visible()
    row = page.locator("tr").filter(has_text=source["id"])
    row.get_by_role("button", name="Items").click()
    pull_row = page.locator("tr").filter(has_text="acme/widgets#4")
    pull_row.get_by_role("button", name="Triage CI").click()
    expect(page.locator("#toast")).to_contain_text("CI triage of acme/widgets#4 queued")
    # The worker records the failing job with its fix task; its run starts from here.
    listed(page, "/v1/external-work/ci-triage?status=task_created")
    page.reload()
    record = page.locator("tr").filter(has_text="CI / test")
    expect(record).to_contain_text("task_created")
    record.get_by_role("button", name="Start fix run").click()
    expect(page.locator("#toast")).to_contain_text("Fix run")
    expect(page.locator("tr").filter(has_text="CI / test").get_by_role("link")).to_have_count(1)
    screenshot(page, "external-work-triage")


def test_an_operator_changes_the_approval_policy_and_the_next_start_follows_it(console):
    page = console.signed_in_page()
    # The page's timers on the test's clock (it still runs), to see ages told again.
    page.clock.install()
    open_page(page, "#/policy")
    page.reload()
    expect(page.get_by_text("the process setting (KEEL_APPROVAL_POLICIES)")).to_be_visible()
    # Each gate says what it covers.
    expect(page.locator("#gate-network_egress-covers")).to_contain_text("git commands that reach a remote")
    expect(page.locator("#gate-shell_exec")).to_have_attribute("aria-describedby", "gate-shell_exec-covers")
    page.locator("#gate-shell_exec").select_option("deny")
    page.locator("#policy-mcp").fill("github=ask")
    page.locator("#policy-paths").fill("src")
    page.get_by_role("button", name="Save policy").click()
    expect(page.get_by_text("this workspace's own")).to_be_visible()
    history = page.locator("section").filter(has_text="shell_exec=deny")
    expect(history.locator("tbody tr")).to_have_count(1)
    expect(history).to_contain_text("mcp:github=ask")
    # A change's age grows while the page stays open.
    page.clock.fast_forward("03:00")
    expect(history.locator("time").first).to_contain_text("3 minutes ago")
    shown = ok(api(page, "GET", "/v1/workspaces/default/approval-policy"))
    assert shown["gates"]["shell_exec"] == "deny" and shown["allowed_write_paths"] == ["src"], shown
    task = ok(api(page, "POST", "/v1/tasks", {"execution_kind": "shell", "shell_command": "echo no"}))
    code, body = api(page, "POST", f"/v1/tasks/{task['id']}/start", {})
    assert code == 403 and "denies shell_exec" in body["error"]["message"], (code, body)
    screenshot(page, "policy")
    page.get_by_role("button", name="Use the process setting").click()
    expect(page.get_by_text("the process setting (KEEL_APPROVAL_POLICIES)")).to_be_visible()
    expect(page.locator("section").filter(has_text="Changes").locator("tbody tr")).to_have_count(2)


def proposal(name, text):
    return ("apply_patch", {"patch": f"--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+{text}\n",
                            "propose": True})


def test_a_run_page_applies_one_proposed_change_and_discards_another(console):
    chat = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=chat.serve_forever, daemon=True).start()
    answer = ("I **proposed both**:\n\n- `kept.txt`\n- dropped.txt\n\n```\ngit diff\n```\n"
              "<img src=x onerror=alert(1)> [docs](https://example.com/a) [bad](javascript:alert(1))")
    Chat.turns = [[proposal("kept.txt", "kept"), proposal("dropped.txt", "dropped")], answer]
    try:
        page = console.signed_in_page()
        ok(api(page, "POST", "/v1/providers", {
            "kind": "openai-compatible", "model": "fake-chat", "api": "openai-completions",
            "base_url": f"http://127.0.0.1:{chat.server_port}/v1", "api_key_ref": f"env:{CANARY_ENV}",
            "capabilities": ["chat", "tool_call"], "enabled": True}))
        task = ok(api(page, "POST", "/v1/tasks", {"execution_kind": "agent_loop", "prompt": "propose"}))
        run = ok(api(page, "POST", f"/v1/tasks/{task['id']}/start", {}))
        # The process setting asks before file writers, proposals included: approve the bundle.
        pending = f"/v1/tasks/{task['id']}/approvals?status=pending"
        deadline = time.monotonic() + 30
        while not (approvals := ok(api(page, "GET", pending))):
            assert time.monotonic() < deadline, "no approval for the proposals"
            page.wait_for_timeout(100)
        # The run's transcript holds the approval with its decisions: approved from there.
        # The page follows it from the stream's frames, never reading it whole.
        whole_reads = []
        page.on("request", lambda r: r.url.split("?")[0].endswith("/transcript") and whole_reads.append(r.url))
        open_page(page, f"#/runs/{task['id']}/{run['id']}")
        conversation = page.locator("#conversation")
        gate = conversation.locator(".turn.approval")
        expect(gate).to_contain_text("pending")
        expect(gate).to_contain_text("kept.txt")
        gate.get_by_role("button", name="Approve").click()
        expect(page.locator("#run-status")).to_have_text("completed")
        expect(gate).to_contain_text("approved")
        assert ok(api(page, "GET", f"/v1/tasks/{task['id']}/approvals/{approvals[0]['id']}"))["status"] == "approved"
        # The agent's run reads as its conversation: the prompt, the answer, each tool call.
        expect(conversation.locator(".turn.user")).to_contain_text("propose")
        said = conversation.locator(".turn.assistant").last
        expect(said).to_contain_text("proposed both")
        # The answer's Markdown as elements; its markup as text, its script link as text.
        expect(said.locator("strong")).to_have_text("proposed both")
        expect(said.locator("li")).to_have_count(2)
        expect(said.locator("li code")).to_have_text("kept.txt")
        expect(said.locator("pre code")).to_have_text("git diff")
        expect(said).to_contain_text("<img src=x onerror=alert(1)>")
        expect(said.locator("img")).to_have_count(0)
        expect(said.locator("a")).to_have_count(1)
        expect(said.locator("a")).to_have_attribute("href", "https://example.com/a")
        expect(conversation.locator(".turn.assistant").first).to_contain_text("10 in, 5 out")
        calls = conversation.locator("details.turn.tool")
        expect(calls).to_have_count(2)
        calls.first.locator("summary").click()
        expect(calls.first).to_contain_text("kept.txt")
        expect(conversation.locator(".turn.file").first).to_contain_text("kept.txt")
        assert whole_reads == [], whole_reads
        # A file change opens as its diff; the context as the layers the run started from.
        conversation.locator(".turn.file").first.locator("summary").click()
        expect(conversation.locator(".turn.file").first.locator("pre.diff")).to_contain_text("+ kept")
        context = page.locator("details.context")
        context.locator("summary").click()
        expect(context).to_contain_text("Layers")
        expect(page.get_by_role("heading", name="stdout")).to_have_count(0)
        screenshot(page, "run-conversation")
        element_screenshot(conversation, "run-transcript")
        changes = page.locator("section").filter(has=page.get_by_role("heading", name="File changes"))
        kept = changes.locator("tr").filter(has_text="kept.txt")
        dropped = changes.locator("tr").filter(has_text="dropped.txt")
        expect(kept).to_contain_text("proposed")
        expect(dropped).to_contain_text("proposed")
        page.get_by_role("button", name="Apply kept.txt").click()
        expect(kept).to_contain_text("applied")
        kept.locator("details.patch summary").click()
        expect(kept.locator("pre.diff")).to_contain_text("+ kept")
        expect(kept.get_by_role("button", name="Revert kept.txt")).to_be_enabled()
        page.get_by_role("button", name="Discard dropped.txt").click()
        expect(dropped).to_contain_text("discarded")
        expect(dropped.get_by_role("button")).to_have_count(0)
        changes.scroll_into_view_if_needed()
        screenshot(page, "run-patches")
        patches = ok(api(page, "GET", f"/v1/tasks/{task['id']}/runs/{run['id']}/patches"))
        assert sorted((p["path"], p["status"]) for p in patches) == [
            ("dropped.txt", "discarded"), ("kept.txt", "applied")], patches
        # The runs of every task, filtered by status: this one is there, and leads back.
        open_page(page, "#/runs?status=completed")
        expect(page.get_by_role("heading", name="Runs that are completed")).to_be_visible()
        page.get_by_role("link", name=run["id"]).click()
        expect(page.locator("#run-status")).to_have_text("completed")
        open_page(page, "#/runs?status=awaiting_approval")
        expect(page.get_by_role("link", name=run["id"])).to_have_count(0)
    finally:
        chat.shutdown()


# Every page of the navigation, with the rows the tests above left.
NAVIGATION = ["#/tasks", "#/runs", "#/approvals", "#/policy", "#/schedules", "#/media",
              "#/providers", "#/queue", "#/external-work", "#/usage"]

# What scrolls sideways on the page: the document, and each element that holds more than
# it shows (a table in its box, a heading, a list of facts). `pre` blocks scroll by design.
OVERFLOW = """() => {
  const over = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth) over.push(`the page by ${doc.scrollWidth - doc.clientWidth} px`);
  for (const node of document.querySelectorAll('main *')) {
    if (node.closest('pre, .visually-hidden') || node.clientWidth === 0) continue;
    const style = getComputedStyle(node);
    if (!['auto', 'scroll'].includes(style.overflowX) && style.overflowX !== 'hidden') continue;
    if (node.scrollWidth > node.clientWidth + 1) {
      over.push(`${node.tagName.toLowerCase()}.${node.className} by ${node.scrollWidth - node.clientWidth} px`);
    }
  }
  return over;
}"""


def test_every_page_fits_1280_by_800_without_sideways_scrolling(console):
    page = console.signed_in_page()
    phone = console.signed_in_page(NARROW)
    task = ok(api(page, "GET", "/v1/tasks?limit=1"))[0]
    routes = NAVIGATION + [f"#/tasks/{task['id']}", f"#/runs/{task['id']}/{task['latest_run_id']}"]
    scrolling = {}
    for route in routes:
        open_page(page, route)
        page.locator("main h1").wait_for()
        page.wait_for_load_state("networkidle")
        if over := page.evaluate(OVERFLOW):
            scrolling[route] = over
        # Every page as a person sees it, wide and on a phone, for CI's output.
        parts = route.strip("#/").split("/")
        # A list is named by its page, one of its rows by the page's singular.
        name = parts[0] if len(parts) == 1 else parts[0].rstrip("s")
        ci_screenshot(page, f"wide-{name}")
        open_page(phone, route)
        phone.locator("main h1").wait_for()
        phone.wait_for_load_state("networkidle")
        ci_screenshot(phone, f"phone-{name}")
    assert not scrolling, f"pages that scroll sideways at 1280 px: {scrolling}"


TESTS = [
    test_the_queue_page_shows_depth_and_the_chart_bars_after_runs,
    test_a_media_job_shows_its_image_preview_and_providers_show_readiness_without_the_secret,
    test_the_schedules_page_shows_the_next_fire_time_in_its_zone,
    test_the_usage_and_external_work_pages_render,
    test_an_operator_changes_the_approval_policy_and_the_next_start_follows_it,
    test_a_run_page_applies_one_proposed_change_and_discards_another,
    test_every_page_fits_1280_by_800_without_sideways_scrolling,
]

if __name__ == "__main__":
    # keel serve inherits these: the media preset's key (the canary), a vendor on
    # loopback, and per-workspace limits applied at claims (the queue test pauses one).
    os.environ.update({
        CANARY_ENV: CANARY,
        "KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES": "1",
        "KEEL_PROVIDER_HOSTS": "127.0.0.1",
        "KEEL_MAX_CONCURRENT_PER_WORKSPACE": "8",
        "KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES": "true",
    })
    with Console(sys.argv[1] if len(sys.argv) > 1 else "target/debug/keel") as console:
        sys.exit(0 if run_tests(console, TESTS) else 1)

"""Browser tests of the console's shell and core pages against a real `keel serve`
(issue 20): signing in, tasks, approvals, the live run page, cancelling, CSRF, narrow
screens. Writes docs/screenshots/*.png.

    python3 tests/console/console_test.py path/to/keel
"""

import re
import subprocess
import sys

sys.dont_write_bytecode = True  # noqa: E402  (no __pycache__ beside the sources)

from playwright.sync_api import expect

from harness import NARROW, Console, run_tests, screenshot


def test_a_wrong_token_is_refused_and_the_right_one_signs_in(console):
    page = console.page()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    screenshot(page, "sign-in")
    console.sign_in(page, "not-the-runtime-token")
    expect(page.get_by_role("alert")).to_contain_text("missing or invalid credentials")
    console.sign_in(page)
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
    expect(page.locator("#who")).to_contain_text("local")
    cookies = page.context.cookies()
    session = [c for c in cookies if c["name"] == "keel_session"]
    assert session and session[0]["httpOnly"] and session[0]["sameSite"] == "Strict", cookies
    assert console.token not in session[0]["value"], "the cookie is not the token"


def test_a_sign_in_link_from_keel_console_signs_in_once(console):
    command = [console.keel, "--url", console.base, f"--token={console.token}", "console"]
    link = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    assert link.startswith(f"{console.base}/console#sign-in="), link
    page = console.page(url=link)
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
    assert "sign-in" not in page.url, "the spent code is off the address bar"
    # Used up: the same link in another browser shows the sign-in form and why.
    again = console.page(url=link)
    expect(again.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(again.get_by_role("alert")).to_contain_text("missing or invalid credentials")


API = """async ([method, path, body, csrf]) => {
    const headers = { 'Content-Type': 'application/json' };
    if (csrf === true) {
        headers['X-Keel-CSRF'] = (await (await fetch('/console/session')).json()).data.csrf_token;
    } else if (csrf) {
        headers['X-Keel-CSRF'] = csrf;
    }
    const response = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
    return [response.status, await response.json()];
}"""


def api(page, method, path, body=None, csrf=True):
    """A request from the page itself (its cookie; the session's CSRF header unless told)."""
    return page.evaluate(API, [method, path, body, csrf])


def create_and_open_run(page, command):
    """Creates a shell task with the page's form and starts it: the page shows its run."""
    page.goto(page.url.split("#")[0] + "#/tasks")
    page.get_by_label("Shell command").fill(command)
    page.get_by_role("button", name="Create task").click()
    expect(page).to_have_url(re.compile(r"#/runs/task_[^/]+/run_"))
    expect(page.locator("#run-status")).to_have_text("awaiting_approval")
    return page.url


def approve_in_inbox(page, command, note):
    """Approves the pending approval whose summary shows `command`, from the inbox."""
    page.get_by_role("link", name="Approvals").click()
    card = page.locator("article[data-approval]").filter(has_text=command)
    expect(card).to_be_visible()
    expect(card.locator("pre.summary")).to_contain_text(command)
    card.get_by_label("Note (optional)").fill(note)
    return card


def test_a_task_is_approved_from_the_inbox_and_its_run_completes_live(console):
    command = "echo console-line-one \u00fc; echo console-line-two >&2; sleep 1; echo console-line-three"
    watcher = console.signed_in_page()
    run_url = create_and_open_run(watcher, command)
    expect(watcher.get_by_role("heading", name="Waiting for approval")).to_be_visible()
    # Another tab of the same browser decides, while the first one watches the run.
    inbox = watcher.context.new_page()
    inbox.goto(run_url)
    card = approve_in_inbox(inbox, command, "checked by the browser test")
    screenshot(inbox, "approvals")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_have_count(0)
    expect(watcher.locator("#run-status")).to_have_text("completed")
    # Read in pieces as it grew (each poll fetches the bytes after those shown): each line
    # once, in order, the two-byte character whole.
    expect(watcher.locator("#stdout")).to_have_text("console-line-one \u00fc\nconsole-line-three\n")
    expect(watcher.locator("#stderr")).to_contain_text("console-line-two")
    expect(watcher.locator("#events li[data-type='run.started']")).to_have_count(1)
    expect(watcher.locator("#events li[data-type='approval.resolved']")).to_have_count(1)
    expect(watcher.locator(".live")).to_have_text("stream ended")
    expect(watcher.get_by_role("button", name="Retry")).to_be_enabled()
    expect(watcher.get_by_role("button", name="Cancel")).to_be_disabled()
    screenshot(watcher, "run")
    _, approvals = api(watcher, "GET", "/v1/approvals?status=approved")
    assert any(a["decision_note"] == "checked by the browser test" for a in approvals["data"]), approvals

    # Its task page lists the run; a retry from the run page links back to it.
    # The run page leads back to its task by the task's title.
    watcher.get_by_role("link", name=re.compile("^\u2190 Task: echo console-line-one")).click()
    expect(watcher.get_by_role("heading", name="Runs")).to_be_visible()
    expect(watcher.locator("table").get_by_role("link", name="run 1")).to_be_visible()
    screenshot(watcher, "task")
    watcher.goto(run_url)
    watcher.get_by_role("button", name="Retry").click()
    expect(watcher.get_by_role("heading", name=re.compile("^Run 2 of"))).to_be_visible()
    expect(watcher.locator(".details")).to_contain_text("retry of run_")
    watcher.get_by_role("link", name=re.compile("^run_")).click()
    expect(watcher.get_by_role("heading", name=re.compile("^Run 1 of"))).to_be_visible()
    expect(watcher.locator(".details")).to_contain_text("run 2 (retry)")


def test_a_long_run_is_cancelled_from_its_page(console):
    command = "sleep 60"
    page = console.signed_in_page()
    run_url = create_and_open_run(page, command)
    inbox = page.context.new_page()
    inbox.goto(run_url)
    approve_in_inbox(inbox, command, "to be cancelled").get_by_role("button", name="Approve").click()
    expect(page.locator("#run-status")).to_have_text("running")
    expect(page.get_by_role("button", name="Retry")).to_be_disabled()
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#run-status")).to_have_text("cancelled")
    expect(page.locator("#events li[data-type='run.cancelled']")).to_have_count(1)
    expect(page.get_by_role("button", name="Cancel")).to_be_disabled()


def test_changes_without_the_sessions_csrf_header_are_refused(console):
    page = console.signed_in_page()
    draft = {"execution_kind": "shell", "shell_command": "true"}
    for csrf in (False, "not-the-csrf-token"):
        status, body = api(page, "POST", "/v1/tasks", draft, csrf)
        assert status == 403 and body["error"]["type"] == "forbidden", (csrf, status, body)
        assert "X-Keel-CSRF" in body["error"]["message"], body
    status, body = api(page, "POST", "/v1/tasks", draft)
    assert status == 201, body
    # Reads need no CSRF header; the cookie alone reads.
    status, _ = api(page, "GET", f"/v1/tasks/{body['data']['id']}", None, False)
    assert status == 200


def test_the_task_list_filters_by_status_and_pages_through(console):
    page = console.signed_in_page()
    for n in range(21):
        status, body = api(page, "POST", "/v1/tasks", {"execution_kind": "shell", "shell_command": f"echo page-{n}"})
        assert status == 201, body
    page.reload()
    rows = page.locator("table tbody tr")
    expect(rows).to_have_count(20)
    expect(page.get_by_role("button", name="Previous")).to_be_disabled()
    page.get_by_role("button", name="Next").click()
    expect(page.get_by_text("page 2")).to_be_visible()
    expect(page.get_by_role("button", name="Previous")).to_be_enabled()
    page.get_by_role("button", name="Previous").click()
    expect(page.get_by_text("page 1")).to_be_visible()
    expect(rows).to_have_count(20)
    screenshot(page, "tasks")
    page.get_by_label("Status").select_option("cancelled")
    expect(page).to_have_url(re.compile(r"#/tasks\?status=cancelled$"))
    expect(page.get_by_role("heading", name="Tasks that are cancelled")).to_be_visible()
    statuses = page.locator("table tbody tr td:nth-child(3)")
    expect(statuses.first).to_have_text("cancelled")
    assert set(statuses.all_inner_texts()) == {"cancelled"}, statuses.all_inner_texts()
    page.get_by_label("Status").select_option("running")
    expect(page.get_by_text("No task is running.")).to_be_visible()


def test_console_responses_carry_strict_headers(console):
    page = console.page()
    response = page.goto(f"{console.base}/console")
    headers = response.headers
    policy = headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"):
        assert directive in policy, policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, policy
    assert headers["x-content-type-options"] == "nosniff", headers
    assert headers["referrer-policy"] == "same-origin", headers
    asset = page.request.get(f"{console.base}/console/assets/app.js")
    assert asset.headers["cache-control"] == "no-cache" and asset.headers["etag"], asset.headers
    again = page.request.get(f"{console.base}/console/assets/app.js",
                             headers={"If-None-Match": asset.headers["etag"]})
    assert again.status == 304, again.status
    missing = page.request.get(f"{console.base}/console/assets/nothing.js")
    assert missing.status == 404 and missing.json()["error"]["type"] == "not_found"
    # Signed out, the API refuses the browser; `/` leads to the console.
    assert page.request.get(f"{console.base}/v1/tasks").status == 401
    assert page.request.get(f"{console.base}/").url.endswith("/console")


def test_signing_out_ends_the_session(console):
    page = console.signed_in_page()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    status, _ = api(page, "GET", "/v1/tasks", None, False)
    assert status == 401, status


def test_every_page_fits_a_390_px_screen_without_sideways_scrolling(console):
    page = console.signed_in_page(NARROW)
    _, tasks = api(page, "GET", "/v1/tasks?status=cancelled&limit=1")
    task = tasks["data"][0]
    routes = ["#/tasks", "#/approvals", f"#/tasks/{task['id']}", f"#/runs/{task['id']}/{task['latest_run_id']}"]
    for route in routes:
        page.goto(f"{console.base}/console{route}")
        page.locator("main h1").wait_for()
        page.wait_for_load_state("networkidle")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{route} scrolls sideways by {overflow} px"


def test_keyboard_alone_signs_in_and_reaches_the_navigation(console):
    page = console.page()
    page.get_by_label("Runtime token").wait_for()
    page.keyboard.type(console.token)  # the token field has the focus
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.get_by_label("Shell command (sh -c)")).to_be_focused()
    # Backwards through the navigation to its Approvals link, within a bounded number of
    # steps: every nav link must be reachable by keyboard, whatever pages come after it.
    approvals = page.get_by_role("link", name="Approvals")
    for _ in range(20):
        page.keyboard.press("Shift+Tab")
        if approvals.evaluate("link => link === document.activeElement"):
            break
    expect(approvals).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Approvals")).to_be_visible()


TESTS = [
    test_a_wrong_token_is_refused_and_the_right_one_signs_in,
    test_a_sign_in_link_from_keel_console_signs_in_once,
    test_console_responses_carry_strict_headers,
    test_changes_without_the_sessions_csrf_header_are_refused,
    test_a_task_is_approved_from_the_inbox_and_its_run_completes_live,
    test_a_long_run_is_cancelled_from_its_page,
    test_the_task_list_filters_by_status_and_pages_through,
    test_every_page_fits_a_390_px_screen_without_sideways_scrolling,
    test_keyboard_alone_signs_in_and_reaches_the_navigation,
    test_signing_out_ends_the_session,
]


def main():
    keel = sys.argv[1] if len(sys.argv) > 1 else "target/debug/keel"
    with Console(keel) as console:
        ok = run_tests(console, TESTS)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""Browser tests of the console in remote mode (the header identity form, X-Keel-Role
counted) against a real `keel serve`: the approvals inbox offers approve and reject only to
a caller the API lets decide them, not to a member and not to the requester of an
approval while self-approval is refused.

    python3 tests/console/roles_test.py path/to/keel
"""

import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

sys.dont_write_bytecode = True  # noqa: E402  (no __pycache__ beside the sources)

from playwright.sync_api import expect

from harness import TIMEOUT_MS, WIDE, Console, run_tests

RUNTIME_ID = "rt_console_roles"
# The buttons that decide an approval (a card also has its ids' copy buttons).
DECISION = re.compile("^(Approve|Reject)")


class RemoteConsole(Console):
    """A `keel serve` in remote mode; its pages carry a trusted proxy's headers."""

    def __init__(self, keel):
        super().__init__(keel)
        self.secret = secrets.token_urlsafe(32)

    def start_server(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = dict(os.environ, KEEL_REMOTE_MODE="1", KEEL_RUNTIME_ID=RUNTIME_ID,
                   KEEL_REMOTE_SHARED_SECRET=self.secret, KEEL_REMOTE_ROLE_HEADER="1",
                   KEEL_DATA_DIR=os.path.join(self.data.name, "keel"),
                   KEEL_LISTEN=f"127.0.0.1:{port}")
        env.pop("KEEL_APPROVAL_POLICIES", None)  # the default gates shell runs
        env.pop("KEEL_ALLOW_SELF_APPROVAL", None)
        log = open(os.path.join(self.data.name, "serve.log"), "wb")
        server = subprocess.Popen([self.keel, "serve"], env=env, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, "keel serve exited"
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2)
                return server, base, None
            except OSError:
                assert time.monotonic() < deadline, "keel serve did not answer"
                time.sleep(0.5)

    def page_as(self, actor, role):
        """The console as `actor` of org_a with `role`, as a trusted proxy would send it."""
        headers = {"X-Keel-Remote-Secret": self.secret, "X-Keel-Actor-Id": actor,
                   "X-Keel-Org-Id": "org_a", "X-Keel-Runtime-Id": RUNTIME_ID, "X-Keel-Role": role}
        context = self.browser.new_context(viewport=WIDE, extra_http_headers=headers)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        page.goto(f"{self.base}/console")
        expect(page.locator("#who")).to_contain_text(actor)
        return page


START = """async (command) => {
    const post = async (path, body) => {
        const response = await fetch(path, { method: 'POST',
            headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
        return [response.status, await response.json()];
    };
    const [created, task] = await post('/v1/tasks', { execution_kind: 'shell', shell_command: command });
    if (created !== 201) return [created, task];
    return post(`/v1/tasks/${task.data.id}/start`, {});
}"""


def start_gated_run(page, command):
    """Starts a shell run from the page as its caller; the default policy gates it."""
    status, run = page.evaluate(START, command)
    assert status == 201, run
    assert run["data"]["status"] == "awaiting_approval", run
    assert run["data"]["requested_by"], run


def card_of(page, command):
    page.goto(page.url.split("#")[0] + "#/approvals")
    card = page.locator("article.approval").filter(has_text=command)
    expect(card).to_be_visible()
    return card


def test_the_inbox_offers_decisions_only_to_a_caller_who_may_make_them(console):
    member = console.page_as("member_a", "member")
    operator = console.page_as("operator_a", "operator")
    start_gated_run(member, "echo requested by the member")
    start_gated_run(operator, "echo requested by the operator")

    # A member sees what waits and who asked, and is offered no decision.
    card = card_of(member, "echo requested by the member")
    expect(card).to_contain_text("Requested by member_a")
    expect(card).to_contain_text("Only an operator decides approvals.")
    expect(card.get_by_role("button", name=DECISION)).to_have_count(0)

    # The operator is not offered its own request, and decides the member's.
    own = card_of(operator, "echo requested by the operator")
    expect(own).to_contain_text("You requested this; another operator decides it.")
    expect(own.get_by_role("button", name=DECISION)).to_have_count(0)
    theirs = card_of(operator, "echo requested by the member")
    theirs.get_by_role("button", name="Approve").click()
    expect(operator.locator("article.approval").filter(has_text="echo requested by the member")).to_have_count(0)
    expect(card_of(operator, "echo requested by the operator")).to_be_visible()


TESTS = [test_the_inbox_offers_decisions_only_to_a_caller_who_may_make_them]


def main():
    keel = sys.argv[1] if len(sys.argv) > 1 else "target/debug/keel"
    with RemoteConsole(keel) as console:
        ok = run_tests(console, TESTS)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

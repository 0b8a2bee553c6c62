"""The console tests' harness: a throwaway `keel serve` (started the way the RPC
conformance test starts one, with a runtime token and the default approval gates) and
Debian's headless Chromium driven by Playwright. Part 2's tests import it too.

    with Console(keel) as console:
        page = console.signed_in_page()
"""

import os
import sys
import tempfile
import traceback

from playwright.sync_api import expect, sync_playwright

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from rpc_conformance import serve  # noqa: E402  (the one way the Python tests start keel)

CHROMIUM = os.environ.get("KEEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = os.path.join(ROOT, "docs", "screenshots")
CI_SCREENSHOTS = os.path.join(ROOT, "target", "screenshots")
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
# How long a condition may take to hold (a run going through approval and a worker).
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)


class Console:
    """A keel serve and a browser for one test run."""

    def __init__(self, keel):
        self.keel = os.path.abspath(keel)

    def __enter__(self):
        self.data = tempfile.TemporaryDirectory(prefix="keel-console-")
        os.chmod(self.data.name, 0o755)
        self.server, self.base, self.token = self.start_server()
        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        return self

    def __exit__(self, *exc):
        try:
            self.browser.close()
            self.playwright.stop()
        finally:
            self.server.terminate()
            self.server.wait(timeout=60)
            self.data.cleanup()

    def start_server(self):
        """The process under test, its base URL and its runtime token: `keel serve` (in
        local mode) writing `serve.log` into the data directory."""
        return serve(self.keel, self.data.name)

    def page(self, viewport=WIDE, url=None):
        """A fresh page in a fresh browser context (no cookies), on the console (or `url`)."""
        context = self.browser.new_context(viewport=viewport)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        page.goto(url or f"{self.base}/console")
        return page

    def sign_in(self, page, token=None):
        """Signs the page in with the token (the runtime's unless told otherwise)."""
        page.get_by_label("Runtime token").fill(token or self.token)
        page.get_by_role("button", name="Sign in").click()

    def signed_in_page(self, viewport=WIDE):
        page = self.page(viewport)
        self.sign_in(page)
        page.get_by_role("link", name="Tasks", exact=True).wait_for()
        return page

    def log_tail(self, lines=40):
        with open(os.path.join(self.data.name, "serve.log"), "rb") as log:
            return b"\n".join(log.read().splitlines()[-lines:]).decode(errors="replace")


def screenshot(page, name):
    """The page as docs/screenshots/NAME.png, from its top, at the size it is shown (without
    a passing notice)."""
    os.makedirs(SCREENSHOTS, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0); document.getElementById('toast')?.classList.remove('shown')")
    page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), animations="disabled")


def ci_screenshot(page, name):
    """The whole page as target/screenshots/NAME.png: every page, wide and narrow, for CI's
    output (docs/screenshots keeps the few the docs show)."""
    os.makedirs(CI_SCREENSHOTS, exist_ok=True)
    page.evaluate("document.getElementById('toast')?.classList.remove('shown')")
    page.screenshot(path=os.path.join(CI_SCREENSHOTS, f"{name}.png"), full_page=True, animations="disabled")


def element_screenshot(locator, name):
    """One element whole, however long, as docs/screenshots/NAME.png."""
    os.makedirs(SCREENSHOTS, exist_ok=True)
    locator.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), animations="disabled")


def run_tests(console, tests):
    """Runs each test, reports each, and closes with the `N passed, N failed` line."""
    passed = failed = 0
    for test in tests:
        try:
            test(console)
            passed += 1
            print(f"ok   {test.__name__}", flush=True)
        except Exception:  # a failed test is reported and the others still run
            failed += 1
            print(f"FAIL {test.__name__}", flush=True)
            traceback.print_exc()
            print(console.log_tail(), file=sys.stderr)
    print(f"console: {passed} passed, {failed} failed")
    return failed == 0

"""Browser tests of the console's shell and core pages against a real `keel serve`
(issue 20): signing in, tasks, approvals, the live run page, cancelling, CSRF, narrow
screens. Writes docs/screenshots/*.png.

    python3 tests/console/console_test.py path/to/keel
"""

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


TESTS = [
    test_a_wrong_token_is_refused_and_the_right_one_signs_in,
]


def main():
    keel = sys.argv[1] if len(sys.argv) > 1 else "target/debug/keel"
    with Console(keel) as console:
        ok = run_tests(console, TESTS)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

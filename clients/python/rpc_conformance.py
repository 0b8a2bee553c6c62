"""Conformance of `keel rpc` (NDJSON, seed 002's framing) from a host that is not a Rust
program: starts a `keel serve` of its own, drives `keel rpc --stdio` as a child process
(handshake, create/start/approve, a run's events, every error class) and `keel rpc
--socket` with two clients at once. Standard library only. Exits non-zero on the first
surprise.

    python3 rpc_conformance.py path/to/keel
"""

import json
import os
import queue
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

DEADLINE = 60
OPERATOR_METHODS = {
    "tasks.create", "tasks.list", "tasks.get", "tasks.start", "runs.get", "runs.cancel",
    "approvals.listForTask", "approvals.resolve", "events.subscribe", "events.unsubscribe",
    "media.create", "media.get", "schedules.get", "schedules.set", "harness.methods",
    "daemon.status", "workspaces.policy", "workspaces.setPolicy", "workspaces.resetPolicy",
    "runs.startClient", "runs.append", "runs.applyPatch", "runs.discardPatch",
}


def fail(message):
    raise SystemExit(f"rpc conformance: {message}")


def check(condition, message):
    if not condition:
        fail(message)


class Peer:
    """One NDJSON session: requests out, lines in (each checked to be a protocol line)."""

    def __init__(self, reader, writer):
        self.writer = writer
        self.lines = queue.Queue()
        self.pushed = []
        self.next_id = 1
        threading.Thread(target=self._read, args=(reader,), daemon=True).start()

    def _read(self, reader):
        for line in reader:
            self.lines.put(line)
        self.lines.put(None)

    def send_line(self, line):
        self.writer.write(line + b"\n")
        self.writer.flush()

    def read(self):
        try:
            line = self.lines.get(timeout=DEADLINE)
        except queue.Empty:
            fail(f"no line within {DEADLINE} s")
        check(line is not None, "the session closed")
        try:
            value = json.loads(line)
        except ValueError:
            fail(f"not a protocol line: {line!r}")
        check(isinstance(value, dict) and value.get("v") == 1, f"not a v1 line: {line!r}")
        return value

    def answer(self, request_id):
        while True:
            line = self.read()
            if "id" in line and line["id"] == request_id:
                return line
            check("event" in line or "notice" in line, f"unexpected line {line}")
            self.pushed.append(line)

    def call(self, method, params=None):
        request_id = self.next_id
        self.next_id += 1
        request = {"v": 1, "id": request_id, "method": method, "params": params or {}}
        self.send_line(json.dumps(request).encode())
        return self.answer(request_id)

    def ok(self, method, params=None):
        answer = self.call(method, params)
        check("result" in answer, f"{method}: {answer}")
        return answer["result"]

    def error_code(self, method, params=None):
        answer = self.call(method, params)
        check("error" in answer, f"{method} should fail: {answer}")
        return answer["error"]["code"]

    def next_pushed(self):
        return self.pushed.pop(0) if self.pushed else self.read()


def serve(keel, data):
    """A `keel serve` with a runtime token and the default approval gates (shell runs wait
    for an operator)."""
    token = secrets.token_urlsafe(32)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, KEEL_RUNTIME_TOKEN=token, KEEL_DATA_DIR=os.path.join(data, "keel"),
               KEEL_LISTEN=f"127.0.0.1:{port}")
    env.pop("KEEL_APPROVAL_POLICIES", None)
    log = open(os.path.join(data, "serve.log"), "wb")
    process = subprocess.Popen([keel, "serve"], env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    for _ in range(240):
        check(process.poll() is None, "keel serve exited")
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=2)
            return process, base, token
        except OSError:
            time.sleep(0.5)
    fail("keel serve did not answer")


def rpc_command(keel, base, token, *transport):
    # `--token=`: a URL-safe token may begin with `-`, which a separate argument would make
    # an option.
    return [keel, "--url", base, f"--token={token}", "rpc", *transport]


def handshake(peer, pid):
    described = peer.ok("harness.methods")
    methods = {m["name"]: m for m in described["methods"]}
    missing = OPERATOR_METHODS - set(methods)
    check(not missing, f"harness.methods lacks {sorted(missing)}")
    for method in methods.values():
        check(method["params"].get("type") == "object", f"params of {method['name']}")
    check("body" in methods["tasks.create"]["params"]["properties"], "tasks.create's body")
    status = peer.ok("daemon.status")
    check(status["pid"] == pid and status["live"] is True, f"daemon.status: {status}")


def approved_run(peer):
    body = {"execution_kind": "shell", "shell_command": "echo conformance; echo done"}
    task_id = peer.ok("tasks.create", {"body": body})["data"]["id"]
    run = peer.ok("tasks.start", {"task_id": task_id, "body": {}})["data"]
    check(run["status"] == "awaiting_approval", f"a gated run waits: {run}")
    approvals = peer.ok("approvals.listForTask", {"task_id": task_id})["data"]
    check(len(approvals) == 1 and approvals[0]["status"] == "pending", f"{approvals}")
    subscription = peer.ok("events.subscribe", {"task_id": task_id, "run_id": run["id"]})
    peer.ok("approvals.resolve", {"task_id": task_id, "approval_id": approvals[0]["id"],
                                  "body": {"decision": "approve"}})
    events = []
    while True:
        line = peer.next_pushed()
        if "notice" in line:
            check(line["notice"].get("kind") == "subscription.ended", f"{line}")
            check("error" not in line["notice"], f"{line}")
            break
        check(line["subscription"] == subscription["subscription"], f"{line}")
        events.append(line["event"])
    types = [e["type"] for e in events]
    check(types and types[-1] == "run.finished", f"events end with run.finished: {types}")
    sequences = [e["sequence"] for e in events]
    check(sequences == list(range(1, len(events) + 1)), f"gap-free, once each: {sequences}")
    finished = peer.ok("runs.get", {"task_id": task_id, "run_id": run["id"]})["data"]
    check(finished["status"] == "completed", f"{finished}")
    reads_across_the_workspace(peer, task_id, run["id"])


def reads_across_the_workspace(peer, task_id, run_id):
    """The reads every interface has: runs across tasks, a step by id, a task's artifacts."""
    every = peer.ok("runs.listAll", {"task_id": task_id, "status": "completed"})["data"]
    check([r["id"] for r in every] == [run_id], f"runs.listAll: {every}")
    steps = peer.ok("runs.steps", {"task_id": task_id, "run_id": run_id})["data"]
    step = peer.ok("runs.step", {"task_id": task_id, "run_id": run_id,
                                 "step_id": steps[0]["id"]})["data"]
    check(step["id"] == steps[0]["id"] and step["name"] == steps[0]["name"], f"runs.step: {step}")
    artifacts = peer.ok("tasks.artifacts", {"task_id": task_id})["data"]
    check("stdout" in {a["name"] for a in artifacts}, f"tasks.artifacts: {artifacts}")


def policy_as_data(peer):
    """A workspace's approval policy, set and reset over the RPC, applies to the next start."""
    shown = peer.ok("workspaces.policy", {"workspace_id": "default"})["data"]
    check(shown["source"] == "default" and shown["gates"]["shell_exec"] == "ask", f"{shown}")
    gates = dict(shown["gates"], shell_exec="deny")
    body = {"gates": gates, "allowed_write_paths": ["src"]}
    set_ = peer.ok("workspaces.setPolicy", {"workspace_id": "default", "body": body})["data"]
    check(set_["source"] == "workspace" and set_["allowed_write_paths"] == ["src"], f"{set_}")
    task_id = peer.ok("tasks.create", {"body": {"execution_kind": "shell",
                                                "shell_command": "true"}})["data"]["id"]
    check(peer.error_code("tasks.start", {"task_id": task_id, "body": {}}) == "forbidden",
          "a denied gate refuses the start")
    reset = peer.ok("workspaces.resetPolicy", {"workspace_id": "default"})["data"]
    check(reset["source"] == "default", f"{reset}")
    run = peer.ok("tasks.start", {"task_id": task_id, "body": {}})["data"]
    check(run["status"] == "awaiting_approval", f"the process setting asks again: {run}")
    peer.ok("runs.cancel", {"task_id": task_id, "run_id": run["id"]})


def client_orchestrated(peer):
    """A run the host carries out itself: started over the RPC, its events appended, ended."""
    task_id = peer.ok("tasks.create", {"body": {"execution_kind": "shell",
                                                "shell_command": "true"}})["data"]["id"]
    started = peer.ok("runs.startClient", {"task_id": task_id, "body": {"lease_ms": 30000}})["data"]
    run_id, token = started["run"]["id"], started["lease_token"]
    check(started["run"]["status"] == "running", f"{started}")
    body = {"lease_token": token, "events": [{"kind": "message", "data": {"text": "hi"}}],
            "finish": {"status": "completed"}}
    accepted = peer.ok("runs.append", {"task_id": task_id, "run_id": run_id, "body": body})["data"]
    check(accepted["run"]["status"] == "completed" and accepted["appended"] == 3, f"{accepted}")
    events = peer.ok("runs.events", {"task_id": task_id, "run_id": run_id})["data"]
    types = [e["type"] for e in events]
    check(types == ["run.created", "task.updated", "run.started", "client.event", "task.updated",
                    "run.finished"], f"{types}")
    check(peer.error_code("runs.append", {"task_id": task_id, "run_id": run_id,
                                          "body": {"lease_token": token}}) == "conflict",
          "an ended run takes no append")


def errors(peer):
    peer.send_line(b"{not json")
    line = peer.read()
    check(line.get("id") is None and line["error"]["code"] == "parse_error", f"{line}")
    peer.send_line(b'{"v":2,"id":"old","method":"tasks.list"}')
    check(peer.answer("old")["error"]["code"] == "unsupported_version", "wrong v")
    peer.send_line(b'{"v":1,"id":1,"method":"' + b"x" * (2 << 20) + b'"}')
    line = peer.read()
    check(line.get("id") is None and line["error"]["code"] == "line_too_long", f"{line}")
    check(peer.error_code("tasks.explode") == "method_not_found", "unknown method")
    check(peer.error_code("tasks.get") == "invalid_params", "missing params")
    check(peer.error_code("tasks.get", {"task_id": "task_missing"}) == "not_found", "API error")
    check(peer.ok("daemon.status")["live"] is True, "the session goes on")


def stdio(keel, base, token):
    child = subprocess.Popen(rpc_command(keel, base, token, "--stdio"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peer = Peer(child.stdout, child.stdin)
    handshake(peer, child.pid)
    approved_run(peer)
    policy_as_data(peer)
    client_orchestrated(peer)
    errors(peer)
    child.stdin.close()
    check(child.wait(timeout=DEADLINE) == 0, "keel rpc --stdio exits 0 at end of input")


def socket_peer(path):
    connection = socket.socket(socket.AF_UNIX)
    connection.connect(path)
    return connection, Peer(connection.makefile("rb"), connection.makefile("wb"))


def unix_socket(keel, base, token, data):
    path = os.path.join(data, "keel.sock")
    child = subprocess.Popen(rpc_command(keel, base, token, "--socket", path),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(DEADLINE * 10):
        if os.path.exists(path):
            break
        time.sleep(0.1)
    check(stat.S_IMODE(os.stat(path).st_mode) == 0o600, "the socket is owner-only")
    (first_socket, first), (second_socket, second) = socket_peer(path), socket_peer(path)
    answers = {}

    def both(name, peer):
        answers[name] = (peer.ok("daemon.status")["pid"], peer.ok("tasks.list")["data"])

    threads = [threading.Thread(target=both, args=p) for p in (("a", first), ("b", second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    check(set(answers) == {"a", "b"}, f"both clients answered: {answers.keys()}")
    check(all(pid == child.pid for pid, _ in answers.values()), f"{answers}")
    first_socket.close()
    check(isinstance(second.ok("tasks.list")["data"], list), "one closing leaves the other")
    second_socket.close()
    child.send_signal(signal.SIGTERM)
    check(child.wait(timeout=DEADLINE) == 0, "keel rpc --socket exits 0 at SIGTERM")
    check(not os.path.exists(path), "the socket is removed")


def main():
    keel = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/debug/keel")
    with tempfile.TemporaryDirectory(prefix="keel-rpc-") as data:
        os.chmod(data, 0o755)
        server, base, token = serve(keel, data)
        try:
            stdio(keel, base, token)
            unix_socket(keel, base, token, data)
        finally:
            server.terminate()
            server.wait(timeout=DEADLINE)
    print("rpc conformance: stdio and socket sessions behaved")


if __name__ == "__main__":
    main()

"""Drives a running Keel through a client generated from its OpenAPI document alone:
create a shell task, start it, approve its gate, stream its events to the end, read its
stdout artifact. Run by scripts/python-client; exits non-zero on the first surprise.

    python drive.py BASE_URL TOKEN
"""

import json
import sys
import time

from keel_client import AuthenticatedClient
from keel_client.api.approvals import list_task_approvals, resolve_approval
from keel_client.api.events import stream_run_events
from keel_client.api.runs import artifact_content, get_run, list_artifacts, start_task
from keel_client.api.tasks import create_task
from keel_client.models import (
    ApproveRequest,
    ApproveRequestDecision,
    ErrorEnvelope,
    ShellTaskDraft,
    ShellTaskDraftExecutionKind,
    StartRequest,
)

GREETING = "hello from a generated client"


def ok(response, status):
    """The parsed body of a response with the expected status."""
    if response.status_code != status or isinstance(response.parsed, ErrorEnvelope):
        raise SystemExit(f"expected {status}, got {response.status_code}: {response.content!r}")
    return response.parsed


def wait_for_approval(client, task_id, deadline):
    """The run's pending approval, once the gate has been recorded."""
    while time.monotonic() < deadline:
        page = ok(list_task_approvals.sync_detailed(task_id, client=client), 200)
        pending = [a for a in page.data if a.status == "pending"]
        if pending:
            return pending[0]
        time.sleep(0.2)
    raise SystemExit("no pending approval appeared")


def sse_events(text):
    """The `data` of each server-sent event in a finished stream, parsed."""
    events = []
    for frame in text.split("\n\n"):
        data = [line[len("data:") :].strip() for line in frame.splitlines() if line.startswith("data:")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events


def main(base_url, token):
    client = AuthenticatedClient(base_url=base_url, token=token, timeout=60.0)
    deadline = time.monotonic() + 60

    draft = ShellTaskDraft(
        execution_kind=ShellTaskDraftExecutionKind.SHELL,
        shell_command=f"echo '{GREETING}'",
        budget_micros_usd=0,
    )
    task = ok(create_task.sync_detailed(client=client, body=draft), 201).data
    assert task.status == "not_started", task.status

    started = start_task.sync_detailed(task.id, client=client, body=StartRequest(reason="python client"))
    run = ok(started, 201).data
    assert run.status == "awaiting_approval", run.status

    approval = wait_for_approval(client, task.id, deadline)
    assert approval.kind == "shell_command", approval.kind
    decision = ApproveRequest(decision=ApproveRequestDecision.APPROVE, note="checked by drive.py")
    resolved = ok(resolve_approval.sync_detailed(task.id, approval.id, client=client, body=decision), 200)
    assert resolved.data.approval.status == "approved", resolved.data.approval.status

    # The stream ends after the run's terminal event.
    stream = ok(stream_run_events.sync_detailed(task.id, run.id, client=client), 200)
    events = sse_events(stream)
    types = [e["type"] for e in events]
    assert types[0] == "run.created" and types[-1] == "run.finished", types
    sequences = [e["sequence"] for e in events]
    assert sequences == sorted(set(sequences)), sequences

    finished = ok(get_run.sync_detailed(task.id, run.id, client=client), 200).data
    assert finished.status == "completed" and finished.exit_code == 0, finished

    artifacts = ok(list_artifacts.sync_detailed(task.id, run.id, client=client), 200).data
    stdout = [a for a in artifacts if a.name == "stdout"]
    assert stdout, [a.name for a in artifacts]
    content = artifact_content.sync_detailed(task.id, run.id, stdout[0].id, client=client)
    assert content.status_code == 200, content.status_code
    assert GREETING in content.content.decode(), content.content
    print(f"python client: task {task.id} ran through {len(events)} events and wrote its stdout")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

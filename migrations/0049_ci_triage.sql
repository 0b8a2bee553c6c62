-- CI triage (issue 48, seed 000 §Triage GitHub CI): a scan of a pull request item's
-- failing checks, made by a `ci_triage` worker job that reads GitHub with GET only, and one
-- triage record per failing check or job of a head SHA, with the fix task made from it.

CREATE TABLE ci_triage_scans (
    id              TEXT PRIMARY KEY,
    workspace_id    TEXT NOT NULL,
    item_id         TEXT NOT NULL REFERENCES external_work_items (id) ON DELETE CASCADE,
    -- The most failing checks one scan records.
    max_records     INTEGER NOT NULL CHECK (max_records BETWEEN 1 AND 20),
    create_task     BOOLEAN NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('queued', 'done', 'failed')),
    -- What the scan did: {triaged, task_created, duplicates, blocked, stale, failed,
    -- triage_ids}.
    summary         JSONB,
    last_error_code TEXT,
    last_error      TEXT,
    requested_by    TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at     TIMESTAMPTZ,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((status = 'queued') = (finished_at IS NULL)),
    CONSTRAINT ci_triage_scans_id_workspace UNIQUE (id, workspace_id)
);
CREATE INDEX ci_triage_scans_item ON ci_triage_scans (workspace_id, item_id, id);

CREATE TABLE ci_triage (
    id              TEXT PRIMARY KEY,
    workspace_id    TEXT NOT NULL,
    item_id         TEXT NOT NULL REFERENCES external_work_items (id) ON DELETE CASCADE,
    scan_id         TEXT NOT NULL,
    repository      TEXT NOT NULL,
    subject_number  BIGINT NOT NULL,
    -- The head the checks ran on; of a stale record, the head the item had.
    head_sha        TEXT NOT NULL,
    head_ref        TEXT,
    -- The failing check run, or Actions job (its check run has the job's id); none on a
    -- stale record.
    check_kind      TEXT CHECK (check_kind IN ('check_run', 'workflow_job')),
    check_name      TEXT NOT NULL,
    check_id        BIGINT,
    conclusion      TEXT,
    details_url     TEXT,
    status          TEXT NOT NULL CHECK (status IN ('triaged', 'task_created', 'run_requested',
                                                    'blocked', 'stale', 'failed')),
    reason          TEXT,
    task_id         TEXT,
    run_id          TEXT,
    -- The evidence (the check, and a job's log bounded and redacted), an artifact of the
    -- item's run.
    artifact_id     TEXT,
    -- The fix run's: one run per record, task and head, however often it is asked for.
    idempotency_key TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT ci_triage_scan FOREIGN KEY (scan_id, workspace_id)
        REFERENCES ci_triage_scans (id, workspace_id) ON DELETE CASCADE,
    CONSTRAINT ci_triage_task FOREIGN KEY (task_id, workspace_id)
        REFERENCES tasks (id, workspace_id) ON DELETE SET NULL (task_id),
    CONSTRAINT ci_triage_run FOREIGN KEY (run_id, workspace_id)
        REFERENCES runs (id, workspace_id) ON DELETE SET NULL (run_id),
    -- A check of a head is triaged once: a later scan finds it as a duplicate.
    CONSTRAINT ci_triage_once UNIQUE (workspace_id, item_id, head_sha, check_name),
    -- (A deleted task or run leaves its record, the link cleared.)
    CHECK ((status = 'stale') = (check_kind IS NULL))
);
CREATE INDEX ci_triage_workspace ON ci_triage (workspace_id, id);

-- External work (issue 18): sources (a tracker target driven by a WORKFLOW.md) and the
-- items their polls and imports found. A source's token is never stored: the workflow
-- names a secret reference, resolved by whoever polls, at use.

CREATE TABLE external_sources (
    id                 TEXT PRIMARY KEY,
    workspace_id       TEXT NOT NULL,
    tracker_kind       TEXT NOT NULL CHECK (tracker_kind IN ('github', 'linear')),
    -- kind:endpoint:repository (or project): registering it again finds this row.
    target             TEXT NOT NULL,
    -- Exactly one: the workflow's text, or a path read on each use.
    workflow_markdown  TEXT,
    workflow_path      TEXT,
    -- The last ETag of each list URL polled: sent as If-None-Match, a 304 changes nothing.
    etags              JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(etags) = 'object'),
    -- A rate limit (403/429, Retry-After, X-RateLimit-Reset): no request before then.
    backoff_until      TIMESTAMPTZ,
    background_enabled BOOLEAN NOT NULL DEFAULT false,
    last_poll_at       TIMESTAMPTZ,
    last_poll          JSONB,
    last_error_code    TEXT,
    last_error         TEXT,
    last_error_at      TIMESTAMPTZ,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((workflow_markdown IS NULL) <> (workflow_path IS NULL)),
    CONSTRAINT external_sources_target UNIQUE (workspace_id, target),
    CONSTRAINT external_sources_id_workspace UNIQUE (id, workspace_id)
);
CREATE INDEX external_sources_workspace ON external_sources (workspace_id, id);

CREATE TABLE external_work_items (
    id              TEXT PRIMARY KEY,
    workspace_id    TEXT NOT NULL,
    source_id       TEXT NOT NULL,
    -- github:pull_request:owner/repo:123:<head_sha>:<updated_at>, …: importing the same
    -- key again is a duplicate and changes nothing.
    idempotency_key TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('github_issue', 'github_pull_request',
                                                  'linear_issue')),
    -- What the item is about across its versions (owner/repo#123).
    identifier      TEXT NOT NULL,
    tracker_state   TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('discovered', 'claimed',
                                                   'workspace_preparing', 'ready', 'blocked',
                                                   'retry_wait', 'terminal')),
    -- The normalized item (the template's `issue`) and the prompt rendered from it.
    issue           JSONB NOT NULL,
    prompt          TEXT,
    task_id         TEXT,
    run_id          TEXT,
    last_error_code TEXT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT external_work_items_source FOREIGN KEY (source_id, workspace_id)
        REFERENCES external_sources (id, workspace_id) ON DELETE CASCADE,
    CONSTRAINT external_work_items_key UNIQUE (workspace_id, idempotency_key)
);
CREATE INDEX external_work_items_source ON external_work_items (workspace_id, source_id, id);
CREATE INDEX external_work_items_subject
    ON external_work_items (workspace_id, source_id, identifier) WHERE task_id IS NOT NULL;

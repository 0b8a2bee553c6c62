-- The agent loop: tasks that call a model with tools, the runs' model usage and lineage,
-- usage rows per model call, mid-loop tool-call approvals, and patch / conversation artifacts.

ALTER TABLE tasks
    DROP CONSTRAINT tasks_execution_kind_check,
    ADD CONSTRAINT tasks_execution_kind_check
        CHECK (execution_kind IN ('shell', 'git', 'file', 'agent_loop')),
    ADD COLUMN system_prompt      TEXT,
    -- A provider preset id; NULL: the workspace's first enabled chat preset.
    ADD COLUMN requested_provider TEXT,
    ADD COLUMN requested_model    TEXT,
    ADD COLUMN max_model_calls    INTEGER CHECK (max_model_calls > 0),
    -- The tools the model may call; NULL: the whole catalog the sandbox allows.
    ADD COLUMN tools              TEXT[],
    ADD CONSTRAINT tasks_agent_loop_prompt CHECK (execution_kind <> 'agent_loop' OR prompt IS NOT NULL);

ALTER TABLE runs
    ADD COLUMN model_call_count      INTEGER NOT NULL DEFAULT 0 CHECK (model_call_count >= 0),
    ADD COLUMN model                 TEXT,
    ADD COLUMN provider              TEXT,
    -- How this run came from `resumed_from_run_id`: resume, continue or retry_from_model_call.
    ADD COLUMN lineage_kind          TEXT CHECK (lineage_kind IN ('resume', 'continue', 'retry_from_model_call')),
    ADD COLUMN from_model_call_index INTEGER CHECK (from_model_call_index > 0),
    -- The conversation this run starts from (JSON array of messages), set at admission for
    -- resume, continue and retry-from-model-call; NULL: the task's system prompt and prompt.
    ADD COLUMN conversation_base     JSONB,
    ADD CONSTRAINT runs_lineage_source CHECK (lineage_kind IS NULL OR resumed_from_run_id IS NOT NULL),
    ADD CONSTRAINT runs_model_call_index CHECK
        ((lineage_kind = 'retry_from_model_call') = (from_model_call_index IS NOT NULL));

-- One row per completed model call: the usage ledger behind /v1/usage and the runs' cost.
CREATE TABLE model_calls (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL,
    task_id           TEXT NOT NULL,
    run_id            TEXT NOT NULL,
    step_id           TEXT NOT NULL REFERENCES steps (id) ON DELETE CASCADE,
    -- Run-local and 1-based: the N of retry-from-model-call.
    index             INTEGER NOT NULL CHECK (index > 0),
    provider          TEXT NOT NULL,
    model             TEXT NOT NULL,
    prompt_tokens     BIGINT NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens BIGINT NOT NULL CHECK (completion_tokens >= 0),
    cached_tokens     BIGINT NOT NULL CHECK (cached_tokens >= 0),
    -- NULL: the price table has no entry for the model; never guessed.
    cost_micros_usd   BIGINT CHECK (cost_micros_usd >= 0),
    duration_ms       BIGINT NOT NULL CHECK (duration_ms >= 0),
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    FOREIGN KEY (run_id, workspace_id) REFERENCES runs (id, workspace_id) ON DELETE CASCADE,
    UNIQUE (run_id, index)
);
CREATE INDEX model_calls_workspace ON model_calls (workspace_id, id);

-- A run has at most one gate of each pre-execution kind, but an agent loop asks again at
-- each gated model response: one pending tool-call approval at a time.
ALTER TABLE approvals
    DROP CONSTRAINT approvals_run_id_kind_key,
    -- The model-call step whose tool calls the approval covers.
    ADD COLUMN step_id            TEXT REFERENCES steps (id) ON DELETE CASCADE,
    -- A rejection that returns a refusal to the model instead of cancelling the run.
    ADD COLUMN continue_on_reject BOOLEAN NOT NULL DEFAULT false,
    ADD CONSTRAINT approvals_tool_call_step CHECK ((kind = 'agent_loop_tool_call') = (step_id IS NOT NULL));
CREATE UNIQUE INDEX approvals_one_gate_per_kind ON approvals (run_id, kind)
    WHERE kind <> 'agent_loop_tool_call';
CREATE UNIQUE INDEX approvals_one_pending_tool_call ON approvals (run_id)
    WHERE kind = 'agent_loop_tool_call' AND status = 'pending';

ALTER TABLE artifacts
    DROP CONSTRAINT artifacts_kind_check,
    ADD CONSTRAINT artifacts_kind_check
        CHECK (kind IN ('stdout', 'stderr', 'file', 'image', 'video', 'metadata', 'patch',
                        'agent_conversation'));

-- A patch artifact's state: applied by a tool, or reverted through the API.
ALTER TABLE artifacts
    ADD COLUMN patch_status TEXT CHECK (patch_status IN ('applied', 'reverted')),
    ADD CONSTRAINT artifacts_patch_status CHECK ((kind = 'patch') = (patch_status IS NOT NULL));

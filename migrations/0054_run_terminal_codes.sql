-- Why an ended run ended, as a code (keel_api_types::TerminalCode decides it from the
-- run's status and last_error when the run ends). Runs that ended before have none, as
-- the seed allows for older records.
ALTER TABLE runs ADD COLUMN terminal_code text;
ALTER TABLE runs ADD CONSTRAINT runs_terminal_code_known CHECK (terminal_code IN (
    'completed', 'cancelled', 'approval_rejected', 'exited_nonzero', 'killed', 'timed_out',
    'resource_limit', 'sandbox_unavailable', 'workspace_failed', 'hook_failed', 'push_failed',
    'model_error', 'budget_exceeded', 'max_model_calls_reached', 'client_lease_lapsed',
    'gave_up', 'failed'));
-- Only an ended run has one.
ALTER TABLE runs ADD CONSTRAINT runs_terminal_code_when_ended
    CHECK (terminal_code IS NULL OR status IN ('completed', 'failed', 'cancelled'));

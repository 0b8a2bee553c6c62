-- The last version of a `workflow_path` source's WORKFLOW.md that parsed (issue 48,
-- Symphony's reload semantics): an edit that breaks the file leaves polls running on it,
-- with the error on the source, until the file parses again.
ALTER TABLE external_sources ADD COLUMN workflow_last_good TEXT;

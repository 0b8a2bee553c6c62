-- Who asked for a run (the actor that started, retried or resumed it; `system` or a worker
-- for scheduled and imported runs), and for what an approval gates: its run's requester,
-- or the proposer of an external action. In remote mode an approver is never the
-- requester unless the operator allows it (KEEL_ALLOW_SELF_APPROVAL). Rows written before
-- this migration have none, and nobody counts as their requester.
ALTER TABLE runs ADD COLUMN requested_by TEXT;
ALTER TABLE approvals ADD COLUMN requested_by TEXT;

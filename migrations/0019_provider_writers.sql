-- Who last wrote a preset: a member (a tenant) or an operator. A member's preset is held
-- again, at each use, to the rules it was written under (its workspace's secret grants,
-- the chat host list), since KEEL_SECRET_GRANTS or KEEL_PROVIDER_HOSTS may have narrowed
-- since it was written; an operator's may name the operator's secrets and any chat host.
-- Rows from before this migration: the local workspace's were written by an operator (local
-- mode has no other caller); every remote org's count as a member's, which fails closed
-- (an operator saves such a preset again to vouch for it).
ALTER TABLE providers ADD COLUMN written_by_role TEXT NOT NULL DEFAULT 'member'
    CHECK (written_by_role IN ('member', 'operator'));
UPDATE providers SET written_by_role = 'operator' WHERE workspace_id = 'default';
ALTER TABLE providers ALTER COLUMN written_by_role DROP DEFAULT;

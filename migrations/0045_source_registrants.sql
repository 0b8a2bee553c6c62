-- Who registered a source: its actor requests the runs of the items it imports, whoever
-- polls or imports, and its role decides which tracker `api_key` it may name (a tenant only
-- one granted to its workspace), checked again at every poll, reconcile and action send.
-- Sources from before this migration have no registrant (their runs are requested by
-- whoever polls or imports, as before); the local workspace's were registered by the local
-- caller, the runtime operator; a remote org's count as a member's, which fails closed (the
-- runtime operator registers such a source again to vouch for its key).
ALTER TABLE external_sources ADD COLUMN registered_by TEXT;
ALTER TABLE external_sources ADD COLUMN registered_by_role TEXT NOT NULL DEFAULT 'member'
    CHECK (registered_by_role IN ('member', 'operator', 'runtime_operator'));
UPDATE external_sources SET registered_by_role = 'runtime_operator'
    WHERE workspace_id = 'default';
ALTER TABLE external_sources ALTER COLUMN registered_by_role DROP DEFAULT;

-- Roles that match the deployment (docs/remote.md, "Roles"): an org's operator is a tenant
-- like its members, held to its workspace's secret grants (KEEL_SECRET_GRANTS) and the
-- host list (KEEL_PROVIDER_HOSTS); only the runtime operator (the local caller, or an
-- identity the signer marks `runtime_operator`) names the deployment's own secrets and aims
-- at hosts off the list.
--
-- Presets and tasks record the third role. Every row of the local workspace was written by
-- the local caller, now the runtime operator. A remote org's `operator` rows stay an org
-- operator's: held to the grants at each use, which fails closed (the runtime operator saves
-- such a preset or task again to vouch for it).
ALTER TABLE providers
    DROP CONSTRAINT providers_written_by_role_check,
    ADD CONSTRAINT providers_written_by_role_check
        CHECK (written_by_role IN ('member', 'operator', 'runtime_operator'));
UPDATE providers SET written_by_role = 'runtime_operator' WHERE workspace_id = 'default';
ALTER TABLE tasks
    DROP CONSTRAINT tasks_written_by_role_check,
    ADD CONSTRAINT tasks_written_by_role_check
        CHECK (written_by_role IN ('member', 'operator', 'runtime_operator'));
UPDATE tasks SET written_by_role = 'runtime_operator' WHERE workspace_id = 'default';

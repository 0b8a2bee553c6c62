-- What a task's shell and git children may reach: the network (false: a network namespace
-- with only loopback) and the workspace (read_only: mounted read-only, file writes refused).
ALTER TABLE tasks ADD COLUMN sandbox_network BOOLEAN NOT NULL DEFAULT true;
ALTER TABLE tasks ADD COLUMN sandbox_read_only BOOLEAN NOT NULL DEFAULT false;

-- Session ids are the client's names (X-Session-Id, a path segment, a
-- stitched hash), so they are unique per tenant, not globally: two tenants
-- can both run "task-42", and each sees only its own. Every row that names
-- a session names it with its tenant.
--
-- interactions keeps no foreign key to sessions (00014: the capture
-- statement inserts a row only joined to its own tenant's session row);
-- its per-session uniqueness and index take the tenant first.

-- +goose Up
ALTER TABLE rewards DROP CONSTRAINT rewards_session_id_fkey;
ALTER TABLE trajectories DROP CONSTRAINT trajectories_session_id_fkey;
ALTER TABLE atdp_steps DROP CONSTRAINT atdp_steps_session_id_fkey;
ALTER TABLE sessions DROP CONSTRAINT sessions_pkey;
ALTER TABLE sessions ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE rewards ADD FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE;
ALTER TABLE trajectories ADD FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE;
ALTER TABLE atdp_steps ADD FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE;
ALTER TABLE trajectories DROP CONSTRAINT trajectories_session_id_assembled_at_key;
ALTER TABLE trajectories ADD UNIQUE (tenant_id, session_id, assembled_at);
ALTER TABLE interactions DROP CONSTRAINT interactions_session_id_seq_key;
ALTER TABLE interactions ADD UNIQUE (tenant_id, session_id, seq);

-- +goose Down
ALTER TABLE interactions DROP CONSTRAINT interactions_tenant_id_session_id_seq_key;
ALTER TABLE interactions ADD UNIQUE (session_id, seq);
ALTER TABLE trajectories DROP CONSTRAINT trajectories_tenant_id_session_id_assembled_at_key;
ALTER TABLE trajectories ADD UNIQUE (session_id, assembled_at);
ALTER TABLE atdp_steps DROP CONSTRAINT atdp_steps_tenant_id_session_id_fkey;
ALTER TABLE trajectories DROP CONSTRAINT trajectories_tenant_id_session_id_fkey;
ALTER TABLE rewards DROP CONSTRAINT rewards_tenant_id_session_id_fkey;
ALTER TABLE sessions DROP CONSTRAINT sessions_pkey;
ALTER TABLE sessions ADD PRIMARY KEY (id);
ALTER TABLE rewards ADD FOREIGN KEY (session_id) REFERENCES sessions (id) ON DELETE CASCADE;
ALTER TABLE trajectories ADD FOREIGN KEY (session_id) REFERENCES sessions (id) ON DELETE CASCADE;
ALTER TABLE atdp_steps ADD FOREIGN KEY (session_id) REFERENCES sessions (id) ON DELETE CASCADE;

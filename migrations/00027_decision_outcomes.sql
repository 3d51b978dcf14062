-- A decision says what it expects, and later what its change did: the
-- release it started (its status, when it was promoted), and the outcome
-- measured once a window of traffic has passed since the promotion (the
-- mean session reward before and after, of the tenant the change was for
-- when it was one tenant's). The status page and `flywheel evolve list`
-- show both.

-- +goose Up
ALTER TABLE evolution_decisions
    ADD COLUMN tenant_id      text NOT NULL DEFAULT '',
    ADD COLUMN expected       text NOT NULL DEFAULT '',
    ADD COLUMN release_status text NOT NULL DEFAULT '',
    ADD COLUMN promoted_at    timestamptz,
    ADD COLUMN outcome        jsonb;

-- +goose Down
ALTER TABLE evolution_decisions
    DROP COLUMN tenant_id, DROP COLUMN expected, DROP COLUMN release_status, DROP COLUMN promoted_at, DROP COLUMN outcome;

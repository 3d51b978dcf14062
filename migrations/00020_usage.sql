-- Usage is accounted per tenant, key, deployment and day, in the capture's
-- own statement: an acknowledged call is counted exactly once, and the
-- count outlives a forget (which deletes the interactions, not what they
-- cost). key_id is the tenant key a call is accounted to (a session key's
-- parent; 0 for calls no key made, such as the status page's).

-- +goose Up
ALTER TABLE interactions ADD COLUMN key_id bigint;
CREATE TABLE usage_daily (
    tenant_id         text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    day               date NOT NULL,
    key_id            bigint NOT NULL DEFAULT 0,
    deployment        text NOT NULL,
    requests          bigint NOT NULL DEFAULT 0,
    errors            bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day, key_id, deployment)
);

-- +goose Down
DROP TABLE usage_daily;
ALTER TABLE interactions DROP COLUMN key_id;

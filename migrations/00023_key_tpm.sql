-- A tenant key may have its own tokens-per-minute rate limit: tpm prompt
-- and completion tokens a minute, enforced by each gateway replica (its
-- share of it, gateway.replicas). NULL: the gateway's rate_limit_tpm;
-- 0: no token rate limit for this key. Session keys are limited by their
-- parent's, as their usage is accounted to it.

-- +goose Up
ALTER TABLE api_keys ADD COLUMN tpm bigint CHECK (tpm >= 0);

-- +goose Down
ALTER TABLE api_keys DROP COLUMN tpm;

-- The release gates read a deployment's recent traffic newest first
-- (shadow: since the phase began; replay: the latest rewarded prompts).
-- Without an index in that order the query scored every interaction the
-- deployment ever served before taking the first twenty: over a minute at
-- 30,000 interactions, past the gate's heartbeat timeout. The existing
-- (deployment, model_version, created_at) index orders within a version
-- only.

-- +goose Up
CREATE INDEX interactions_deployment_recent ON interactions (deployment, created_at DESC, id DESC);

-- +goose Down
DROP INDEX interactions_deployment_recent;

-- EnqueueSamples skips an interaction that an earlier trajectory of its
-- session already queued, looking its steps up by interaction id. Without
-- an index that lookup joined every queued sample with every step: 100–190
-- ms per session at 37,000 samples, growing with every session the system
-- ever saw, which in a 10-minute demo run on a database that had seen
-- three earlier runs took most of Postgres's share of the CPU.

-- +goose Up
CREATE INDEX atdp_steps_interaction ON atdp_steps (interaction_id);

-- +goose Down
DROP INDEX atdp_steps_interaction;

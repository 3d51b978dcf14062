-- A version's training state (weights and optimizer moments, on its
-- Tinker service) is deleted once no step can start from it again: a
-- version rolled back or retired, or a candidate a newer one replaced
-- before it was released. state_pruned_at says it is gone; the version's
-- sampler weights, which serving loads, stay.

-- +goose Up
ALTER TABLE model_versions ADD COLUMN state_pruned_at timestamptz;

-- +goose Down
ALTER TABLE model_versions DROP COLUMN state_pruned_at;

// Package workflows holds Flywheel's Temporal workflow definitions. Workflow
// code is deterministic: it only uses workflow.* APIs, carries ids and small
// summaries (never prompts, trajectories or token arrays: those live in
// Postgres), and does its I/O through activities.
package workflows

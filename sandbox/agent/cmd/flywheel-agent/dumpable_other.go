//go:build !linux

package main

// guardFromCommands has nothing to do where the agent cannot run.
func guardFromCommands() error { return nil }

// adoptsOrphans: no subreaper where the agent cannot run.
const adoptsOrphans = false

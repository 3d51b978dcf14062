package main

import (
	"fmt"
	"syscall"
)

// guardFromCommands makes the agent non-dumpable. Commands run as the same
// user as the agent, and without this any of them could ptrace it or write
// its memory through /proc/PID/mem, then forge what grading reads through
// it. A non-dumpable process can be traced only with CAP_SYS_PTRACE, which
// no sandbox has. Commands are exec'd and so dumpable again: only the agent
// is shielded.
//
// It also makes the agent its commands' child subreaper: a process that
// leaves its command's process group (setsid) and outlives the command's
// shell becomes the agent's child, not init's, so the agent can end it
// with the command (agent/strays.go).
func guardFromCommands() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER, 1): %w", errno)
	}
	return nil
}

// adoptsOrphans: guardFromCommands made the agent a child subreaper.
const adoptsOrphans = true

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from linux/prctl.h, which
// package syscall does not name.
const prSetChildSubreaper = 36

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
func guardFromCommands() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}

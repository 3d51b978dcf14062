package agent

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Strays are processes a command leaves behind. Its process group dies
// with it, but a child that called setsid left the group. The agent runs
// as its commands' child subreaper (PR_SET_CHILD_SUBREAPER, set by the
// agent's main), so such a child, once its command's shell is gone,
// becomes the agent's child instead of init's: the agent finds it among
// its children and ends it when the command ends, time limit or not. A
// command run with KeepStrays leaves its strays alive on purpose; the
// agent remembers them (and their process groups and sessions, which a
// daemon's later forks share) and leaves them to KillStrays.

// maxSweepRounds bounds how often a sweep looks again for the children of
// the strays it just killed (each round adopts the next generation).
const maxSweepRounds = 16

// strays is what the agent remembers of its commands' processes.
type strays struct {
	// shells are the running commands' shells, by pid (each its own
	// process group leader, so also the groups of running commands).
	shells map[int]bool
	// kept are strays a KeepStrays command left: pids, process groups and
	// sessions.
	keptPIDs, keptGroups, keptSessions map[int]bool
}

func newStrays() strays {
	return strays{shells: map[int]bool{}, keptPIDs: map[int]bool{}, keptGroups: map[int]bool{}, keptSessions: map[int]bool{}}
}

// child is one of the agent's child processes.
type child struct {
	pid, pgid, sid int
	zombie         bool
}

// children lists the agent's children from /proc ("" on a system without
// it: nothing to sweep).
func children() []child {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []child
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session …; comm may hold anything,
		// so the fields start after its last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 4 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if ppid != self {
			continue
		}
		pgid, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		out = append(out, child{pid: pid, pgid: pgid, sid: sid, zombie: f[0] == "Z"})
	}
	return out
}

// sweep ends the strays of a command that finished (keep false), or
// remembers them (keep true); either way it reaps the agent's exited
// strays. Running commands' shells and the processes of their groups are
// theirs, not strays. s.mu must be held.
func (st *strays) sweep(keep bool) int {
	killed := 0
	for range maxSweepRounds {
		var found []child
		for _, c := range children() {
			switch {
			case st.shells[c.pid]:
				// A running command's shell: its exec reaps it.
			case c.zombie:
				_, _ = syscall.Wait4(c.pid, nil, syscall.WNOHANG, nil)
				delete(st.keptPIDs, c.pid)
			case st.shells[c.pgid], st.keptPIDs[c.pid], st.keptGroups[c.pgid], st.keptSessions[c.sid]:
				// A running command's, or kept.
			default:
				found = append(found, c)
			}
		}
		if len(found) == 0 {
			return killed
		}
		for _, c := range found {
			if keep {
				st.keptPIDs[c.pid], st.keptGroups[c.pgid], st.keptSessions[c.sid] = true, true, true
				continue
			}
			if syscall.Kill(c.pid, syscall.SIGKILL) == nil {
				killed++
			}
			_, _ = syscall.Wait4(c.pid, nil, 0, nil)
		}
		if keep {
			return 0
		}
	}
	return killed
}

// forget drops what KillStrays ended.
func (st *strays) forget() {
	st.keptPIDs, st.keptGroups, st.keptSessions = map[int]bool{}, map[int]bool{}, map[int]bool{}
}

package agent

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Strays are processes a command leaves behind. Its process group dies
// with it, but a child that called setsid left the group. The agent runs
// as its commands' child subreaper (PR_SET_CHILD_SUBREAPER, set by the
// agent's main), so such a child, once the process that forked it is
// gone, becomes the agent's child instead of init's: the agent finds it
// among its children and ends it when the command ends, time limit or not.
//
// Adopted children become the agent's zombies when they exit, and a zombie
// holds its pid until it is reaped: under a fork bomb held by the pids
// limit, unreaped zombies would keep every pid, and the agent's runtime
// would die creating a thread. So the agent reaps on every SIGCHLD, all
// its exited children except its commands' shells, which their exec waits
// for.
//
// A command run with KeepStrays leaves its strays alive on purpose; the
// agent remembers them (and their process groups and sessions, which a
// daemon's later forks share) and leaves them to KillStrays. While several
// commands run at once, an orphan cannot be told apart by command, so
// strays are ended when the last running command ends (kept if any that
// ended meanwhile kept its strays).

// maxSweepRounds bounds how often a sweep looks again for the children of
// the strays it just killed (each round adopts the next generation).
const maxSweepRounds = 16

// procs is what the agent knows of its commands' processes.
type procs struct {
	// adopts says the process is a child subreaper; without it (a server
	// inside a test process) only process groups are killed.
	adopts bool

	mu sync.Mutex
	// shells are the running commands' shells, by pid.
	shells map[int]bool
	// pendingKeep: a command that ended while others ran kept its strays.
	pendingKeep bool
	// kept are strays a KeepStrays command left: pids, process groups and
	// sessions.
	keptPIDs, keptGroups, keptSessions map[int]bool
}

func newProcs(adopts bool) *procs {
	p := &procs{adopts: adopts, shells: map[int]bool{}}
	p.forget()
	return p
}

// start starts a command's shell. It is started under the lock, so the
// reaper never mistakes it for a stray and steals its exit status.
func (p *procs) start(cmd *exec.Cmd) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	p.shells[cmd.Process.Pid] = true
	return nil
}

// finish is called when a command's shell has been waited for: the last
// running command ends the strays (or keeps them).
func (p *procs) finish(pid int, keep bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.shells, pid)
	if !p.adopts {
		return
	}
	if len(p.shells) > 0 {
		p.pendingKeep = p.pendingKeep || keep
		return
	}
	p.sweep(keep || p.pendingKeep)
	p.pendingKeep = false
}

// reapOnSIGCHLD reaps exited strays until stop is closed.
func (p *procs) reapOnSIGCHLD(stop <-chan struct{}) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	for {
		select {
		case <-stop:
			return
		case <-sig:
			p.mu.Lock()
			for _, c := range children() {
				if c.zombie && !p.shells[c.pid] {
					p.reap(c.pid, syscall.WNOHANG)
				}
			}
			p.mu.Unlock()
		}
	}
}

// reap waits for one of the agent's strays. p.mu must be held.
func (p *procs) reap(pid, options int) {
	_, _ = syscall.Wait4(pid, nil, options, nil)
	delete(p.keptPIDs, pid)
}

// sweep ends the agent's adopted strays (keep false), or remembers them
// (keep true). No command is running. p.mu must be held.
func (p *procs) sweep(keep bool) {
	for range maxSweepRounds {
		var found []child
		for _, c := range children() {
			switch {
			case p.shells[c.pid]:
				// A shell started since: its exec reaps it.
			case c.zombie:
				p.reap(c.pid, syscall.WNOHANG)
			case p.keptPIDs[c.pid], p.keptGroups[c.pgid], p.keptSessions[c.sid]:
			default:
				found = append(found, c)
			}
		}
		if len(found) == 0 {
			return
		}
		for _, c := range found {
			if keep {
				p.keptPIDs[c.pid], p.keptGroups[c.pgid], p.keptSessions[c.sid] = true, true, true
				continue
			}
			_ = syscall.Kill(c.pid, syscall.SIGKILL)
			p.reap(c.pid, 0)
		}
		if keep {
			return
		}
	}
}

// forget drops what KillStrays ended.
func (p *procs) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keptPIDs, p.keptGroups, p.keptSessions = map[int]bool{}, map[int]bool{}, map[int]bool{}
	p.pendingKeep = false
}

// child is one of the agent's child processes.
type child struct {
	pid, pgid, sid int
	zombie         bool
}

// children lists the agent's children from /proc (none on a system without
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
		if ppid, _ := strconv.Atoi(f[1]); ppid != self {
			continue
		}
		pgid, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		out = append(out, child{pid: pid, pgid: pgid, sid: sid, zombie: f[0] == "Z"})
	}
	return out
}

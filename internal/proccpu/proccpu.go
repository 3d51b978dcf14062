// Package proccpu reads how much CPU local processes have run, from /proc,
// for benchmarks that report a server's CPU cost beside their own.
package proccpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Of is the CPU time process pid has run: the sum over its threads of the
// first field of /proc/PID/task/TID/schedstat, in nanoseconds. Threads
// that already exited are not counted (a Go server keeps its threads;
// a postgres backend has one).
func Of(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("CPU time of process %d: %w", pid, errors.Join(err, os.ErrNotExist))
	}
	var total time.Duration
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(raw))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: empty", t)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// Named is the CPU time (Of) of every local process whose command name
// (/proc/PID/comm) is comm; ok is false when there is none (a remote
// server, or no /proc).
func Named(comm string) (total time.Duration, ok bool) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		name, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		if t, err := Of(pid); err == nil {
			total, ok = total+t, true
		}
	}
	return total, ok
}

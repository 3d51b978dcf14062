package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// exec runs req.Cmd in the shell, in its own process group, and fills resp
// with its output and how it ended.
func (s *Server) exec(req Request, resp *Response) error {
	if strings.TrimSpace(req.Cmd) == "" {
		return errors.New("exec: empty command")
	}
	timeout, maxOut := execLimits(req)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	defer s.track(req.ID, cancel)()

	start := time.Now()
	cmd, outR, errR, err := s.startShell(req)
	if err != nil {
		return err
	}
	pgid := cmd.Process.Pid
	out := readOutput(outR, errR, maxOut)

	stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	waitErr := cmd.Wait()
	stop()
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	if !req.KeepStrays {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	// What left the group (setsid) and was adopted by the agent ends now
	// too, or is remembered as kept.
	s.procs.finish(pgid, req.KeepStrays)
	grace := outputGrace
	if req.KeepStrays {
		grace = strayDrain
	}
	out.finish(grace)

	resp.DurationUS = time.Since(start).Microseconds()
	resp.Stdout, resp.StdoutSize = out.stdout.buf, out.stdout.total
	resp.Stderr, resp.StderrSize = out.stderr.buf, out.stderr.total
	resp.Truncated = out.stdout.total > maxOut || out.stderr.total > maxOut
	resp.TimedOut = timedOut
	return exitStatus(waitErr, resp)
}

// oomFirst makes the command the OOM killer's first choice in its sandbox.
const oomFirst = "echo 1000 >/proc/self/oom_score_adj 2>/dev/null; "

// execLimits is req's timeout and output cap, defaults filled in and
// ceilings applied.
func execLimits(req Request) (timeout time.Duration, maxOut int64) {
	timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	maxOut = req.MaxOutput
	if maxOut <= 0 {
		maxOut = DefaultMaxOutput
	}
	return min(timeout, MaxTimeout), min(maxOut, MaxOutputCeiling)
}

// track makes request id cancellable by OpCancel until the returned
// function is called.
func (s *Server) track(id uint64, cancel context.CancelFunc) (untrack func()) {
	s.mu.Lock()
	s.running[id] = cancel
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.running, id)
		s.mu.Unlock()
	}
}

// startShell starts req.Cmd in the shell, in a process group of its own so
// a timeout or clean-up kills everything the command forked, not only the
// shell. It returns the read ends of the command's stdout and stderr.
func (s *Server) startShell(req Request) (cmd *exec.Cmd, outR, errR *os.File, err error) {
	// Pipes are handed over as files so Wait returns when the shell exits,
	// not when the last background child closes its copy of them.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("exec: stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, nil, fmt.Errorf("exec: stderr pipe: %w", err)
	}
	// Under memory pressure the kernel should kill the command, not the
	// agent. The shell raises its own OOM score before it runs the command,
	// which inherits it: written from here after the start, a command that
	// allocates at once could meet the limit first and the agent die.
	cmd = exec.Command(s.Shell, "-c", oomFirst+req.Cmd)
	cmd.Dir = req.Dir
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Stdout, cmd.Stderr = outW, errW
	if len(req.Stdin) > 0 {
		cmd.Stdin = strings.NewReader(string(req.Stdin))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.procs.start(cmd); err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return nil, nil, nil, fmt.Errorf("exec: start: %w", err)
	}
	outW.Close()
	errW.Close()
	return cmd, outR, errR, nil
}

// exitStatus fills resp's exit code (128+N for a command killed by signal
// N) from what Wait returned.
func exitStatus(waitErr error, resp *Response) error {
	resp.ExitCode = 0
	if waitErr == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) {
		return fmt.Errorf("exec: wait: %w", waitErr)
	}
	resp.ExitCode = ee.ExitCode()
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		resp.Signal = ws.Signal().String()
		resp.ExitCode = 128 + int(ws.Signal())
	}
	return nil
}

// output is a running command's stdout and stderr, being read.
type output struct {
	outR, errR     *os.File
	stdout, stderr *capture
	copied         chan struct{}
}

// readOutput reads outR and errR, keeping the first maxOut bytes of each,
// until they end or finish is called.
func readOutput(outR, errR *os.File, maxOut int64) *output {
	o := &output{outR: outR, errR: errR, stdout: &capture{max: maxOut}, stderr: &capture{max: maxOut}, copied: make(chan struct{})}
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); o.stdout.drain(outR) }()
	go func() { defer copies.Done(); o.stderr.drain(errR) }()
	go func() { copies.Wait(); close(o.copied) }()
	return o
}

// finish waits for the output to end, once the command's shell is gone.
// Normally every writer is gone then and the copies end at EOF. Children
// that outlived the shell (kept, or escaped with setsid) may hold the
// pipes open: they get grace, then reading stops. A deadline is set only
// then, because under CPU pressure a copy may not yet have read output
// the shell wrote before exiting.
func (o *output) finish(grace time.Duration) {
	select {
	case <-o.copied:
	case <-time.After(grace):
		_ = o.outR.SetReadDeadline(time.Now())
		_ = o.errR.SetReadDeadline(time.Now())
		<-o.copied
	}
	o.outR.Close()
	o.errR.Close()
}

// capture keeps the first max bytes of a stream and counts the rest.
type capture struct {
	max   int64
	buf   []byte
	total int64
}

func (c *capture) drain(r io.Reader) {
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			c.total += int64(n)
			if room := c.max - int64(len(c.buf)); room > 0 {
				c.buf = append(c.buf, chunk[:min(int64(n), room)]...)
			}
		}
		if err != nil {
			return
		}
	}
}

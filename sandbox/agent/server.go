package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits applied when a request leaves them unset, and ceilings a request
// cannot exceed.
const (
	DefaultTimeout   = 60 * time.Second
	MaxTimeout       = 30 * time.Minute
	DefaultMaxOutput = 1 << 20
	MaxOutputCeiling = 16 << 20
	DefaultReadBytes = 4 << 20
	MaxListEntries   = 10000
	// strayDrain is how long output is still read after the command's shell
	// exits when it keeps its background children (which hold the pipes).
	strayDrain = 200 * time.Millisecond
	// outputGrace bounds reading output after the shell and its process
	// group are gone, for children that escaped the group.
	outputGrace = 2 * time.Second
)

// Server answers requests read from in on out. It is safe for concurrent
// requests; responses may come back in any order.
type Server struct {
	// Shell runs exec commands; default /bin/sh.
	Shell string
	// Log receives diagnostics (the container's stderr); may be nil.
	Log io.Writer
	// AdoptsOrphans says the process is its commands' child subreaper, so
	// strays that left a command's process group become its children: it
	// reaps them as they exit and ends them with their command
	// (strays.go). Without it (a server inside a test process) only
	// process groups are killed.
	AdoptsOrphans bool

	mu      sync.Mutex
	out     *bufio.Writer
	running map[uint64]context.CancelFunc
	procs   *procs
	wg      sync.WaitGroup
}

// Serve reads frames until in ends, then waits for requests in flight.
func (s *Server) Serve(in io.Reader, out io.Writer) error {
	if s.Shell == "" {
		s.Shell = "/bin/sh"
	}
	s.out = bufio.NewWriterSize(out, 64<<10)
	s.running = make(map[uint64]context.CancelFunc)
	s.procs = newProcs(s.AdoptsOrphans)
	if s.AdoptsOrphans {
		stop := make(chan struct{})
		defer close(stop)
		go s.procs.reapOnSIGCHLD(stop)
	}
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		var req Request
		if err := ReadFrame(br, &req); err != nil {
			s.wg.Wait()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.reply(s.handle(req))
		}()
	}
}

func (s *Server) reply(resp Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := WriteFrame(s.out, resp); err != nil {
		s.logf("write response %d: %v", resp.ID, err)
		return
	}
	if err := s.out.Flush(); err != nil {
		s.logf("flush response %d: %v", resp.ID, err)
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.Log != nil {
		fmt.Fprintf(s.Log, "flywheel-agent: "+format+"\n", args...)
	}
}

func (s *Server) handle(req Request) Response {
	resp := Response{ID: req.ID}
	var err error
	switch req.Op {
	case OpPing:
		resp.Version, resp.PID, resp.UID = ProtocolVersion, os.Getpid(), os.Getuid()
	case OpExec:
		err = s.exec(req, &resp)
	case OpReadFile:
		err = readFile(req, &resp)
	case OpWriteFile:
		err = writeFile(req)
	case OpListFiles:
		resp.Entries, err = listFiles(req)
	case OpKillStrays:
		resp.Killed, err = killStrays()
		s.procs.forget()
	case OpCancel:
		s.mu.Lock()
		cancel := s.running[req.Target]
		s.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		resp.Error = err.Error()
	}
	return resp
}

func (s *Server) exec(req Request, resp *Response) error {
	if strings.TrimSpace(req.Cmd) == "" {
		return errors.New("exec: empty command")
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	timeout = min(timeout, MaxTimeout)
	maxOut := req.MaxOutput
	if maxOut <= 0 {
		maxOut = DefaultMaxOutput
	}
	maxOut = min(maxOut, MaxOutputCeiling)

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s.mu.Lock()
	s.running[req.ID] = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.running, req.ID)
		s.mu.Unlock()
	}()

	// Pipes are handed over as files so Wait returns when the shell exits,
	// not when the last background child closes its copy of them.
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("exec: stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("exec: stderr pipe: %w", err)
	}
	cmd := exec.Command(s.Shell, "-c", req.Cmd)
	cmd.Dir = req.Dir
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Stdout, cmd.Stderr = outW, errW
	if len(req.Stdin) > 0 {
		cmd.Stdin = strings.NewReader(string(req.Stdin))
	}
	// Its own process group, so a timeout or clean-up kills everything the
	// command forked, not only the shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	start := time.Now()
	if err := s.procs.start(cmd); err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return fmt.Errorf("exec: start: %w", err)
	}
	outW.Close()
	errW.Close()
	pgid := cmd.Process.Pid
	// Under memory pressure the kernel should kill the command, not the agent.
	_ = os.WriteFile("/proc/"+strconv.Itoa(pgid)+"/oom_score_adj", []byte("1000"), 0)

	stdout := &capture{max: maxOut}
	stderr := &capture{max: maxOut}
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); stdout.drain(outR) }()
	go func() { defer copies.Done(); stderr.drain(errR) }()

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
	// Normally every writer is gone now and the copies end at EOF. Children
	// that outlived the shell (kept, or escaped with setsid) may hold the
	// pipes open: give them a grace period, then stop reading. A deadline
	// is set only then, because under CPU pressure a copy may not yet have
	// read output the shell wrote before exiting.
	copied := make(chan struct{})
	go func() { copies.Wait(); close(copied) }()
	grace := outputGrace
	if req.KeepStrays {
		grace = strayDrain
	}
	select {
	case <-copied:
	case <-time.After(grace):
		_ = outR.SetReadDeadline(time.Now())
		_ = errR.SetReadDeadline(time.Now())
		<-copied
	}
	outR.Close()
	errR.Close()

	resp.DurationUS = time.Since(start).Microseconds()
	resp.Stdout, resp.StdoutSize = stdout.buf, stdout.total
	resp.Stderr, resp.StderrSize = stderr.buf, stderr.total
	resp.Truncated = stdout.total > maxOut || stderr.total > maxOut
	resp.TimedOut = timedOut
	resp.ExitCode = 0
	if waitErr != nil {
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) {
			return fmt.Errorf("exec: wait: %w", waitErr)
		}
		resp.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			resp.Signal = ws.Signal().String()
			resp.ExitCode = 128 + int(ws.Signal())
		}
	}
	return nil
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

func readFile(req Request, resp *Response) error {
	if req.Path == "" {
		return errors.New("read_file: empty path")
	}
	f, err := os.Open(req.Path)
	if err != nil {
		return fmt.Errorf("read_file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read_file: %w", err)
	}
	if st.IsDir() {
		return fmt.Errorf("read_file: %s is a directory", req.Path)
	}
	limit := req.MaxBytes
	if limit <= 0 {
		limit = DefaultReadBytes
	}
	limit = min(limit, MaxFrameBytes/2)
	data, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return fmt.Errorf("read_file: %w", err)
	}
	resp.Data, resp.Size = data, st.Size()
	return nil
}

func writeFile(req Request) error {
	if req.Path == "" {
		return errors.New("write_file: empty path")
	}
	mode := fs.FileMode(req.Mode & 0o777)
	if mode == 0 {
		mode = 0o644
	}
	if err := os.MkdirAll(filepath.Dir(req.Path), 0o755); err != nil {
		return fmt.Errorf("write_file: %w", err)
	}
	// Remove first so a path that was a symlink is replaced, not followed.
	if err := os.Remove(req.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write_file: %w", err)
	}
	if err := os.WriteFile(req.Path, req.Data, mode); err != nil {
		return fmt.Errorf("write_file: %w", err)
	}
	return os.Chmod(req.Path, mode)
}

func listFiles(req Request) ([]Entry, error) {
	root := req.Path
	if root == "" {
		root = "."
	}
	depth := req.MaxDepth
	if depth <= 0 {
		depth = 1
	}
	root = filepath.Clean(root)
	var entries []Entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		level := strings.Count(rel, string(filepath.Separator)) + 1
		info, err := d.Info()
		if err != nil {
			return nil
		}
		entries = append(entries, Entry{Path: p, Size: info.Size(), Mode: uint32(info.Mode().Perm()), IsDir: d.IsDir()})
		if len(entries) >= MaxListEntries {
			return fs.SkipAll
		}
		if d.IsDir() && (level >= depth || d.Name() == ".git") {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list_files: %w", err)
	}
	return entries, nil
}

// killStrays kills every process except init (pid 1) and the agent itself:
// daemons and setsid'd children escape a process group, not this.
func killStrays() (int, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("kill_strays: %w", err)
	}
	self := os.Getpid()
	killed := 0
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == 1 || pid == self {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	return killed, nil
}

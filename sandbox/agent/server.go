package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
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

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox/agent"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// Sandbox is one started container. Its methods are safe for concurrent use.
type Sandbox struct {
	// ID is the container id.
	ID string
	// Image is what the container was created from.
	Image Image
	// Created is when this process created or re-attached it.
	Created time.Time

	m    *Manager
	conn *agentConn // nil when the image has no agent
	// pool is the pool Acquire took it from (nil: created directly);
	// Release resets such a sandbox and returns it there.
	pool *pool
}

// ExecRequest is one shell command.
type ExecRequest struct {
	// Cmd runs under /bin/sh -c as the sandbox user.
	Cmd string
	// Dir is the working directory; default /workspace.
	Dir string
	// Env adds KEY=VALUE pairs.
	Env []string
	// Stdin is fed to the command.
	Stdin []byte
	// Timeout is enforced inside the container (the process group is killed)
	// and, with a grace period, by the host; default Config.ExecTimeout.
	Timeout time.Duration
	// MaxOutput caps stdout and stderr each; default Config.MaxOutput.
	MaxOutput int64
	// KeepStrays keeps background processes alive after the command returns.
	KeepStrays bool
}

// ExecResult is the outcome of a command that ran; a command that failed is
// a result with a non-zero ExitCode, not an error.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
	// StdoutSize and StderrSize count all bytes written, kept or not.
	StdoutSize, StderrSize int64
	Truncated              bool
	TimedOut               bool
	Duration               time.Duration
}

// hostGrace is how much longer than the command's own timeout the host waits
// before giving up on the agent, which should have killed the command.
const hostGrace = 5 * time.Second

func (sb *Sandbox) attach(ctx context.Context) error {
	hj, err := sb.m.cli.ContainerAttach(ctx, sb.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return fmt.Errorf("attach sandbox %s: %w", short(sb.ID), err)
	}
	sb.conn = newAgentConn(hj.HijackedResponse, sb.m.log.With("container", short(sb.ID)))
	return nil
}

// HasAgent reports whether calls go through the in-container agent.
func (sb *Sandbox) HasAgent() bool { return sb.conn != nil }

// Ping checks the agent and returns its uid inside the container.
func (sb *Sandbox) Ping(ctx context.Context) (uid int, err error) {
	if sb.conn == nil {
		return -1, errors.New("sandbox has no agent")
	}
	resp, err := sb.conn.call(ctx, agent.Request{Op: agent.OpPing})
	if err != nil {
		return -1, err
	}
	if resp.Version != agent.ProtocolVersion {
		return -1, fmt.Errorf("sandbox agent speaks protocol %d, host %d (rebuild the image)", resp.Version, agent.ProtocolVersion)
	}
	return resp.UID, nil
}

func (sb *Sandbox) defaults(req ExecRequest) ExecRequest {
	if req.Timeout <= 0 {
		req.Timeout = sb.m.cfg.ExecTimeout
	}
	if req.MaxOutput <= 0 {
		req.MaxOutput = sb.m.cfg.MaxOutput
	}
	if req.Dir == "" {
		req.Dir = Workspace
	}
	return req
}

// Exec runs a command through the agent, or through `docker exec` when the
// image has none.
func (sb *Sandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	if strings.TrimSpace(req.Cmd) == "" {
		return ExecResult{}, errors.New("exec: empty command")
	}
	if sb.conn == nil {
		return sb.ExecDocker(ctx, req)
	}
	req = sb.defaults(req)
	ctx, cancel := context.WithTimeout(ctx, req.Timeout+hostGrace)
	defer cancel()
	resp, err := sb.conn.call(ctx, agent.Request{
		Op: agent.OpExec, Cmd: req.Cmd, Dir: req.Dir, Env: req.Env, Stdin: req.Stdin,
		TimeoutMS: req.Timeout.Milliseconds(), MaxOutput: req.MaxOutput, KeepStrays: req.KeepStrays,
	})
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in %s: %w", short(sb.ID), err)
	}
	return ExecResult{
		ExitCode: resp.ExitCode, Stdout: resp.Stdout, Stderr: resp.Stderr,
		StdoutSize: resp.StdoutSize, StderrSize: resp.StderrSize,
		Truncated: resp.Truncated, TimedOut: resp.TimedOut,
		Duration: time.Duration(resp.DurationUS) * time.Microsecond,
	}, nil
}

// ExecDocker runs a command with `docker exec`: the fallback path, and the
// baseline the agent is benchmarked against. The timeout is enforced inside
// by timeout(1) and outside by the context.
func (sb *Sandbox) ExecDocker(ctx context.Context, req ExecRequest) (ExecResult, error) {
	if strings.TrimSpace(req.Cmd) == "" {
		return ExecResult{}, errors.New("exec: empty command")
	}
	req = sb.defaults(req)
	ctx, cancel := context.WithTimeout(ctx, req.Timeout+hostGrace)
	defer cancel()
	secs := strconv.FormatFloat(req.Timeout.Seconds(), 'f', 3, 64)
	start := time.Now()
	created, err := sb.m.cli.ExecCreate(ctx, sb.ID, client.ExecCreateOptions{
		User: SandboxUser, WorkingDir: req.Dir, Env: req.Env,
		AttachStdout: true, AttachStderr: true, AttachStdin: len(req.Stdin) > 0,
		Cmd: []string{"timeout", "-s", "KILL", secs, "sh", "-c", req.Cmd},
	})
	if err != nil {
		return ExecResult{}, fmt.Errorf("docker exec create in %s: %w", short(sb.ID), err)
	}
	hj, err := sb.m.cli.ExecAttach(ctx, created.ID, client.ExecAttachOptions{})
	if err != nil {
		return ExecResult{}, fmt.Errorf("docker exec attach in %s: %w", short(sb.ID), err)
	}
	defer hj.Close()
	stop := context.AfterFunc(ctx, hj.Close)
	defer stop()
	if len(req.Stdin) > 0 {
		_, _ = hj.Conn.Write(req.Stdin)
	}
	_ = hj.CloseWrite()
	stdout := &capWriter{max: req.MaxOutput}
	stderr := &capWriter{max: req.MaxOutput}
	if _, err := stdcopy.StdCopy(stdout, stderr, hj.Reader); err != nil && ctx.Err() == nil {
		return ExecResult{}, fmt.Errorf("docker exec read in %s: %w", short(sb.ID), err)
	}
	if ctx.Err() != nil {
		return ExecResult{}, fmt.Errorf("docker exec in %s: %w", short(sb.ID), ctx.Err())
	}
	ins, err := sb.m.cli.ExecInspect(ctx, created.ID, client.ExecInspectOptions{})
	if err != nil {
		return ExecResult{}, fmt.Errorf("docker exec inspect in %s: %w", short(sb.ID), err)
	}
	res := ExecResult{
		ExitCode: ins.ExitCode, Stdout: stdout.buf, Stderr: stderr.buf,
		StdoutSize: stdout.total, StderrSize: stderr.total,
		Truncated: stdout.total > req.MaxOutput || stderr.total > req.MaxOutput,
		Duration:  time.Since(start),
	}
	// timeout(1) -s KILL makes the command die of SIGKILL (137).
	res.TimedOut = ins.ExitCode == 137 && res.Duration >= req.Timeout
	return res, nil
}

type capWriter struct {
	max   int64
	buf   []byte
	total int64
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.total += int64(len(p))
	if room := w.max - int64(len(w.buf)); room > 0 {
		w.buf = append(w.buf, p[:min(int64(len(p)), room)]...)
	}
	return len(p), nil
}

// resolve makes a path absolute against /workspace.
func resolve(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.ContainsRune(p, 0) {
		return "", errors.New("path contains NUL")
	}
	if !path.IsAbs(p) {
		p = path.Join(Workspace, p)
	}
	return path.Clean(p), nil
}

// ReadFile returns up to maxBytes of a file (0 means 4 MiB) and its full size.
func (sb *Sandbox) ReadFile(ctx context.Context, p string, maxBytes int64) (data []byte, size int64, err error) {
	if p, err = resolve(p); err != nil {
		return nil, 0, fmt.Errorf("read file: %w", err)
	}
	if sb.conn == nil {
		return sb.readFileDocker(ctx, p, maxBytes)
	}
	resp, err := sb.conn.call(ctx, agent.Request{Op: agent.OpReadFile, Path: p, MaxBytes: maxBytes})
	if err != nil {
		return nil, 0, err
	}
	return resp.Data, resp.Size, nil
}

// WriteFile creates or replaces a file as the sandbox user, creating parent
// directories.
func (sb *Sandbox) WriteFile(ctx context.Context, p string, data []byte, mode uint32) error {
	p, err := resolve(p)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	if sb.conn == nil {
		return sb.writeFileDocker(ctx, p, data, mode)
	}
	_, err = sb.conn.call(ctx, agent.Request{Op: agent.OpWriteFile, Path: p, Data: data, Mode: mode})
	return err
}

// ListFiles lists a directory tree down to maxDepth levels (0 means 1),
// without descending into .git.
func (sb *Sandbox) ListFiles(ctx context.Context, p string, maxDepth int) ([]agent.Entry, error) {
	p, err := resolve(p)
	if err != nil {
		return nil, fmt.Errorf("list files: %w", err)
	}
	if sb.conn == nil {
		return sb.listFilesDocker(ctx, p, maxDepth)
	}
	resp, err := sb.conn.call(ctx, agent.Request{Op: agent.OpListFiles, Path: p, MaxDepth: maxDepth})
	if err != nil {
		return nil, err
	}
	return resp.Entries, nil
}

// KillStrays kills every process in the sandbox except init and the agent.
func (sb *Sandbox) KillStrays(ctx context.Context) (int, error) {
	if sb.conn == nil {
		res, err := sb.ExecDocker(ctx, ExecRequest{Cmd: "kill -9 -1 2>/dev/null; true", Timeout: 10 * time.Second})
		if err != nil {
			return 0, err
		}
		return res.ExitCode, nil
	}
	resp, err := sb.conn.call(ctx, agent.Request{Op: agent.OpKillStrays})
	return resp.Killed, err
}

// readFileDocker reads through a shell: `docker cp` does not see tmpfs
// mounts, and every writable place of a sandbox is one.
func (sb *Sandbox) readFileDocker(ctx context.Context, p string, maxBytes int64) ([]byte, int64, error) {
	if maxBytes <= 0 {
		maxBytes = agent.DefaultReadBytes
	}
	q := shellQuote(p)
	res, err := sb.ExecDocker(ctx, ExecRequest{
		Cmd:       fmt.Sprintf("if [ -f %s ]; then cat %s; else echo 'not a regular file' >&2; exit 2; fi", q, q),
		MaxOutput: maxBytes,
		Timeout:   30 * time.Second,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read file %s: %w", p, err)
	}
	if res.ExitCode != 0 {
		return nil, 0, fmt.Errorf("read file %s: %s", p, bytes.TrimSpace(res.Stderr))
	}
	return res.Stdout, res.StdoutSize, nil
}

// writeFileDocker writes through a shell as the sandbox user: copying a tar
// into the container would write as root and bypass file permissions.
func (sb *Sandbox) writeFileDocker(ctx context.Context, p string, data []byte, mode uint32) error {
	if mode == 0 {
		mode = 0o644
	}
	q := shellQuote(p)
	res, err := sb.ExecDocker(ctx, ExecRequest{
		Cmd:     fmt.Sprintf("mkdir -p %s && rm -f %s && cat > %s && chmod %o %s", shellQuote(path.Dir(p)), q, q, mode&0o777, q),
		Stdin:   data,
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("write file %s: %w", p, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("write file %s: %s", p, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

func (sb *Sandbox) listFilesDocker(ctx context.Context, p string, maxDepth int) ([]agent.Entry, error) {
	if maxDepth <= 0 {
		maxDepth = 1
	}
	res, err := sb.ExecDocker(ctx, ExecRequest{
		Cmd:     fmt.Sprintf("find %s -mindepth 1 -maxdepth %d -name .git -prune -o -print", shellQuote(p), maxDepth),
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("list files %s: %s", p, bytes.TrimSpace(res.Stderr))
	}
	var out []agent.Entry
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if line != "" {
			out = append(out, agent.Entry{Path: line})
		}
	}
	return out, nil
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

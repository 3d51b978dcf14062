// Package agent is the in-container agent of a sandbox and its wire protocol.
//
// The agent is a small static binary that runs as the container's main
// process (under docker-init) and serves requests on its stdin/stdout, which
// the host reaches through one long-lived `docker attach`. The container has
// no network, so this channel is the only way in; it costs one write and one
// read per request instead of the create/start/inspect round trips of a
// `docker exec`.
//
// Frames are a 4-byte big-endian length followed by a JSON object. Requests
// carry an id; responses echo it, so many requests can be in flight at once.
// This package must not import anything outside the standard library: it is
// compiled into the agent with CGO_ENABLED=0.
package agent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ProtocolVersion is bumped on any incompatible change to Request or Response.
const ProtocolVersion = 1

// MaxFrameBytes bounds one frame in either direction, so a corrupt length
// prefix can never make a reader allocate gigabytes.
const MaxFrameBytes = 64 << 20

// Operations understood by the agent.
const (
	OpPing       = "ping"
	OpExec       = "exec"
	OpReadFile   = "read_file"
	OpWriteFile  = "write_file"
	OpListFiles  = "list_files"
	OpKillStrays = "kill_strays"
	OpCancel     = "cancel"
)

// Request is one call from the host.
type Request struct {
	ID uint64 `json:"id"`
	Op string `json:"op"`

	// exec
	Cmd       string   `json:"cmd,omitempty"`
	Dir       string   `json:"dir,omitempty"`
	Env       []string `json:"env,omitempty"`
	Stdin     []byte   `json:"stdin,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	// MaxOutput caps stdout and stderr each; the rest is counted, not kept.
	MaxOutput int64 `json:"max_output,omitempty"`
	// KeepStrays leaves processes the command started in the background alive
	// after it returns; by default they are killed with its process group.
	KeepStrays bool `json:"keep_strays,omitempty"`

	// files
	Path     string `json:"path,omitempty"`
	Data     []byte `json:"data,omitempty"`
	Mode     uint32 `json:"mode,omitempty"`
	MaxBytes int64  `json:"max_bytes,omitempty"`
	MaxDepth int    `json:"max_depth,omitempty"`

	// cancel: the id of the request to stop.
	Target uint64 `json:"target,omitempty"`
}

// Response answers the Request with the same ID.
type Response struct {
	ID    uint64 `json:"id"`
	Error string `json:"error,omitempty"`

	// ping
	Version int `json:"version,omitempty"`
	PID     int `json:"pid,omitempty"`
	UID     int `json:"uid,omitempty"`

	// exec
	ExitCode   int    `json:"exit_code"`
	Stdout     []byte `json:"stdout,omitempty"`
	Stderr     []byte `json:"stderr,omitempty"`
	StdoutSize int64  `json:"stdout_size,omitempty"`
	StderrSize int64  `json:"stderr_size,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Signal     string `json:"signal,omitempty"`
	DurationUS int64  `json:"duration_us,omitempty"`

	// read_file
	Data []byte `json:"data,omitempty"`
	Size int64  `json:"size,omitempty"`

	// list_files
	Entries []Entry `json:"entries,omitempty"`

	// kill_strays
	Killed int `json:"killed,omitempty"`
}

// Entry is one file or directory returned by list_files.
type Entry struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"`
	IsDir bool   `json:"is_dir,omitempty"`
}

// ErrFrameTooLarge is returned for a frame over MaxFrameBytes.
var ErrFrameTooLarge = errors.New("agent frame too large")

// WriteFrame encodes v as one frame.
func WriteFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if len(body) > MaxFrameBytes {
		return ErrFrameTooLarge
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

// ReadFrame decodes one frame into v. It returns io.EOF only at a clean
// frame boundary.
func ReadFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrameBytes {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	// Read, not allocate, up to the announced length: a short stream with a
	// large header must not cost the whole allocation.
	body, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return fmt.Errorf("read frame body: %w", err)
	}
	if len(body) < int(n) {
		return fmt.Errorf("read frame body: %w", io.ErrUnexpectedEOF)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode frame: %w", err)
	}
	return nil
}

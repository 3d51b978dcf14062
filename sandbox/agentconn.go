package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/flywheel-ai/flywheel/sandbox/agent"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// ErrAgentGone is returned for calls on a connection whose stream has ended
// (the container stopped, or the attach was closed).
var ErrAgentGone = errors.New("sandbox agent connection closed")

// agentConn multiplexes requests to the in-container agent over one
// attached stream: frames go to the container's stdin, responses come back on
// its stdout, which the daemon interleaves with stderr (stdcopy framing).
type agentConn struct {
	hj   client.HijackedResponse
	log  *slog.Logger
	next atomic.Uint64

	wmu sync.Mutex // one frame at a time on stdin

	mu      sync.Mutex
	pending map[uint64]chan agent.Response
	err     error
	done    chan struct{}
}

func newAgentConn(hj client.HijackedResponse, log *slog.Logger) *agentConn {
	c := &agentConn{hj: hj, log: log, pending: make(map[uint64]chan agent.Response), done: make(chan struct{})}
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, logWriter{log}, hj.Reader)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	go c.readLoop(pr)
	return c
}

func (c *agentConn) readLoop(r io.Reader) {
	var err error
	for {
		var resp agent.Response
		if err = agent.ReadFrame(r, &resp); err != nil {
			break
		}
		c.mu.Lock()
		ch := c.pending[resp.ID]
		delete(c.pending, resp.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", ErrAgentGone, err)
	c.pending = nil
	c.mu.Unlock()
	close(c.done)
}

// call sends req and waits for its response, ctx's end or the stream's end.
// When ctx ends first a running exec is cancelled inside the container too.
func (c *agentConn) call(ctx context.Context, req agent.Request) (agent.Response, error) {
	req.ID = c.next.Add(1)
	ch := make(chan agent.Response, 1)
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return agent.Response{}, err
	}
	c.pending[req.ID] = ch
	c.mu.Unlock()

	if err := c.send(req); err != nil {
		c.forget(req.ID)
		return agent.Response{}, err
	}
	select {
	case resp := <-ch:
		if resp.Error != "" {
			return resp, &AgentError{Op: req.Op, Msg: resp.Error}
		}
		return resp, nil
	case <-c.done:
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		return agent.Response{}, err
	case <-ctx.Done():
		c.forget(req.ID)
		if req.Op == agent.OpExec {
			_ = c.send(agent.Request{ID: c.next.Add(1), Op: agent.OpCancel, Target: req.ID})
		}
		return agent.Response{}, ctx.Err()
	}
}

func (c *agentConn) send(req agent.Request) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := agent.WriteFrame(c.hj.Conn, req); err != nil {
		return fmt.Errorf("%w: send: %v", ErrAgentGone, err)
	}
	return nil
}

func (c *agentConn) forget(id uint64) {
	c.mu.Lock()
	if c.pending != nil {
		delete(c.pending, id)
	}
	c.mu.Unlock()
}

func (c *agentConn) close() { c.hj.Close() }

// AgentError is an error reported by the agent for one request (a missing
// file, a bad path); the connection stays usable.
type AgentError struct {
	Op  string
	Msg string
}

func (e *AgentError) Error() string { return "sandbox agent " + e.Op + ": " + e.Msg }

// logWriter forwards the agent's stderr to the logger.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Warn("sandbox agent stderr", "output", string(p))
	return len(p), nil
}

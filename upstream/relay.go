package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
)

// What the relaying clients share (Anthropic's Messages, OpenAI's
// Responses): a body sent on as the client wrote it but for its model,
// tried on each of the deployment's models in turn, and a stream's events
// passed on as they arrive.

// maxSSELine bounds one line of a relayed stream.
const maxSSELine = 16 << 20

// SSEEvent is one server-sent event of a relayed stream, as the server
// sent it.
type SSEEvent struct {
	Name string
	Data []byte
	// delta is the event's increment for a client of another protocol
	// (nil: none).
	delta *inference.Delta
}

// Relayed is a relayed call's answer.
type Relayed struct {
	// Body is a non-streamed answer as the server sent it.
	Body []byte
	// Response is what capture records of the answer.
	Response *inference.Response
	// ID is the server's id for the answer where the client names it
	// later (a Responses API response is read, deleted and continued by
	// it), "" otherwise.
	ID string
}

// relayAttempt is one attempt at a relayed call of model with body (its
// model already replaced); a stream's events go to emit.
type relayAttempt func(ctx context.Context, body []byte, model string, emit func(SSEEvent) error) (*Relayed, error)

// relayModels runs a relayed call on each model in turn, its body's model
// replaced, moving on as Fallback does; each model's attempts are retried
// as cfg says. A stream is neither retried nor moved on once an event was
// emitted. A whole answer's attempt is bounded by the timeout.
func relayModels(ctx context.Context, cfg Config, models []string, body []byte, stream bool, emit func(SSEEvent) error, attempt relayAttempt) (*Relayed, error) {
	start := time.Now()
	var out *Relayed
	var err error
	for _, model := range models {
		emitted := false
		var named []byte
		if named, err = withModel(body, model); err != nil {
			return nil, err
		}
		err = retryLoop(ctx, cfg, func(ctx context.Context) error {
			if !stream {
				actx, cancel := context.WithTimeout(ctx, cfg.Timeout)
				defer cancel()
				out, err = attempt(actx, named, model, nil)
				return err
			}
			out, err = attempt(ctx, named, model, func(ev SSEEvent) error {
				emitted = true
				return emit(ev)
			})
			if err != nil && emitted {
				return noRetry{err}
			}
			return err
		})
		var nr noRetry
		if errors.As(err, &nr) {
			err = nr.err
		}
		if err == nil || emitted || !Retryable(err) {
			break
		}
	}
	if out != nil && out.Response != nil {
		out.Response.Latency = time.Since(start)
	}
	return out, err
}

func withModel(body []byte, model string) ([]byte, error) {
	name, _ := json.Marshal(model)
	out, err := protocol.SetField(body, "model", name)
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadRequest, Message: "body: " + err.Error()}
	}
	return out, nil
}

// errIdle ends a stream whose server said nothing for the timeout.
var errIdle = errors.New("upstream: no event within the timeout")

// relayStream opens a relayed stream and reads it. The timeout bounds the
// wait for the headers and each gap between events (read calls tick on
// every line), not the whole answer: a long answer streams for as long
// as it takes.
func relayStream(ctx context.Context, timeout time.Duration, open func(context.Context) (*http.Response, error), read func(r io.Reader, tick func()) (*Relayed, error)) (*Relayed, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := time.AfterFunc(timeout, func() { cancel(errIdle) })
	defer idle.Stop()
	timedOut := func(err error) error {
		if errors.Is(context.Cause(ctx), errIdle) {
			return &inference.Error{Status: http.StatusGatewayTimeout, Message: "upstream timed out", Err: errIdle}
		}
		return err
	}
	resp, err := open(ctx)
	if err != nil {
		return nil, timedOut(err)
	}
	defer resp.Body.Close()
	out, err := read(resp.Body, func() { idle.Reset(timeout) })
	var ie *inference.Error
	if errors.As(err, &ie) && errors.Is(ie.Err, errStreamBroke) {
		err = timedOut(err)
	}
	return out, err
}

// errStreamBroke is a stream whose connection failed mid-way.
var errStreamBroke = errors.New("upstream: stream broke")

// errStreamEnded is a stream that ended before its last event.
var errStreamEnded = errors.New("upstream: stream ended early")

// scanSSE reads server-sent events and hands each to handle, in order,
// until handle says the stream is done or fails; tick is called on every
// line. A stream that ends before handle said done is errStreamEnded; a
// connection that fails is an *inference.Error wrapping errStreamBroke.
func scanSSE(r io.Reader, tick func(), handle func(SSEEvent) (done bool, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxSSELine)
	var ev SSEEvent
	var data bytes.Buffer
	for sc.Scan() {
		tick()
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if data.Len() == 0 {
				continue
			}
			ev.Data = append([]byte(nil), data.Bytes()...)
			data.Reset()
			done, err := handle(ev)
			if err != nil || done {
				return err
			}
			ev = SSEEvent{}
		case bytes.HasPrefix(line, []byte("event:")):
			ev.Name = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(bytes.TrimPrefix(line[len("data:"):], []byte(" ")))
		}
	}
	if err := sc.Err(); err != nil {
		return &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream broke", Err: errors.Join(errStreamBroke, err)}
	}
	return errStreamEnded
}

package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/trace"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
)

const (
	msgContinuationLookupFailed = "continuation lookup failed; serving without stitching"
	msgEndAfterDoneFailed       = "ending session after X-Session-Done failed"
)

// Identity modes, as stored in sessions.identity_mode.
const (
	modeKey      = "key"
	modeHeader   = "header"
	modePath     = "path"
	modeStitched = "stitched"
	modeExplicit = "explicit"
)

// Interaction statuses.
const (
	statusOK        = "ok"
	statusUpstream  = "upstream_error"
	statusCancelled = "client_cancelled"
)

var sessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:\-]{1,128}$`)

// call is one model call on its way through the gateway.
type call struct {
	protocol string
	stream   bool
	req      *inference.Request
	// client are the messages as the client sent them (before injection):
	// what conversation hashes cover.
	client       []inference.Message
	p            *principal
	endUser      string
	sessionID    string
	mode         string
	done         bool
	completionID string
	target       *target
	started      time.Time
	// reuse is set when PromptTokenIDs came from a stored turn produced
	// under reuseSystem.
	reuse       bool
	reuseSystem string
	// toolVersions names the tool-schema version applied to each tool.
	toolVersions map[string]string
	// span is the call's trace span, ended with its capture.
	span trace.Span
	// tail is this turn's conversation, remembered once committed so that
	// the session's next turn stores only what is new (tails.go).
	tail *tail
	// chained is the session of the stored response this call continues
	// (Responses API previous_response_id).
	chained string
	// group and groupSize are the GRPO group of the call's session, when
	// the call made it (one choice of n, group.go).
	group     string
	groupSize int
}

// prepare resolves the session, the route and the reusable prompt ids.
// chained is the session of the stored response the call continues ("":
// none).
func (s *Server) prepare(c *gin.Context, protocol string, req *inference.Request, stream bool, endUser, chained string) (*call, error) {
	p := principalOf(c)
	cl := &call{protocol: protocol, stream: stream, req: req, p: p, endUser: endUser, started: time.Now(), chained: chained}
	cl.client = append([]inference.Message(nil), req.Messages...)
	if err := p.mayUse(req.Model); err != nil {
		return nil, err
	}
	if err := s.checkBudget(c.Request.Context(), p); err != nil {
		return nil, err
	}
	if err := s.limitTokens(c, p); err != nil {
		return nil, err
	}
	if err := s.resolveSession(c, cl); err != nil {
		return nil, err
	}
	// Before any byte of a stream goes out: the client learns its session
	// (useful in stitched mode) from the response headers.
	c.Header("X-Session-Id", cl.sessionID)
	t, err := s.router.resolve(c.Request.Context(), req.Model, p.TenantID, cl.sessionID)
	if err != nil {
		return nil, err
	}
	cl.target = t
	req.Version = t.version
	req.Messages = artefact.InjectSystem(req.Messages, t.system)
	var changed []string
	if req.Tools, changed = t.artefacts.Tools(p.TenantID, req.Tools); len(changed) > 0 {
		cl.toolVersions = map[string]string{}
		for _, name := range changed {
			cl.toolVersions[name] = strconv.Itoa(t.toolVersion)
		}
	}
	switch protocol {
	case protoAnthropic:
		cl.completionID = newID("msg_")
	case protoResponses:
		cl.completionID = newID("resp_")
	default:
		cl.completionID = newID("chatcmpl-")
	}
	s.startSpan(c, cl)
	return cl, nil
}

// resolveSession applies the identity modes in the design's order:
// per-session key, X-Session-Id, /s/{id}/ path, the session of a continued
// Responses API response, then stitching onto the session whose last
// conversation this request extends.
func (s *Server) resolveSession(c *gin.Context, cl *call) error {
	switch {
	case cl.p.SessionID != "":
		cl.sessionID, cl.mode = cl.p.SessionID, modeKey
	case c.GetHeader("X-Session-Id") != "":
		cl.sessionID, cl.mode = c.GetHeader("X-Session-Id"), modeHeader
	case c.Param("session_id") != "":
		cl.sessionID, cl.mode = c.Param("session_id"), modePath
	case cl.chained != "":
		// The session exists: the stored response was captured in it.
		cl.sessionID, cl.mode = cl.chained, modeStitched
	}
	if cl.sessionID != "" && !sessionIDPattern.MatchString(cl.sessionID) {
		return errf(http.StatusBadRequest, "session id: use 1-128 letters, digits, '.', '_', ':' or '-'")
	}
	cl.done = c.GetHeader("X-Session-Done") == "true"
	hashes := prefixHashes(cl.client)
	if len(hashes) > 0 {
		cont, err := store.FindContinuation(c.Request.Context(), s.deps.DB, cl.p.TenantID, hashes)
		switch {
		case err == nil:
			if cl.sessionID == "" {
				cl.sessionID, cl.mode = cont.SessionID, modeStitched
			}
			s.reusePromptIDs(cl, cont)
		case !errors.Is(err, store.ErrNotFound):
			s.deps.Logger.Warn(msgContinuationLookupFailed, append(logAttrs(c), "err", err)...)
		}
	}
	if cl.sessionID == "" {
		cl.sessionID, cl.mode = newID("sess_"), modeStitched
	}
	return nil
}

// reusePromptIDs hands the backend the stored token ids of the
// conversation this request extends, so the next turn's prompt is not
// re-tokenised (no drift), when the same deployment and injected system
// text served it. The router has not run yet, so the system text is
// compared after routing, in generate.
func (s *Server) reusePromptIDs(cl *call, cont *store.Continuation) {
	if cont.Deployment != cl.req.Model {
		return
	}
	// The ids are those of the session's last turn this gateway committed;
	// another turn's are not at hand (they are stored as a suffix).
	prev := s.tails.get(tailKey{cl.p.TenantID, cont.SessionID})
	if prev == nil || prev.id != cont.InteractionID || len(prev.ids) == 0 {
		return
	}
	ids := make([]int, len(prev.ids))
	for i, id := range prev.ids {
		ids[i] = int(id)
	}
	cl.req.PromptTokenIDs = ids
	cl.reuseSystem = cont.InjectedSystem
	cl.reuse = true
}

// validUTF8 replaces each invalid byte with U+FFFD, exactly as
// encoding/json does when it writes the reply, so the stored text is the
// text the client sees and later sends back (stitching hashes it).
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// fillToolCallIDs gives every tool call an id the client can answer to and
// makes the reply's text valid UTF-8.
func fillToolCallIDs(protocol string, m *inference.Message) {
	m.Content, m.Reasoning = validUTF8(m.Content), validUTF8(m.Reasoning)
	for i := range m.ToolCalls {
		m.ToolCalls[i].Arguments = validUTF8(m.ToolCalls[i].Arguments)
		if m.ToolCalls[i].ID == "" {
			if protocol == protoAnthropic {
				m.ToolCalls[i].ID = newID("toolu_")
			} else {
				m.ToolCalls[i].ID = newID("call_")
			}
		}
	}
}

// jsonb cannot hold U+0000; replace it rather than lose the row.
func pgJSON(b []byte) []byte {
	if bytes.Contains(b, []byte(`\u0000`)) {
		return bytes.ReplaceAll(b, []byte(`\u0000`), []byte(`\ufffd`))
	}
	return b
}

func toInt32(xs []int) []int32 {
	if xs == nil {
		return nil
	}
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

// row builds the interaction to capture from a finished (or failed) call.
func (s *Server) row(c *gin.Context, cl *call, resp *inference.Response, genErr error, status string) *store.NewInteraction {
	key := tailKey{cl.p.TenantID, cl.sessionID}
	var prompt []int32
	if resp != nil {
		prompt = toInt32(resp.PromptTokenIDs)
	}
	// Stored: the messages and prompt ids beyond the session's last turn,
	// and without the reused prompt ids (the prompt_token_ids column holds
	// them).
	req := *cl.req
	var promptSuffix []int32
	var prefix store.Prefix
	req.Messages, promptSuffix, prefix = suffix(s.tails.get(key), cl.req.Messages, prompt)
	req.PromptTokenIDs = nil
	reqJSON, _ := json.Marshal(trajectory.StoredRequest{Request: &req, InjectedSystem: cl.target.system, ToolVersions: cl.toolVersions,
		Artefacts: cl.target.artefactsKey, Protocol: cl.protocol, EndUser: cl.endUser})
	n := &store.NewInteraction{
		TenantID: cl.p.TenantID, SessionID: cl.sessionID, IdentityMode: cl.mode, EndUser: cl.endUser,
		CompletionID: cl.completionID, Protocol: cl.protocol, Stream: cl.stream, Deployment: cl.target.deployment,
		Request: pgJSON(reqJSON), Status: status, LatencyMS: float64(time.Since(cl.started).Microseconds()) / 1000,
		RequestID: c.GetString(ctxRequestID), KeyID: cl.p.AccountTo(), Prefix: prefix,
	}
	if genErr != nil {
		n.Error = asAPIError(genErr).Message
		if n.Error == "internal error" {
			n.Error = genErr.Error()
		}
	}
	if resp != nil {
		stored := *resp
		stored.PromptTokenIDs, stored.CompletionTokenIDs, stored.Logprobs = nil, nil, nil
		stored.CompletionTokens, stored.TopLogprobs = nil, nil
		respJSON, _ := json.Marshal(stored)
		n.Response = pgJSON(respJSON)
		n.ModelVersion = resp.ModelVersion
		n.PromptTokenIDs = promptSuffix
		n.CompletionTokenIDs = toInt32(resp.CompletionTokenIDs)
		n.Logprobs = resp.Logprobs
		n.PromptTokens, n.CompletionTokens = resp.Usage.PromptTokens, resp.Usage.CompletionTokens
		if n.PromptTokens == 0 {
			n.PromptTokens = len(resp.PromptTokenIDs)
		}
		if n.CompletionTokens == 0 {
			n.CompletionTokens = len(resp.CompletionTokenIDs)
		}
		n.FinishReason = resp.FinishReason
		if status == statusOK {
			n.ContinuationHash = continuationHash(cl.client, resp.Message)
			cl.tail = &tail{key: key, messages: append(append(make([]inference.Message, 0, len(cl.req.Messages)+1), cl.req.Messages...), resp.Message),
				ids: append(append(make([]int32, 0, len(prompt)+len(n.CompletionTokenIDs)), prompt...), n.CompletionTokenIDs...)}
		}
	}
	if n.ModelVersion == "" {
		n.ModelVersion = cl.req.Version
	}
	return n
}

// commit captures the interaction and, once it is in Postgres, queues the
// session notices. Its error is what the client must see instead of 2xx.
func (s *Server) commit(c *gin.Context, cl *call, row *store.NewInteraction) (err error) {
	defer func() { endSpan(cl, row, err) }()
	// The tokens were spent, whether or not the capture succeeds.
	s.chargeTokens(cl.p, row.PromptTokens+row.CompletionTokens)
	// A client that went away still gets its call recorded (as cancelled):
	// the capture must not depend on the connection staying open.
	captured, err := s.capture.Submit(context.WithoutCancel(c.Request.Context()), row)
	if errors.Is(err, store.ErrSessionClosed) {
		return s.closedSessionError(c.Request.Context(), cl)
	}
	if err != nil {
		return &apiError{Status: http.StatusServiceUnavailable, Message: "the interaction could not be recorded; retry", RetryAfter: time.Second}
	}
	if cl.tail != nil {
		cl.tail.id = captured.ID
		s.tails.put(cl.tail)
	}
	s.metrics.tokens.WithLabelValues(cl.target.deployment, "prompt").Add(float64(row.PromptTokens))
	s.metrics.tokens.WithLabelValues(cl.target.deployment, "completion").Add(float64(row.CompletionTokens))
	s.metrics.account(row)
	in := flow.SessionInput{SessionID: cl.sessionID, TenantID: cl.p.TenantID, Deployment: cl.target.deployment,
		GroupID: cl.group, GroupSize: max(cl.groupSize, 1)}
	evs := []flow.SessionEvent{{Kind: flow.EventStep, InteractionID: captured.ID, At: time.Now()}}
	if cl.done {
		s.tails.forget(tailKey{cl.p.TenantID, cl.sessionID})
		if _, err := store.EndSession(c.Request.Context(), s.deps.DB, cl.p.TenantID, cl.sessionID); err != nil {
			s.deps.Logger.Warn(msgEndAfterDoneFailed, append(logAttrs(c), "session", cl.sessionID, "err", err)...)
		} else {
			evs = append(evs, flow.SessionEvent{Kind: flow.EventEnd, At: time.Now()})
		}
	}
	// One notice: a delivery between the step and the end would send the
	// step alone, a second workflow task for the session.
	s.notifier.Notify(in, evs...)
	return nil
}

// closedSessionError says why a session refused a step.
func (s *Server) closedSessionError(ctx context.Context, cl *call) error {
	status, err := store.SessionStatus(ctx, s.deps.DB, cl.p.TenantID, cl.sessionID)
	if err != nil {
		return errf(http.StatusNotFound, "session %q not found", cl.sessionID)
	}
	return errf(http.StatusConflict, "session %q is %s; start a new session", cl.sessionID, status)
}

// generate runs a non-streaming call and captures it. On success the
// response is committed; on a backend failure the failure is committed
// (it explains a gap in the trajectory) and returned.
func (s *Server) generate(c *gin.Context, cl *call) (*inference.Response, error) {
	s.checkReuse(cl)
	resp, err := cl.target.backend.Complete(c.Request.Context(), cl.req)
	return s.captureWhole(c, cl, resp, err)
}

// captureWhole captures the outcome of a non-streaming call, as generate
// describes: the response, or the backend's error err.
func (s *Server) captureWhole(c *gin.Context, cl *call, resp *inference.Response, err error) (*inference.Response, error) {
	status := statusOK
	if err != nil {
		status = statusUpstream
		if c.Request.Context().Err() != nil {
			status = statusCancelled
		}
		s.metrics.backendErrors.WithLabelValues(cl.target.deployment, http.StatusText(asAPIError(err).Status)).Inc()
		resp = nil
	} else {
		fillToolCallIDs(cl.protocol, &resp.Message)
	}
	if cerr := s.commit(c, cl, s.row(c, cl, resp, err, status)); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// checkReuse drops reused prompt ids when the injected system text
// changed since they were produced (they would encode the old prompt).
func (s *Server) checkReuse(cl *call) {
	if cl.reuse && cl.reuseSystem != cl.target.system {
		cl.req.PromptTokenIDs = nil
	}
}

package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/store"
)

// maxExportSessions bounds one export request; page with since/until.
const maxExportSessions = 10000

// sessionSteps is a session's interactions as ATDP steps, with the
// rewards bound to them, redacted.
type sessionSteps struct {
	info  *store.SessionInfo
	rows  []store.InteractionRow
	steps []*atdp.Step
}

// buildSteps assembles a session's steps live from Postgres (the same
// view the session workflow writes to atdp_steps when the session ends;
// where it has, its eligibility verdict wins).
func (s *Server) buildSteps(ctx context.Context, info *store.SessionInfo) (*sessionSteps, error) {
	return s.exporter().buildSteps(ctx, info)
}

// exporter turns stored interactions into ATDP steps; the HTTP export and
// `flywheel export` share it.
type exporter struct {
	db       store.DBTX
	weights  map[string]float64
	discount float64
	redactor *redact.Redactor
}

func (s *Server) exporter() *exporter {
	return &exporter{db: s.deps.DB, weights: s.cfg.RewardWeights, discount: s.cfg.Discount, redactor: s.redactor}
}

func (s *exporter) buildSteps(ctx context.Context, info *store.SessionInfo) (*sessionSteps, error) {
	rows, err := store.SessionInteractions(ctx, s.db, info.TenantID, info.ID)
	if err != nil {
		return nil, err
	}
	rewards, err := store.SessionRewards(ctx, s.db, info.TenantID, info.ID)
	if err != nil {
		return nil, err
	}
	assembled, err := store.AssembledSteps(ctx, s.db, info.TenantID, info.ID)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	per, merged := stepRewards(ids, rewards, s.weights)
	returns := discountedReturns(merged, s.discount)
	out := &sessionSteps{info: info, rows: rows}
	for i, r := range rows {
		var req storedRequest
		req.Request = &inference.Request{}
		_ = json.Unmarshal(r.Request, &req) // a row that does not parse still exports its ids and tokens
		var resp inference.Response
		if len(r.Response) > 0 {
			_ = json.Unmarshal(r.Response, &resp)
		}
		st := &atdp.Step{ATDPVersion: atdp.Version}
		for _, m := range req.Messages {
			st.Observation.Messages = append(st.Observation.Messages, atdpMessage(m))
		}
		for _, t := range req.Tools {
			var params any
			_ = json.Unmarshal(t.Parameters, &params)
			st.Observation.Tools = append(st.Observation.Tools, atdp.Tool{Name: t.Name, Description: t.Description, Parameters: params, Version: req.ToolVersions[t.Name]})
		}
		st.InternalState.Reasoning = resp.Message.Reasoning
		st.Action.Message = atdpMessage(resp.Message)
		st.Action.Message.Role = inference.RoleAssistant
		st.Action.Tokens = atdp.Tokens{PromptIDs: ints(r.PromptTokenIDs), CompletionIDs: ints(r.CompletionTokenIDs), Logprobs: floats(r.Logprobs)}
		if r.ModelVersion != "" {
			st.Action.Tokens.Versions = []string{r.ModelVersion}
		}
		if i+1 < len(rows) {
			st.Result.ToolResults = toolResultsAfter(rows[i+1].Request, len(req.Messages))
		}
		st.Result.FinishReason, st.Result.LatencyMS, st.Result.Error = r.FinishReason, r.LatencyMS, r.ErrorText
		for _, rw := range per[i] {
			st.Reward.Values = append(st.Reward.Values, atdp.RewardValue{Value: rw.Value, Source: rw.Source, At: rw.CreatedAt.UTC().Format(time.RFC3339Nano)})
		}
		st.Reward.Merged, st.Reward.Return = merged[i], returns[i]
		st.Metadata = atdp.Metadata{
			TrajectoryID: info.ID, SessionID: info.ID, StepID: strconv.FormatInt(r.ID, 10), StepIndex: i,
			CompletionID: r.CompletionID, Tenant: info.TenantID, Model: r.Deployment, ModelVersion: r.ModelVersion,
			ToolVersions: req.ToolVersions,
			Usage:        atdp.Usage{PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens},
			Consent:      atdp.Consent{OptOut: info.OptOut, Basis: info.ConsentBasis},
			CreatedAt:    r.CreatedAt.UTC().Format(time.RFC3339Nano),
		}
		if i > 0 {
			st.Metadata.ParentStepID = strconv.FormatInt(rows[i-1].ID, 10)
		}
		s.redactor.Step(st)
		st.Metadata.Eligibility = eligibility(info, r, st, assembled)
		st.Normalize()
		out.steps = append(out.steps, st)
	}
	return out, nil
}

// eligibility says whether a step will train and, if not, why. The
// assembled verdict (it knows staleness and group filtering) wins;
// otherwise it is predicted from what is known now.
func eligibility(info *store.SessionInfo, r store.InteractionRow, st *atdp.Step, assembled map[int64]store.StepStatus) atdp.Eligibility {
	if a, ok := assembled[r.ID]; ok {
		return atdp.Eligibility{Trainable: a.Eligible, Reason: a.IneligibleReason}
	}
	switch {
	case info.OptOut:
		return atdp.Eligibility{Reason: atdp.ReasonOptedOut}
	case r.Status != statusOK:
		return atdp.Eligibility{Reason: atdp.ReasonUpstreamError}
	case len(r.CompletionTokenIDs) == 0 || len(r.Logprobs) != len(r.CompletionTokenIDs):
		return atdp.Eligibility{Reason: atdp.ReasonZeroTrainableTokens}
	case len(st.Metadata.Redactions) > 0:
		// Token ids still encode what the text redaction removed.
		return atdp.Eligibility{Reason: atdp.ReasonRedacted}
	case st.Reward.Return == nil:
		return atdp.Eligibility{Reason: atdp.ReasonNoReward}
	}
	return atdp.Eligibility{Trainable: true}
}

func atdpMessage(m inference.Message) atdp.Message {
	out := atdp.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, atdp.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return out
}

// toolResultsAfter is the tool messages the next call added after this
// call's prompt and reply.
func toolResultsAfter(next []byte, promptLen int) []atdp.Message {
	var req storedRequest
	req.Request = &inference.Request{}
	if json.Unmarshal(next, &req) != nil || len(req.Messages) <= promptLen+1 {
		return nil
	}
	var out []atdp.Message
	for _, m := range req.Messages[promptLen+1:] {
		if m.Role != inference.RoleTool {
			break
		}
		out = append(out, atdpMessage(m))
	}
	return out
}

func ints(xs []int32) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

func floats(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// getSession is GET /v1/sessions/{id}: the session and, for every step,
// whether it will train and, if not, why.
func (s *Server) getSession(c *gin.Context) {
	info, err := s.sessionFor(c, c.Param("id"))
	if err != nil {
		abort(c, err)
		return
	}
	ss, err := s.buildSteps(c.Request.Context(), info)
	if err != nil {
		abort(c, err)
		return
	}
	type stepView struct {
		StepID       string             `json:"step_id"`
		Index        int                `json:"index"`
		CompletionID string             `json:"completion_id"`
		Model        string             `json:"model"`
		ModelVersion string             `json:"model_version"`
		Status       string             `json:"status"`
		FinishReason string             `json:"finish_reason"`
		Tokens       atdp.Usage         `json:"tokens"`
		Rewards      []atdp.RewardValue `json:"rewards"`
		Reward       *float64           `json:"reward"`
		Return       *float64           `json:"return"`
		Redactions   []atdp.Redaction   `json:"redactions"`
		WillTrain    bool               `json:"will_train"`
		Reason       string             `json:"reason,omitempty"`
		CreatedAt    string             `json:"created_at"`
	}
	steps := make([]stepView, len(ss.steps))
	for i, st := range ss.steps {
		steps[i] = stepView{StepID: st.Metadata.StepID, Index: i, CompletionID: st.Metadata.CompletionID, Model: st.Metadata.Model,
			ModelVersion: st.Metadata.ModelVersion, Status: ss.rows[i].Status, FinishReason: st.Result.FinishReason,
			Tokens: st.Metadata.Usage, Rewards: st.Reward.Values, Reward: st.Reward.Merged, Return: st.Reward.Return,
			Redactions: st.Metadata.Redactions, WillTrain: st.Metadata.Eligibility.Trainable, Reason: st.Metadata.Eligibility.Reason,
			CreatedAt: st.Metadata.CreatedAt}
	}
	c.JSON(http.StatusOK, gin.H{
		"id": info.ID, "status": info.Status, "model": info.Deployment, "task_id": info.TaskID,
		"group_id": info.GroupID, "group_size": info.GroupSize,
		"consent": gin.H{"opt_out": info.OptOut, "basis": info.ConsentBasis},
		"steps":   steps,
	})
}

// exportTrajectories is GET /v1/trajectories?session_id=&end_user=&since=&until=&limit=:
// the tenant's steps as ATDP JSONL, one session after another, streamed.
func (s *Server) exportTrajectories(c *gin.Context) {
	p := principalOf(c)
	f := store.SessionFilter{TenantID: p.TenantID, SessionID: c.Query("session_id"), EndUser: c.Query("end_user"), Limit: 1000}
	if p.SessionID != "" {
		if f.SessionID != "" && f.SessionID != p.SessionID {
			abort(c, errf(http.StatusNotFound, "session %q not found", f.SessionID))
			return
		}
		f.SessionID = p.SessionID
	}
	for name, dst := range map[string]*time.Time{"since": &f.Since, "until": &f.Until} {
		if v := c.Query(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				abort(c, errf(http.StatusBadRequest, "%s: want an RFC 3339 time", name))
				return
			}
			*dst = t
		}
	}
	if v := c.Query("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxExportSessions {
			abort(c, errf(http.StatusBadRequest, "limit: want 1..%d sessions", maxExportSessions))
			return
		}
		f.Limit = n
	}
	eligibleOnly := c.Query("eligible") == "true"
	sessions, err := store.ListSessions(c.Request.Context(), s.deps.DB, f)
	if err != nil {
		abort(c, err)
		return
	}
	if f.SessionID != "" && len(sessions) == 0 {
		abort(c, errf(http.StatusNotFound, "session %q not found", f.SessionID))
		return
	}
	c.Header("Content-Type", "application/x-ndjson")
	c.Status(http.StatusOK)
	if _, err := s.exporter().write(c.Request.Context(), sessions, eligibleOnly, c.Writer, c.Writer.Flush); err != nil {
		_ = c.Error(err) // the status already went out: the client sees a truncated body
	}
}

// write encodes the sessions' steps as JSONL, flushing after each session.
func (s *exporter) write(ctx context.Context, sessions []store.SessionInfo, eligibleOnly bool, out io.Writer, flush func()) (int, error) {
	w := bufio.NewWriterSize(out, 64<<10)
	enc := json.NewEncoder(w)
	n := 0
	for i := range sessions {
		ss, err := s.buildSteps(ctx, &sessions[i])
		if err != nil {
			return n, err
		}
		for _, st := range ss.steps {
			if eligibleOnly && !st.Metadata.Eligibility.Trainable {
				continue
			}
			if err := enc.Encode(st); err != nil {
				return n, err
			}
			n++
		}
		if err := w.Flush(); err != nil {
			return n, err
		}
		if flush != nil {
			flush()
		}
	}
	return n, w.Flush()
}

// ExportOptions select what Export writes.
type ExportOptions struct {
	Filter       store.SessionFilter
	EligibleOnly bool
}

// Export writes a tenant's steps as ATDP JSONL to w, as GET
// /v1/trajectories does (`flywheel export`); it returns the step count.
func Export(ctx context.Context, db store.DBTX, cfg config.GatewayConfig, opts ExportOptions, w io.Writer) (int, error) {
	red, err := redact.New(redact.Options{Patterns: cfg.RedactPatterns})
	if err != nil {
		return 0, err
	}
	sessions, err := store.ListSessions(ctx, db, opts.Filter)
	if err != nil {
		return 0, err
	}
	e := &exporter{db: db, weights: cfg.RewardWeights, discount: cfg.Discount, redactor: red}
	return e.write(ctx, sessions, opts.EligibleOnly, w, nil)
}

type forgetRequest struct {
	SessionID string `json:"session_id"`
	EndUser   string `json:"end_user"`
}

// forget is POST /v1/forget {session_id | end_user}.
func (s *Server) forget(c *gin.Context) {
	p := principalOf(c)
	var r forgetRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	scope, subject := "session", r.SessionID
	switch {
	case r.SessionID != "" && r.EndUser != "":
		abort(c, errf(422, "give session_id or end_user, not both"))
		return
	case r.EndUser != "":
		scope, subject = "end_user", r.EndUser
	case r.SessionID == "":
		abort(c, errf(422, "session_id or end_user: required"))
		return
	}
	if p.SessionID != "" && (scope != "session" || subject != p.SessionID) {
		abort(c, errf(http.StatusNotFound, "session %q not found", subject))
		return
	}
	res, err := store.Forget(c.Request.Context(), s.deps.DB, p.TenantID, scope, subject)
	if errors.Is(err, store.ErrNotFound) {
		abort(c, errf(http.StatusNotFound, "nothing to forget for that %s", scope))
		return
	}
	if err != nil {
		abort(c, err)
		return
	}
	out := gin.H{"forget_request_id": res.ID, "scope": scope, "sessions": res.Sessions,
		"affected_versions": res.AffectedVersions, "deleted": res.Deleted}
	// The data is gone once this answers; retiring the versions it trained
	// is durable work for a workflow, which the gateway only starts.
	if s.deps.Forgets != nil {
		id, err := s.deps.Forgets.StartForget(c.Request.Context(), res.ID)
		if err != nil {
			s.deps.Logger.Warn(msgForgetStartFailed, "forget_request_id", res.ID, "err", err)
			out["retire_pending"] = fmt.Sprintf("run `flywheel forget retire %d`", res.ID)
		} else {
			out["retire_workflow_id"] = id
		}
	}
	c.JSON(http.StatusOK, out)
}

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
	"github.com/flywheel-ai/flywheel/atdp/atdpparquet"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// maxExportSessions bounds one export request; page with since/until.
const maxExportSessions = 10000

// sessionSteps is a session's interactions as ATDP steps, built by the
// same rules the session workflow trains by.
type sessionSteps struct {
	info  *store.SessionInfo
	steps []trajectory.Step
}

// exporter turns stored interactions into ATDP steps; the HTTP export, the
// session view and `flywheel export` share it.
type exporter struct {
	db    store.DBTX
	rules trajectory.Rules
}

func (s *Server) exporter() *exporter {
	return &exporter{db: s.deps.DB, rules: s.rules}
}

// buildSteps builds a session's steps live from Postgres. The verdicts the
// assembly and the training queue stored (stale, filtered, arrived after
// training) win where they say a step does not train.
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
	steps, _, err := trajectory.Build(*info, rows, rewards, s.rules, assembled)
	if err != nil {
		return nil, err
	}
	return &sessionSteps{info: info, steps: steps}, nil
}

// getSession is GET /v1/sessions/{id}: the session and, for every step,
// whether it will train and, if not, why.
func (s *Server) getSession(c *gin.Context) {
	info, err := s.sessionFor(c, c.Param("id"))
	if err != nil {
		abort(c, err)
		return
	}
	ss, err := s.exporter().buildSteps(c.Request.Context(), info)
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
		TrainedInto  []string           `json:"trained_into,omitempty"`
		CreatedAt    string             `json:"created_at"`
	}
	steps := make([]stepView, len(ss.steps))
	for i := range ss.steps {
		st := &ss.steps[i].ATDP
		steps[i] = stepView{StepID: st.Metadata.StepID, Index: i, CompletionID: st.Metadata.CompletionID, Model: st.Metadata.Model,
			ModelVersion: st.Metadata.ModelVersion, Status: ss.steps[i].Status, FinishReason: st.Result.FinishReason,
			Tokens: st.Metadata.Usage, Rewards: st.Reward.Values, Reward: st.Reward.Merged, Return: st.Reward.Return,
			Redactions: st.Metadata.Redactions, WillTrain: st.Metadata.Eligibility.Trainable, Reason: st.Metadata.Eligibility.Reason,
			TrainedInto: ss.steps[i].TrainedInto, CreatedAt: st.Metadata.CreatedAt}
	}
	c.JSON(http.StatusOK, gin.H{
		"id": info.ID, "status": info.Status, "model": info.Deployment, "task_id": info.TaskID,
		"group_id": info.GroupID, "group_size": info.GroupSize,
		"consent": gin.H{"opt_out": info.OptOut, "basis": info.ConsentBasis},
		"steps":   steps,
	})
}

// exportTrajectories is GET /v1/trajectories?session_id=&end_user=&since=&until=&limit=&format=:
// the tenant's steps as ATDP JSONL (or Parquet with format=parquet), one
// session after another, streamed.
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
	format := c.DefaultQuery("format", FormatJSONL)
	sink, err := newSink(format, c.Writer, c.Writer.Flush)
	if err != nil {
		abort(c, errf(http.StatusBadRequest, "%v", err))
		return
	}
	sessions, err := store.ListSessions(c.Request.Context(), s.deps.DB, f)
	if err != nil {
		abort(c, err)
		return
	}
	if f.SessionID != "" && len(sessions) == 0 {
		abort(c, errf(http.StatusNotFound, "session %q not found", f.SessionID))
		return
	}
	c.Header("Content-Type", contentType(format))
	c.Status(http.StatusOK)
	if _, err := s.exporter().write(c.Request.Context(), sessions, eligibleOnly, sink); err != nil {
		_ = c.Error(err) // the status already went out: the client sees a truncated body
	}
}

// Export formats.
const (
	FormatJSONL   = "jsonl"
	FormatParquet = "parquet"
)

// contentType is the media type of an export format.
func contentType(format string) string {
	if format == FormatParquet {
		return "application/vnd.apache.parquet"
	}
	return "application/x-ndjson"
}

// stepSink receives exported steps in one format.
type stepSink interface {
	step(*atdp.Step) error
	// sessionDone lets what was written so far go out.
	sessionDone() error
	close() error
}

type jsonlSink struct {
	w     *bufio.Writer
	enc   *json.Encoder
	flush func()
}

func (j *jsonlSink) step(st *atdp.Step) error { return j.enc.Encode(st) }
func (j *jsonlSink) sessionDone() error {
	if err := j.w.Flush(); err != nil {
		return err
	}
	if j.flush != nil {
		j.flush()
	}
	return nil
}
func (j *jsonlSink) close() error { return j.w.Flush() }

// parquetSink writes row groups of parquetRowGroup steps (the last one
// shorter); the file is whole once closed.
type parquetSink struct {
	w       *atdpparquet.Writer
	pending int
	flush   func()
}

const parquetRowGroup = 4096

func (p *parquetSink) step(st *atdp.Step) error {
	p.pending++
	return p.w.Write(st)
}
func (p *parquetSink) sessionDone() error {
	if p.pending < parquetRowGroup {
		return nil
	}
	p.pending = 0
	if err := p.w.Flush(); err != nil {
		return err
	}
	if p.flush != nil {
		p.flush()
	}
	return nil
}
func (p *parquetSink) close() error { return p.w.Close() }

func newSink(format string, out io.Writer, flush func()) (stepSink, error) {
	switch format {
	case "", FormatJSONL:
		w := bufio.NewWriterSize(out, 64<<10)
		return &jsonlSink{w: w, enc: json.NewEncoder(w), flush: flush}, nil
	case FormatParquet:
		return &parquetSink{w: atdpparquet.NewWriter(out), flush: flush}, nil
	}
	return nil, fmt.Errorf("format %q: want %s or %s", format, FormatJSONL, FormatParquet)
}

// write encodes the sessions' steps, letting each session's steps out
// once it is written.
func (s *exporter) write(ctx context.Context, sessions []store.SessionInfo, eligibleOnly bool, sink stepSink) (int, error) {
	n := 0
	for i := range sessions {
		ss, err := s.buildSteps(ctx, &sessions[i])
		if err != nil {
			return n, err
		}
		for i := range ss.steps {
			st := &ss.steps[i].ATDP
			if eligibleOnly && !st.Metadata.Eligibility.Trainable {
				continue
			}
			if err := sink.step(st); err != nil {
				return n, err
			}
			n++
		}
		if err := sink.sessionDone(); err != nil {
			return n, err
		}
	}
	return n, sink.close()
}

// ExportOptions select what Export writes.
type ExportOptions struct {
	Filter       store.SessionFilter
	EligibleOnly bool
	// Format is FormatJSONL (default) or FormatParquet.
	Format string
}

// Export writes a tenant's steps as ATDP JSONL or Parquet to w, as GET
// /v1/trajectories does (`flywheel export`); it returns the step count.
func Export(ctx context.Context, db store.DBTX, rules trajectory.Rules, opts ExportOptions, w io.Writer) (int, error) {
	sink, err := newSink(opts.Format, w, nil)
	if err != nil {
		return 0, err
	}
	sessions, err := store.ListSessions(ctx, db, opts.Filter)
	if err != nil {
		return 0, err
	}
	e := &exporter{db: db, rules: rules}
	return e.write(ctx, sessions, opts.EligibleOnly, sink)
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
	for _, sid := range res.Sessions {
		s.tails.forget(tailKey{p.TenantID, sid}) // nor kept in memory
	}
	out := gin.H{"forget_request_id": res.ID, "scope": scope, "sessions": res.Sessions,
		"affected_versions": res.AffectedVersions, "clean_artefacts": res.CleanArtefacts, "deleted": res.Deleted}
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

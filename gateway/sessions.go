package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

// maxGroupSize bounds a GRPO group created in one call.
const maxGroupSize = 64

var sourcePattern = regexp.MustCompile(`^[a-z0-9_.:\-]{1,64}$`)

// bindJSON decodes a small JSON body strictly (unknown fields are a 400:
// a misspelt "vlaue" must not silently drop a reward).
func bindJSON(c *gin.Context, v any) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errf(http.StatusBadRequest, "invalid JSON body: %v", err)
	}
	return nil
}

type createSessionRequest struct {
	Model     string          `json:"model"`
	EndUser   string          `json:"end_user"`
	TaskID    string          `json:"task_id"`
	GroupID   string          `json:"group_id"`
	GroupSize int             `json:"group_size"`
	OptOut    bool            `json:"opt_out"`
	Metadata  json.RawMessage `json:"metadata"`
}

type sessionKey struct {
	ID     string `json:"id"`
	APIKey string `json:"api_key"`
}

// createSession is POST /v1/sessions: a session (or a GRPO group of
// group_size sessions sharing group_id), each with its own API key.
func (s *Server) createSession(c *gin.Context) {
	p := principalOf(c)
	if p.SessionID != "" {
		abort(c, errf(http.StatusForbidden, "a per-session key cannot create sessions"))
		return
	}
	var r createSessionRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if r.GroupSize == 0 {
		r.GroupSize = 1
	}
	if r.GroupSize < 1 || r.GroupSize > maxGroupSize {
		abort(c, errf(422, "group_size: want 1..%d", maxGroupSize))
		return
	}
	if len(r.Metadata) > 0 {
		var obj map[string]any
		if json.Unmarshal(r.Metadata, &obj) != nil {
			abort(c, errf(422, "metadata: want a JSON object"))
			return
		}
	}
	if err := p.mayUse(r.Model); err != nil {
		abort(c, err)
		return
	}
	if r.GroupSize > 1 && r.GroupID == "" {
		r.GroupID = newID("grp_")
	}
	keys := make([]sessionKey, r.GroupSize)
	err := pgx.BeginFunc(c.Request.Context(), s.deps.DB, func(tx pgx.Tx) error {
		for i := range keys {
			id := newID("sess_")
			if err := store.CreateSession(c.Request.Context(), tx, store.NewSession{ID: id, TenantID: p.TenantID,
				Deployment: r.Model, EndUser: r.EndUser, TaskID: r.TaskID, GroupID: r.GroupID, GroupSize: r.GroupSize,
				IdentityMode: modeKey, OptOut: r.OptOut, Metadata: r.Metadata}); err != nil {
				return err
			}
			// The session key can do no more than the key that made it,
			// and is revoked with it.
			key, _, err := store.IssueKey(c.Request.Context(), tx, store.KeySpec{TenantID: p.TenantID, SessionID: id,
				Name: "session " + id, Models: p.Models, ExpiresAt: p.ExpiresAt, ParentID: p.KeyID})
			if err != nil {
				return err
			}
			keys[i] = sessionKey{ID: id, APIKey: key}
		}
		return nil
	})
	if err != nil {
		abort(c, err)
		return
	}
	for _, k := range keys {
		s.notifier.Start(flow.SessionInput{SessionID: k.ID, TenantID: p.TenantID, Deployment: r.Model,
			GroupID: r.GroupID, GroupSize: r.GroupSize, TaskID: r.TaskID})
	}
	out := gin.H{"id": keys[0].ID, "api_key": keys[0].APIKey, "group_size": r.GroupSize}
	if r.GroupSize > 1 {
		out["group_id"] = r.GroupID
		out["sessions"] = keys
	}
	c.JSON(http.StatusCreated, out)
}

// sessionFor checks that the caller may act on session id: its tenant
// owns it, and a per-session key only reaches its own session.
func (s *Server) sessionFor(c *gin.Context, id string) (*store.SessionInfo, error) {
	p := principalOf(c)
	if p.SessionID != "" && p.SessionID != id {
		return nil, errf(http.StatusNotFound, "session %q not found", id)
	}
	info, err := store.SessionForAssembly(c.Request.Context(), s.deps.DB, p.TenantID, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errf(http.StatusNotFound, "session %q not found", id)
	}
	if err != nil {
		return nil, err
	}
	return &info, nil
}

type rewardRequest struct {
	Value        *float64 `json:"value"`
	StepID       string   `json:"step_id"`
	CompletionID string   `json:"completion_id"`
	Source       string   `json:"source"`
	Final        bool     `json:"final"`
	Feedback     string   `json:"feedback"`
}

// postReward is POST /v1/sessions/{id}/reward.
func (s *Server) postReward(c *gin.Context) {
	id := c.Param("id")
	var r rewardRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if r.Value == nil {
		abort(c, errf(422, "value: required"))
		return
	}
	if err := s.validReward(*r.Value); err != nil {
		abort(c, err)
		return
	}
	src, err := rewardSource(r.Source)
	if err != nil {
		abort(c, err)
		return
	}
	if err := validFeedback(r.Feedback); err != nil {
		abort(c, err)
		return
	}
	info, err := s.sessionFor(c, id)
	if err != nil {
		abort(c, err)
		return
	}
	p := principalOf(c)
	var stepID int64
	switch {
	case r.StepID != "":
		stepID, err = strconv.ParseInt(r.StepID, 10, 64)
		if err != nil || stepID <= 0 {
			abort(c, errf(422, "step_id: want a step id from GET /v1/sessions/{id}"))
			return
		}
	case r.CompletionID != "":
		it, err := store.InteractionByCompletion(c.Request.Context(), s.deps.DB, p.TenantID, r.CompletionID)
		if err != nil || it.SessionID != id {
			abort(c, errf(http.StatusNotFound, "completion %q not found in session %q", r.CompletionID, id))
			return
		}
		stepID = it.ID
	}
	s.recordReward(c, info, store.NewReward{TenantID: p.TenantID, SessionID: id, InteractionID: stepID, Value: *r.Value, Source: src, Final: r.Final, Feedback: r.Feedback})
}

// validFeedback checks a reward's feedback text: valid UTF-8 of at most
// store.MaxFeedback bytes.
func validFeedback(f string) error {
	if len(f) > store.MaxFeedback || !utf8.ValidString(f) {
		return errf(422, "feedback: want UTF-8 text of at most %d bytes", store.MaxFeedback)
	}
	return nil
}

func rewardSource(src string) (string, error) {
	if src == "" {
		return "user", nil
	}
	if !sourcePattern.MatchString(src) {
		return "", errf(422, "source: use 1-64 lowercase letters, digits, '_', '.', ':' or '-'")
	}
	return src, nil
}

func (s *Server) recordReward(c *gin.Context, info *store.SessionInfo, r store.NewReward) {
	rid, err := store.InsertReward(c.Request.Context(), s.deps.DB, r)
	if errors.Is(err, store.ErrNotFound) {
		abort(c, errf(http.StatusNotFound, "step not found in session %q", r.SessionID))
		return
	}
	if err != nil {
		abort(c, err)
		return
	}
	s.notifier.Notify(sessionInput(info), flow.SessionEvent{Kind: flow.EventReward, RewardID: rid, Final: r.Final, At: time.Now()})
	c.JSON(http.StatusCreated, gin.H{"reward_id": rid, "session_id": r.SessionID})
}

func sessionInput(info *store.SessionInfo) flow.SessionInput {
	return flow.SessionInput{SessionID: info.ID, TenantID: info.TenantID, Deployment: info.Deployment,
		GroupID: info.GroupID, GroupSize: info.GroupSize, TaskID: info.TaskID}
}

type feedbackRequest struct {
	CompletionID string   `json:"completion_id"`
	Value        *float64 `json:"value"`
	Source       string   `json:"source"`
	Feedback     string   `json:"feedback"`
}

// postFeedback is POST /v1/feedback: a reward for a completion, any time
// later.
func (s *Server) postFeedback(c *gin.Context) {
	var r feedbackRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if r.CompletionID == "" {
		abort(c, errf(422, "completion_id: required"))
		return
	}
	if r.Value == nil {
		abort(c, errf(422, "value: required"))
		return
	}
	if err := s.validReward(*r.Value); err != nil {
		abort(c, err)
		return
	}
	src, err := rewardSource(r.Source)
	if err != nil {
		abort(c, err)
		return
	}
	if err := validFeedback(r.Feedback); err != nil {
		abort(c, err)
		return
	}
	p := principalOf(c)
	it, err := store.InteractionByCompletion(c.Request.Context(), s.deps.DB, p.TenantID, r.CompletionID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && p.SessionID != "" && it.SessionID != p.SessionID) {
		abort(c, errf(http.StatusNotFound, "completion %q not found", r.CompletionID))
		return
	}
	if err != nil {
		abort(c, err)
		return
	}
	info, err := s.sessionFor(c, it.SessionID)
	if err != nil {
		abort(c, err)
		return
	}
	s.recordReward(c, info, store.NewReward{TenantID: p.TenantID, SessionID: it.SessionID, InteractionID: it.ID, Value: *r.Value, Source: src, Feedback: r.Feedback})
}

// endSession is POST /v1/sessions/{id}/end.
func (s *Server) endSession(c *gin.Context) {
	id := c.Param("id")
	info, err := s.sessionFor(c, id)
	if err != nil {
		abort(c, err)
		return
	}
	ended, err := store.EndSession(c.Request.Context(), s.deps.DB, info.TenantID, id)
	if err != nil {
		abort(c, err)
		return
	}
	if ended {
		s.notifier.Notify(sessionInput(info), flow.SessionEvent{Kind: flow.EventEnd, At: time.Now()})
	}
	c.JSON(http.StatusOK, gin.H{"session_id": id, "status": "ended"})
}

type consentRequest struct {
	OptOut *bool `json:"opt_out"`
}

// sessionConsent is POST /v1/sessions/{id}/consent {opt_out}.
func (s *Server) sessionConsent(c *gin.Context) {
	id := c.Param("id")
	var r consentRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if r.OptOut == nil {
		abort(c, errf(422, "opt_out: required"))
		return
	}
	info, err := s.sessionFor(c, id)
	if err != nil {
		abort(c, err)
		return
	}
	if err := store.SetSessionOptOut(c.Request.Context(), s.deps.DB, info.TenantID, id, *r.OptOut); err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"session_id": id, "opt_out": *r.OptOut})
}

// endUserConsent is PUT /v1/end_users/{end_user}/consent {opt_out}.
func (s *Server) endUserConsent(c *gin.Context) {
	p := principalOf(c)
	if p.SessionID != "" {
		abort(c, errf(http.StatusForbidden, "a per-session key cannot set end-user consent"))
		return
	}
	var r consentRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if r.OptOut == nil {
		abort(c, errf(422, "opt_out: required"))
		return
	}
	user := c.Param("end_user")
	if err := store.SetEndUserConsent(c.Request.Context(), s.deps.DB, p.TenantID, user, *r.OptOut); err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"end_user": user, "opt_out": *r.OptOut})
}

// validReward checks a reward value against the configured range.
func (s *Server) validReward(v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return errf(422, "value: must be a finite number")
	}
	if v < s.cfg.RewardMin || v > s.cfg.RewardMax {
		return errf(422, "value: must be within [%g, %g], got %g", s.cfg.RewardMin, s.cfg.RewardMax, v)
	}
	return nil
}

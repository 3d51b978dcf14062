package gateway

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
)

// generateGroup serves a call that asks for n samples of one prompt: the
// natural GRPO group. Each sample is its own generation (the backend may
// be the in-process policy or any upstream; an engine with prefix caching
// prefills the shared prompt once) and its own session, so it is rewarded,
// assembled and trained on its own, and the n sessions form one group: the
// trainer normalises each sample's reward against the others'. Choice i of
// completion X is recorded as completion X.i in session X.i, which the
// reward and feedback APIs name; a later turn that continues choice i
// joins X.i by stitching. A call that names its session (a session key,
// X-Session-Id or a /s/{id}/ path) is refused: one session cannot hold n
// alternative turns. All samples are captured before the answer; if any
// failed, the call fails.
func (s *Server) generateGroup(c *gin.Context, cl *call, n int) ([]*inference.Response, error) {
	if cl.mode != modeStitched {
		return nil, errf(http.StatusBadRequest, "n: each of n choices is recorded as its own session of one GRPO group, so the call cannot name a session; drop the session id, or use POST /v1/sessions with group_size for named groups")
	}
	s.checkReuse(cl)
	calls := make([]*call, n)
	err := pgx.BeginFunc(c.Request.Context(), s.deps.DB, func(tx pgx.Tx) error {
		for i := range calls {
			fork, req := *cl, *cl.req
			fork.req = &req
			fork.sessionID = cl.completionID + "." + strconv.Itoa(i)
			fork.completionID = fork.sessionID
			fork.group, fork.groupSize = cl.completionID, n
			if i > 0 {
				fork.span = nil // the call's span ends with its first choice
			}
			calls[i] = &fork
			if err := store.CreateSession(c.Request.Context(), tx, store.NewSession{ID: fork.sessionID, TenantID: cl.p.TenantID,
				Deployment: cl.target.deployment, EndUser: cl.endUser, GroupID: fork.group, GroupSize: n, IdentityMode: modeStitched}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Message: "the group's sessions could not be recorded; retry", RetryAfter: time.Second}
	}
	resps := make([]*inference.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, fork := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps[i], errs[i] = s.generate(c, fork)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	c.Header("X-Session-Id", calls[0].sessionID)
	return resps, nil
}

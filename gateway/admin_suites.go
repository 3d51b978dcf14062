package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/store"
)

// The admin API of evaluation suites: a deployment's held-out prompts
// (suite "regression") and refusal prompts (suite "safety"), which its
// release gates and watchdog answer greedily. `flywheel suite` does the
// same from the command line.

// suiteRequest is PUT /admin/v1/deployments/{name}/suites/{suite}.
type suiteRequest struct {
	Prompts []store.SuiteItem `json:"prompts"`
}

// deploymentParam is the {name} of an admin deployment path.
func deploymentParam(c *gin.Context) (string, *apiError) {
	name := c.Param("name")
	if err := deployment.ValidName(name); err != nil {
		return "", errf(http.StatusBadRequest, "%v", err)
	}
	return name, nil
}

func adminSuiteParams(c *gin.Context, withSuite bool) (dep, suite string, err *apiError) {
	if dep, err = deploymentParam(c); err != nil {
		return "", "", err
	}
	if !withSuite {
		return dep, "", nil
	}
	suite = c.Param("suite")
	if err := store.CheckSuite(suite); err != nil {
		return "", "", errf(http.StatusNotFound, "%v", err)
	}
	return dep, suite, nil
}

// adminPutSuite replaces a deployment's suite (the same prompts again
// change nothing, so their results and the anchor stay).
func (s *Server) adminPutSuite(c *gin.Context) {
	dep, suite, perr := adminSuiteParams(c, true)
	if perr != nil {
		abort(c, perr)
		return
	}
	var r suiteRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	prompts, err := store.SuitePrompts(suite, r.Prompts)
	if err != nil {
		abort(c, errf(http.StatusUnprocessableEntity, "%v", err))
		return
	}
	changed, err := store.SetEvalSuite(c.Request.Context(), s.deps.DB, dep, suite, prompts)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"deployment": dep, "suite": suite, "prompts": len(prompts), "changed": changed})
}

// adminListSuites summarises a deployment's suites.
func (s *Server) adminListSuites(c *gin.Context) {
	dep, _, perr := adminSuiteParams(c, false)
	if perr != nil {
		abort(c, perr)
		return
	}
	list, err := store.ListEvalSuites(c.Request.Context(), s.deps.DB, dep)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"deployment": dep, "suites": list})
}

// suitePromptView is one prompt as GET returns it.
type suitePromptView struct {
	ID        int64           `json:"id"`
	Shared    bool            `json:"shared"`
	Messages  json.RawMessage `json:"messages"`
	Tools     json.RawMessage `json:"tools,omitempty"`
	Expect    any             `json:"expect"` // text, or the tool_call object
	Match     string          `json:"match"`
	MaxTokens int             `json:"max_tokens,omitempty"`
	// Temperature is what the prompt is sampled at (absent: greedy).
	Temperature float64 `json:"temperature,omitempty"`
}

// adminGetSuite lists a suite's prompts (the deployment's and the shared).
func (s *Server) adminGetSuite(c *gin.Context) {
	dep, suite, perr := adminSuiteParams(c, true)
	if perr != nil {
		abort(c, perr)
		return
	}
	rows, err := store.EvalSuite(c.Request.Context(), s.deps.DB, dep, suite)
	if err != nil {
		abort(c, err)
		return
	}
	out := make([]suitePromptView, len(rows))
	for i, p := range rows {
		out[i] = suitePromptView{ID: p.ID, Shared: p.Deployment == "", Messages: p.Messages, Tools: p.Tools, Expect: p.ExpectValue(), Match: p.Rule(suite), MaxTokens: p.MaxTokens, Temperature: p.Temperature}
	}
	c.JSON(http.StatusOK, gin.H{"deployment": dep, "suite": suite, "prompts": out})
}

// adminDeleteSuite removes a deployment's own prompts of a suite.
func (s *Server) adminDeleteSuite(c *gin.Context) {
	dep, suite, perr := adminSuiteParams(c, true)
	if perr != nil {
		abort(c, perr)
		return
	}
	n, err := store.DeleteEvalSuite(c.Request.Context(), s.deps.DB, dep, suite)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"deployment": dep, "suite": suite, "deleted": n})
}

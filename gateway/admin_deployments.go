package gateway

import (
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/store"
)

// The admin API of deployments: register an upstream model server
// (vLLM, SGLang or any OpenAI-compatible one) under a model name, change
// where it points, list and show them. The gateway routes a registered
// name within a second, with the same artefact injection, canary and
// capture as every other deployment. `flywheel deployments` does the same
// from the command line.

type deploymentRequest struct {
	Name     string               `json:"name"`
	Upstream *deployment.Settings `json:"upstream"`
}

// adminCreateDeployment is POST /admin/v1/deployments {name, upstream}.
func (s *Server) adminCreateDeployment(c *gin.Context) {
	var r deploymentRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if err := deployment.ValidName(r.Name); err != nil {
		abort(c, errf(422, "%v", err))
		return
	}
	if r.Upstream == nil {
		abort(c, errf(422, "upstream: required ({\"base_url\": \"http://vllm:8000/v1\", \"model\": …})"))
		return
	}
	if err := r.Upstream.Validate(); err != nil {
		abort(c, errf(422, "upstream: %v", err))
		return
	}
	if _, static := s.router.static[r.Name]; static {
		abort(c, errf(http.StatusConflict, "model %q is configured on this gateway (gateway.policy_model or gateway.upstream_models); pick another name", r.Name))
		return
	}
	d, err := store.CreateUpstreamDeployment(c.Request.Context(), s.deps.DB, r.Name, *r.Upstream)
	if errors.Is(err, store.ErrExists) {
		abort(c, errf(http.StatusConflict, "deployment %q exists; PUT /admin/v1/deployments/%s changes it", r.Name, r.Name))
		return
	}
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusCreated, d)
}

// adminUpdateDeployment is PUT /admin/v1/deployments/{name} {upstream}:
// the deployment keeps its versions, releases, artefacts and suites.
func (s *Server) adminUpdateDeployment(c *gin.Context) {
	name, perr := deploymentParam(c)
	if perr != nil {
		abort(c, perr)
		return
	}
	var r deploymentRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	if r.Name != "" && r.Name != name {
		abort(c, errf(422, "name: a deployment cannot be renamed (%q in the body, %q in the path)", r.Name, name))
		return
	}
	if r.Upstream == nil {
		abort(c, errf(422, "upstream: required"))
		return
	}
	if err := r.Upstream.Validate(); err != nil {
		abort(c, errf(422, "upstream: %v", err))
		return
	}
	d, err := store.UpdateUpstreamDeployment(c.Request.Context(), s.deps.DB, name, *r.Upstream)
	switch {
	case errors.Is(err, store.ErrNotFound):
		abort(c, errf(http.StatusNotFound, "no deployment %q", name))
		return
	case errors.Is(err, deployment.ErrNotUpstream):
		abort(c, errf(http.StatusConflict, "deployment %q is served by the in-process policy; it has no upstream to change", name))
		return
	case err != nil:
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, d)
}

// adminGetDeployment is GET /admin/v1/deployments/{name}.
func (s *Server) adminGetDeployment(c *gin.Context) {
	name, perr := deploymentParam(c)
	if perr != nil {
		abort(c, perr)
		return
	}
	d, err := store.GetDeployment(c.Request.Context(), s.deps.DB, name)
	if errors.Is(err, store.ErrNotFound) {
		abort(c, errf(http.StatusNotFound, "no deployment %q", name))
		return
	}
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, d)
}

// adminListDeployments is GET /admin/v1/deployments.
func (s *Server) adminListDeployments(c *gin.Context) {
	ds, err := store.ListDeployments(c.Request.Context(), s.deps.DB)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"object": "list", "data": ds})
}

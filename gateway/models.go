package gateway

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
)

// codeModelNotFound is OpenAI's error code for a model that does not
// exist or that the key may not use; its type is invalid_request_error.
const codeModelNotFound = "model_not_found"

// model is one model in OpenAI's shape.
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// visibleModels are the models the caller may use, by name: a client
// key's models, or every model for the admin key.
func (s *Server) visibleModels(c *gin.Context) []model {
	var p *principal
	if v, ok := c.Get(ctxPrincipal); ok {
		p = v.(*principal)
	}
	out := []model{}
	for _, m := range s.router.models(c.Request.Context()) {
		if p == nil || p.Allows(m.Name) {
			out = append(out, model{ID: m.Name, Object: "model", Created: m.Created.Unix(), OwnedBy: "flywheel"})
		}
	}
	return out
}

// listModels is GET /v1/models.
func (s *Server) listModels(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"object": "list", "data": s.visibleModels(c)})
}

// getModel is GET /v1/models/{model}. A model the key may not use is as
// missing as one that does not exist, as OpenAI answers: the key learns
// nothing about the models of others.
func (s *Server) getModel(c *gin.Context) {
	name := c.Param("model")
	for _, m := range s.visibleModels(c) {
		if m.ID == name {
			c.JSON(http.StatusOK, m)
			return
		}
	}
	abort(c, &apiError{Status: http.StatusNotFound, Code: codeModelNotFound, Type: "invalid_request_error",
		Message: fmt.Sprintf("the model %q does not exist or this API key may not use it", name)})
}

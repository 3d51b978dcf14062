package fakeskyrl

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Checkpoint types (types.CheckpointType) and statuses (CheckpointStatus).
const (
	checkpointTraining = "training"
	checkpointSampler  = "sampler"

	checkpointPending   = "pending"
	checkpointCompleted = "completed"
	checkpointFailed    = "failed"
)

type checkpointKey struct {
	modelID, id, typ string
}

// checkpoint is a CheckpointDB row with what SkyRL would write to disk:
// the weights of a training checkpoint, the archive of a sampler one.
type checkpoint struct {
	checkpointKey
	status      string
	errMsg      string
	completedAt time.Time
	weights     weights
	archive     []byte
}

// createCheckpointLocked is create_checkpoint: a pending row, or 409 when
// the model already has one of that name and type. s.mu must be held.
func (s *Server) createCheckpointLocked(modelID, id, typ string) (*checkpoint, int, string) {
	key := checkpointKey{modelID: modelID, id: id, typ: typ}
	if _, ok := s.checkpoints[key]; ok {
		return nil, http.StatusConflict, fmt.Sprintf("Checkpoint '%s' already exists for model '%s'", id, modelID)
	}
	ck := &checkpoint{checkpointKey: key, status: checkpointPending}
	s.checkpoints[key] = ck
	s.checkpointOrder = append(s.checkpointOrder, key)
	return ck, 0, ""
}

func (s *Server) finishCheckpoint(ck *checkpoint, w weights, archive []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ck.status, ck.completedAt, ck.weights, ck.archive = checkpointCompleted, time.Now().UTC(), w, archive
}

func (s *Server) failCheckpoint(ck *checkpoint, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ck.status, ck.errMsg = checkpointFailed, err.Error()
}

// validateCheckpointLocked is validate_checkpoint: 404 unknown, 425
// pending, 500 failed. s.mu must be held.
func (s *Server) validateCheckpointLocked(key checkpointKey) (*checkpoint, int, string) {
	ck, ok := s.checkpoints[key]
	switch {
	case !ok:
		return nil, http.StatusNotFound, fmt.Sprintf("Checkpoint not found: %s/%s", key.modelID, key.id)
	case ck.status == checkpointPending:
		return nil, http.StatusTooEarly, "Checkpoint is still being created"
	case ck.status == checkpointFailed:
		return nil, http.StatusInternalServerError, "Checkpoint creation failed: " + ck.errMsg
	}
	return ck, 0, ""
}

// pathIDs checks the {model_id} and {checkpoint_id} path parameters
// against SkyRL's id pattern, answering 422 when one does not match.
func pathIDs(w http.ResponseWriter, r *http.Request, names ...string) bool {
	c := &checker{prefix: []any{"path"}}
	for _, name := range names {
		c.idField(r.PathValue(name), pathParamName(name))
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return false
	}
	return true
}

// pathParamName is SkyRL's name for a path parameter (it calls the model
// id unique_id).
func pathParamName(name string) string {
	if name == "model_id" {
		return "unique_id"
	}
	return name
}

// listCheckpoints answers a model's completed checkpoints; an unknown
// model has none.
func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	if !pathIDs(w, r, "model_id") {
		return
	}
	modelID := r.PathValue("model_id")
	s.mu.Lock()
	out := listCheckpointsResponse{Checkpoints: []checkpointEntry{}}
	for _, key := range s.checkpointOrder {
		ck := s.checkpoints[key]
		if key.modelID != modelID || ck.status != checkpointCompleted {
			continue
		}
		kind := "weights"
		if key.typ == checkpointSampler {
			kind = "sampler_weights"
		}
		out.Checkpoints = append(out.Checkpoints, checkpointEntry{
			CheckpointID:   key.id,
			CheckpointType: key.typ,
			Time:           ck.completedAt.Format(time.RFC3339Nano),
			TinkerPath:     fmt.Sprintf("tinker://%s/%s/%s", modelID, kind, key.id),
		})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// deleteCheckpoint is delete_checkpoint: the path names the kind
// ("weights/<name>" or "sampler_weights/<name>"; a bare id, or one of
// another kind, is 400 unless the checkpoint_type query names it), then
// 404 unknown, 425 pending, else the row and its artefact go: 204.
func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	if !pathIDs(w, r, "model_id") {
		return
	}
	path := r.PathValue("checkpoint_path")
	typ := r.URL.Query().Get("checkpoint_type")
	id := path
	if kind, name, ok := strings.Cut(path, "/"); ok && !strings.Contains(name, "/") {
		switch kind {
		case "weights":
			typ, id = checkpointTraining, name
		case "sampler_weights":
			typ, id = checkpointSampler, name
		}
	}
	if (typ != checkpointTraining && typ != checkpointSampler) || id == "" || strings.Contains(id, "/") {
		writeDetail(w, http.StatusBadRequest, "Invalid checkpoint identifier. Expected format 'weights/<name>' (training weights) "+
			"or 'sampler_weights/<name>' (sampler weights), where <name> is a single path segment.")
		return
	}
	key := checkpointKey{modelID: r.PathValue("model_id"), id: id, typ: typ}
	s.mu.Lock()
	defer s.mu.Unlock()
	ck, ok := s.checkpoints[key]
	switch {
	case !ok:
		writeDetail(w, http.StatusNotFound, fmt.Sprintf("Checkpoint not found: %s/%s", key.modelID, key.id))
		return
	case ck.status == checkpointPending:
		writeDetail(w, http.StatusTooEarly, "Checkpoint is still being created")
		return
	}
	delete(s.checkpoints, key)
	for i, k := range s.checkpointOrder {
		if k == key {
			s.checkpointOrder = append(s.checkpointOrder[:i], s.checkpointOrder[i+1:]...)
			break
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkpointArchive redirects to the sampler archive's download, as the
// SDK expects.
func (s *Server) checkpointArchive(w http.ResponseWriter, r *http.Request) {
	if !pathIDs(w, r, "model_id", "checkpoint_id") {
		return
	}
	modelID, id := r.PathValue("model_id"), r.PathValue("checkpoint_id")
	s.mu.Lock()
	_, status, detail := s.validateCheckpointLocked(checkpointKey{modelID: modelID, id: id, typ: checkpointSampler})
	s.mu.Unlock()
	if status != 0 {
		writeDetail(w, status, detail)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	w.Header().Set("Location", fmt.Sprintf("%s://%s/api/v1/training_runs/%s/checkpoints/%s/download", scheme, r.Host, modelID, id))
	w.Header().Set("Expires", time.Now().UTC().Add(120*time.Minute).Format(http.TimeFormat))
	w.WriteHeader(http.StatusFound)
}

// checkpointDownload answers the sampler archive's bytes.
func (s *Server) checkpointDownload(w http.ResponseWriter, r *http.Request) {
	if !pathIDs(w, r, "model_id", "checkpoint_id") {
		return
	}
	modelID, id := r.PathValue("model_id"), r.PathValue("checkpoint_id")
	s.mu.Lock()
	ck, status, detail := s.validateCheckpointLocked(checkpointKey{modelID: modelID, id: id, typ: checkpointSampler})
	var archive []byte
	if ck != nil {
		archive = ck.archive
	}
	s.mu.Unlock()
	if status != 0 {
		writeDetail(w, status, detail)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s_%s.tar.gz"`, modelID, id))
	w.Header().Set("Content-Length", strconv.Itoa(len(archive)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(archive)
}

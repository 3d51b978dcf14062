package tinkerserver

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// File names under Config.Dir/<model_id>.
const (
	weightsDir   = tinker.KindWeights        // training states
	samplerDir   = tinker.KindSamplerWeights // sampler archives
	stateExt     = ".safetensors"
	archiveExt   = ".tar.gz"
	tempPrefix   = "." // files being written; never listed
	loadPathHelp = "request.path must be in format tinker://source_model_id/weights/checkpoint_id"
)

type ckKey struct{ model, kind, name string }

// checkpointStore is the checkpoint directory: a finished checkpoint is a
// file (written aside and renamed), a pending one a reservation in memory.
type checkpointStore struct {
	dir     string
	mu      sync.Mutex
	pending map[ckKey]bool
}

func newCheckpointStore(dir string) *checkpointStore {
	return &checkpointStore{dir: dir, pending: map[ckKey]bool{}}
}

func (st *checkpointStore) path(k ckKey) string {
	if k.kind == tinker.CheckpointTraining {
		return filepath.Join(st.dir, k.model, weightsDir, k.name+stateExt)
	}
	return filepath.Join(st.dir, k.model, samplerDir, k.name+archiveExt)
}

// hasModel reports whether a model of that id ever saved a checkpoint.
func (st *checkpointStore) hasModel(id string) bool {
	_, err := os.Stat(filepath.Join(st.dir, id))
	return err == nil
}

// reserve claims a checkpoint name (SkyRL's 409 when it is taken).
func (st *checkpointStore) reserve(k ckKey) (int, string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, err := os.Stat(st.path(k))
	if st.pending[k] || err == nil {
		return http.StatusConflict, fmt.Sprintf("Checkpoint '%s' already exists for model '%s'", k.name, k.model)
	}
	st.pending[k] = true
	return 0, ""
}

func (st *checkpointStore) release(k ckKey) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.pending, k)
}

// ready reports whether a checkpoint can be read: 404 when there is none,
// 425 while it is being written (SkyRL's statuses).
func (st *checkpointStore) ready(k ckKey) (int, string) {
	st.mu.Lock()
	pending := st.pending[k]
	st.mu.Unlock()
	if pending {
		return http.StatusTooEarly, "Checkpoint is still being created"
	}
	if _, err := os.Stat(st.path(k)); err != nil {
		return http.StatusNotFound, fmt.Sprintf("Checkpoint not found: %s/%s", k.model, k.name)
	}
	return 0, ""
}

// listedCheckpoint is one entry of the checkpoint list, as SkyRL's.
type listedCheckpoint struct {
	tinker.Checkpoint
	Time time.Time `json:"time"`
}

// list returns a model's finished checkpoints, oldest first.
func (st *checkpointStore) list(model string) ([]listedCheckpoint, error) {
	out := []listedCheckpoint{}
	for _, kind := range []string{tinker.CheckpointTraining, tinker.CheckpointSampler} {
		sub, ext, pathKind := weightsDir, stateExt, tinker.KindWeights
		if kind == tinker.CheckpointSampler {
			sub, ext, pathKind = samplerDir, archiveExt, tinker.KindSamplerWeights
		}
		entries, err := os.ReadDir(filepath.Join(st.dir, model, sub))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			name, ok := strings.CutSuffix(e.Name(), ext)
			if !ok || strings.HasPrefix(name, tempPrefix) || !e.Type().IsRegular() {
				continue
			}
			info, err := e.Info()
			if err != nil {
				return nil, err
			}
			out = append(out, listedCheckpoint{Checkpoint: tinker.Checkpoint{CheckpointID: name, CheckpointType: kind,
				TinkerPath: tinker.Path{Model: model, Kind: pathKind, Name: name}.String()}, Time: info.ModTime().UTC()})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

func (s *Server) saveWeights(c *gin.Context) {
	var req tinker.SaveWeightsRequest
	if !decode(c, &req, func(ch *checker) {
		ch.required(req.ModelID, "model_id")
		ch.id(req.Path, "path")
	}) {
		return
	}
	k := ckKey{req.ModelID, tinker.CheckpointTraining, req.Path}
	f := s.submit(c, req.ModelID, req.SeqID, reqSaveWeights, req.Path,
		func(*model) (int, string) { return s.store.reserve(k) }, func() { s.store.release(k) },
		func(_ context.Context, m *model) (any, error) {
			path := s.store.path(k)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, fmt.Errorf("save weights: %w", err)
			}
			l, err := s.trainee(m)
			if err != nil {
				return nil, err
			}
			if err := l.SaveState(path); err != nil {
				return nil, err
			}
			return tinker.SaveWeightsResponse{Path: tinker.Path{Model: k.model, Kind: tinker.KindWeights, Name: k.name}.String(), Type: reqSaveWeights}, nil
		})
	if f != nil {
		answerFuture(c, f)
	}
}

func (s *Server) saveWeightsForSampler(c *gin.Context) {
	var req tinker.SaveWeightsForSamplerRequest
	if !decode(c, &req, func(ch *checker) {
		ch.required(req.ModelID, "model_id")
		ch.id(req.Path, "path")
	}) {
		return
	}
	k := ckKey{req.ModelID, tinker.CheckpointSampler, req.Path}
	f := s.submit(c, req.ModelID, req.SeqID, reqSaveForSampler, req.Path,
		func(*model) (int, string) { return s.store.reserve(k) }, func() { s.store.release(k) },
		func(_ context.Context, m *model) (any, error) {
			if err := s.writeSamplerArchive(m, s.store.path(k)); err != nil {
				return nil, err
			}
			// SkyRL's form: tinker://<model>/<name>.
			return tinker.SaveWeightsForSamplerResponse{Path: tinker.Path{Model: k.model, Name: k.name}.String(), Type: reqSaveForSampler}, nil
		})
	if f != nil {
		answerFuture(c, f)
	}
}

// writeSamplerArchive writes m's PEFT directory (or full weights) as a
// tar.gz at path, atomically.
func (s *Server) writeSamplerArchive(m *model, path string) error {
	l, err := s.trainee(m)
	if err != nil {
		return err
	}
	files, err := l.PEFTFiles(m.base)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save sampler weights: %w", err)
	}
	tmp, err := os.CreateTemp(dir, tempPrefix+"archive-*")
	if err != nil {
		return fmt.Errorf("save sampler weights: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	// Not synced: the archive is a copy to be downloaded, and the client
	// syncs what it unpacks. One torn by a crash fails the download's
	// checks (gzip's length and CRC), and the step trains again.
	err = writeTar(tmp, files)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("save sampler weights: %w", err)
	}
	return nil
}

// writeTar writes files as a tar.gz, stored uncompressed as SkyRL tx
// writes its archives: float weights hardly compress (7 % at gzip's
// default level, for most of a train step's time on the embedded policy),
// and the archive crosses loopback or a LAN.
func writeTar(w io.Writer, files []trainer.File) error {
	zw, err := gzip.NewWriterLevel(w, gzip.NoCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	now := time.Now()
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: 0o644, Size: int64(len(f.Data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func (s *Server) loadWeights(c *gin.Context) {
	var req struct {
		ModelID   string `json:"model_id"`
		Path      string `json:"path"`
		Optimizer *bool  `json:"optimizer"` // SkyRL's default: true
		SeqID     *int64 `json:"seq_id"`
	}
	if !decode(c, &req, func(ch *checker) {
		ch.required(req.ModelID, "model_id")
		ch.required(req.Path, "path")
	}) {
		return
	}
	optimizer := req.Optimizer == nil || *req.Optimizer
	var k ckKey
	admit := func(m *model) (int, string) {
		if m.requests > 0 {
			seq := int64(m.requests + 1)
			if req.SeqID != nil {
				seq = *req.SeqID
			}
			return http.StatusBadRequest, fmt.Sprintf("LoadWeights is not permitted with seq_id %d", seq)
		}
		p, err := tinker.ParsePath(req.Path)
		if err != nil || p.Kind != tinker.KindWeights || !idPattern.MatchString(p.Model) || !idPattern.MatchString(p.Name) {
			return http.StatusBadRequest, loadPathHelp
		}
		k = ckKey{p.Model, tinker.CheckpointTraining, p.Name}
		return s.store.ready(k)
	}
	data := struct {
		Path      string `json:"path"`
		Optimizer bool   `json:"optimizer"`
	}{req.Path, optimizer}
	f := s.submit(c, req.ModelID, req.SeqID, reqLoadWeights, data, admit, nil, func(_ context.Context, m *model) (any, error) {
		l, err := trainer.LoadLearner(s.store.path(k), s.cfg.BaseModels[m.base], optimizer)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errClient, err)
		}
		if got := l.LoRA(); got.Rank != m.lora.Rank || got.Attn != m.lora.Attn || got.MLP != m.lora.MLP || got.Unembed != m.lora.Unembed {
			return nil, fmt.Errorf("%w: the state %s has lora rank %d (attn %v, mlp %v, unembed %v); this model was created with rank %d (attn %v, mlp %v, unembed %v)",
				errClient, req.Path, got.Rank, got.Attn, got.MLP, got.Unembed, m.lora.Rank, m.lora.Attn, m.lora.MLP, m.lora.Unembed)
		}
		m.learner = l
		return tinker.LoadWeightsResponse{Type: reqLoadWeights}, nil
	})
	if f != nil {
		answerFuture(c, f)
	}
}

// pathIDs checks the :model (and :checkpoint) path parameters; it answers
// 422 itself and reports false.
func pathIDs(c *gin.Context, names ...string) bool {
	ch := &checker{}
	for _, n := range names {
		if v := c.Param(n); len(v) > idMaxLength || !idPattern.MatchString(v) {
			ch.errs = append(ch.errs, fieldError{Type: "string_pattern_mismatch", Loc: []any{"path", n},
				Msg: fmt.Sprintf("String should match pattern '%s'", idPattern)})
		}
	}
	if len(ch.errs) > 0 {
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, gin.H{"detail": ch.errs})
		return false
	}
	return true
}

// deleteCheckpoint is Tinker's DELETE /training_runs/{run}/checkpoints/
// {kind}/{name}: the checkpoint's file goes (a download already reading
// it finishes); one being written is 425, one not there 404. The route's
// third segment is the kind (gin names it as the archive route's).
func (s *Server) deleteCheckpoint(c *gin.Context) {
	if !pathIDs(c, "model", "name") {
		return
	}
	var kind string
	switch c.Param("checkpoint") {
	case weightsDir:
		kind = tinker.CheckpointTraining
	case samplerDir:
		kind = tinker.CheckpointSampler
	default:
		badCheckpointID(c)
		return
	}
	k := ckKey{c.Param("model"), kind, c.Param("name")}
	if status, detail := s.store.ready(k); status != 0 {
		abort(c, status, detail)
		return
	}
	if err := os.Remove(s.store.path(k)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			abort(c, http.StatusNotFound, fmt.Sprintf("Checkpoint not found: %s/%s", k.model, k.name))
			return
		}
		abort(c, http.StatusInternalServerError, "delete checkpoint: "+err.Error())
		return
	}
	c.Status(http.StatusNoContent)
}

// badCheckpointID answers a delete that names no kind, as SkyRL does.
func badCheckpointID(c *gin.Context) {
	abort(c, http.StatusBadRequest, "Invalid checkpoint identifier. Expected format 'weights/<name>' (training weights) "+
		"or 'sampler_weights/<name>' (sampler weights), where <name> is a single path segment.")
}

func (s *Server) listCheckpoints(c *gin.Context) {
	if !pathIDs(c, "model") {
		return
	}
	cks, err := s.store.list(c.Param("model"))
	if err != nil {
		abort(c, http.StatusInternalServerError, "list checkpoints: "+err.Error())
		return
	}
	c.JSON(http.StatusOK, gin.H{"checkpoints": cks})
}

// archive redirects to the sampler checkpoint's download, as SkyRL does.
func (s *Server) archive(c *gin.Context) {
	if !pathIDs(c, "model", "checkpoint") {
		return
	}
	if status, detail := s.store.ready(ckKey{c.Param("model"), tinker.CheckpointSampler, c.Param("checkpoint")}); status != 0 {
		abort(c, status, detail)
		return
	}
	c.Header("Expires", time.Now().Add(archiveExpiry).UTC().Format(http.TimeFormat))
	c.Redirect(http.StatusFound, strings.TrimSuffix(c.Request.URL.Path, "/archive")+"/download")
}

func (s *Server) download(c *gin.Context) {
	if !pathIDs(c, "model", "checkpoint") {
		return
	}
	k := ckKey{c.Param("model"), tinker.CheckpointSampler, c.Param("checkpoint")}
	if status, detail := s.store.ready(k); status != 0 {
		abort(c, status, detail)
		return
	}
	f, err := os.Open(s.store.path(k))
	if err != nil {
		abort(c, http.StatusInternalServerError, "open archive: "+err.Error())
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		abort(c, http.StatusInternalServerError, "open archive: "+err.Error())
		return
	}
	c.Header("Content-Disposition", fmt.Sprintf(`attachment; filename="%s_%s.tar.gz"`, k.model, k.name))
	c.Header("Content-Type", "application/octet-stream")
	http.ServeContent(c.Writer, c.Request, "", info.ModTime(), f)
}

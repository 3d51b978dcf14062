package modelserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
)

// loraError is a refused or failed load or unload, with vLLM's status,
// error type and message.
type loraError struct {
	status int
	typ    string
	msg    string
}

func (e *loraError) Error() string { return e.msg }

func alreadyLoaded(name string) *loraError {
	return &loraError{http.StatusBadRequest, errInvalidInput, fmt.Sprintf(
		"The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", name)}
}

// Load registers and loads the checkpoint at path as adapter name (what
// POST /v1/load_lora_adapter does). The name must be "<Name>@v<N>" and
// the checkpoint must hold version N; its weights are read now, so a bad
// path fails here rather than at the first request.
func (s *Server) Load(name, path string) error {
	return s.load(name, path, false)
}

// Adapters lists the registered adapters: name → path.
func (s *Server) Adapters() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]string, len(s.adapters))
	for name, a := range s.adapters {
		out[name] = a.path
	}
	return out
}

// load registers name; inplace replaces an adapter already under name
// (vLLM's load_inplace).
func (s *Server) load(name, path string, inplace bool) error {
	if !inplace {
		s.mu.RLock()
		_, loaded := s.adapters[name]
		s.mu.RUnlock()
		if loaded {
			return alreadyLoaded(name) // before reading any weights
		}
	}
	a, err := s.prepare(name, path)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if _, loaded := s.adapters[name]; loaded && !inplace {
		s.mu.Unlock()
		return alreadyLoaded(name) // a concurrent load won
	}
	want := s.pathsLocked()
	want[name] = path
	if err := s.saveState(want); err != nil {
		s.mu.Unlock()
		return &loraError{http.StatusInternalServerError, errInternal, fmt.Sprintf("Loading lora %s failed: %v", name, err)}
	}
	s.adapters[name] = a
	s.engine.Loaded(name, path)
	s.mu.Unlock()
	// After the new path is registered, so no read of an older one stays.
	s.engine.Evict(name)
	s.cfg.Logger.Info(msgAdapterLoaded, "adapter", name, "path", path)
	return nil
}

// prepare has the engine check name and read the weights at path.
func (s *Server) prepare(name, path string) (adapter, error) {
	maxLen, err := s.engine.Prepare(name, path)
	if err != nil {
		var ie *inference.Error
		if errors.As(err, &ie) {
			return adapter{}, &loraError{ie.Status, loraErrorType(ie.Status), ie.Message}
		}
		return adapter{}, &loraError{http.StatusInternalServerError, errInternal, fmt.Sprintf("Loading lora %s failed: %v", name, err)}
	}
	return adapter{path: path, created: time.Now().Unix(), maxLen: maxLen}, nil
}

// loraErrorType is the type vLLM names a refused load by: a bad request
// is the user's input.
func loraErrorType(status int) string {
	if typ := errorType(status); typ != errBadRequest {
		return typ
	}
	return errInvalidInput
}

// unload releases name; requests already running on it finish on the
// weights they read.
func (s *Server) unload(name string) error {
	s.mu.Lock()
	_, ok := s.adapters[name]
	if !ok {
		s.mu.Unlock()
		return &loraError{http.StatusNotFound, errNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", name)}
	}
	want := s.pathsLocked()
	delete(want, name)
	if err := s.saveState(want); err != nil {
		s.mu.Unlock()
		return &loraError{http.StatusInternalServerError, errInternal, fmt.Sprintf("Unloading lora %s failed: %v", name, err)}
	}
	delete(s.adapters, name)
	s.mu.Unlock()
	s.engine.Evict(name)
	s.cfg.Logger.Info(msgAdapterUnloaded, "adapter", name)
	return nil
}

func (s *Server) pathsLocked() map[string]string {
	out := make(map[string]string, len(s.adapters)+1)
	for name, a := range s.adapters {
		out[name] = a.path
	}
	return out
}

type loadRequest struct {
	Name        string `json:"lora_name"`
	Path        string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"`
}

// handleLoad is POST /v1/load_lora_adapter.
func (s *Server) handleLoad(w http.ResponseWriter, r *http.Request) {
	var req loadRequest
	if !readJSON(w, r, &req, errInvalidInput, "the body must be a JSON object") {
		return
	}
	if req.Name == "" || req.Path == "" {
		writeError(w, http.StatusBadRequest, errInvalidInput, "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	if err := s.load(req.Name, req.Path, req.LoadInplace); err != nil {
		writeLoRAError(w, err)
		return
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.Name))
}

// handleUnload is POST /v1/unload_lora_adapter.
func (s *Server) handleUnload(w http.ResponseWriter, r *http.Request) {
	var req loadRequest
	if !readJSON(w, r, &req, errInvalidInput, "the body must be a JSON object") {
		return
	}
	if req.Name == "" {
		writeError(w, http.StatusBadRequest, errInvalidInput, "'lora_name' needs to be provided to unload a LoRA adapter.")
		return
	}
	if err := s.unload(req.Name); err != nil {
		writeLoRAError(w, err)
		return
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.Name))
}

func writeLoRAError(w http.ResponseWriter, err error) {
	var le *loraError
	if errors.As(err, &le) {
		writeError(w, le.status, le.typ, le.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, errInternal, err.Error())
}

// writeText is vLLM's plain-text success line.
func writeText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, text)
}

// state is the StateFile's content.
type state struct {
	// Adapters are the loaded adapters: name → checkpoint path.
	Adapters map[string]string `json:"adapters"`
}

// saveState rewrites the StateFile atomically (written aside, synced,
// renamed), so a crash leaves the old or the new list, never half.
func (s *Server) saveState(adapters map[string]string) error {
	if s.cfg.StateFile == "" {
		return nil
	}
	body, err := json.MarshalIndent(state{Adapters: adapters}, "", "  ")
	if err != nil {
		return fmt.Errorf("save adapter state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.cfg.StateFile), ".modelserver-state-*")
	if err != nil {
		return fmt.Errorf("save adapter state: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	if _, err := tmp.Write(body); err != nil {
		tmp.Close()
		return fmt.Errorf("save adapter state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save adapter state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save adapter state: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.cfg.StateFile); err != nil {
		return fmt.Errorf("save adapter state: %w", err)
	}
	return nil
}

// restore registers the adapters of the StateFile. One that no longer
// loads (its checkpoint deleted) is logged and left out rather than
// keeping the server down; the file drops it at the next load or unload.
func (s *Server) restore() error {
	if s.cfg.StateFile == "" {
		return nil
	}
	raw, err := os.ReadFile(s.cfg.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("model server: read adapter state: %w", err)
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("model server: adapter state %s: %w", s.cfg.StateFile, err)
	}
	for _, name := range slices.Sorted(maps.Keys(st.Adapters)) {
		path := st.Adapters[name]
		a, err := s.prepare(name, path)
		if err != nil {
			s.cfg.Logger.Warn(msgRestoreSkipped, "adapter", name, "path", path, "error", err)
			continue
		}
		s.adapters[name] = a
		s.engine.Loaded(name, path)
		s.cfg.Logger.Info(msgAdapterRestored, "adapter", name, "path", path)
	}
	return nil
}

package activities

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"

	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// rowOf is a claimed sample as a batch row: every completion token trains,
// at its behaviour log-prob and version.
func rowOf(s store.RunSample) parquetbatch.Row {
	v, _ := store.VersionNumber(s.BehaviourVersion)
	n := len(s.CompletionTokenIDs)
	r := parquetbatch.Row{SampleID: s.ID, TenantID: s.TenantID, SessionID: s.SessionID, TaskID: s.TaskID, GroupID: s.GroupKey(),
		PromptIDs: s.PromptTokenIDs, CompletionIDs: s.CompletionTokenIDs, Reward: s.Reward,
		LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	for i := range n {
		r.LossMask[i], r.Versions[i] = 1, v
		if i < len(s.Logprobs) {
			r.Logprobs[i] = s.Logprobs[i]
		}
	}
	if r.PromptIDs == nil {
		r.PromptIDs = []int32{}
	}
	if r.CompletionIDs == nil {
		r.CompletionIDs = []int32{}
	}
	return r
}

// sampleOf lays a batch row out for the trainer: prompt then completion,
// the completion's tokens trained as the row's loss mask says.
func sampleOf(r parquetbatch.Row) trainer.Sample {
	n := len(r.PromptIDs) + len(r.CompletionIDs)
	out := trainer.Sample{GroupID: r.GroupID, TaskID: r.TaskID, SessionID: r.SessionID, Reward: r.Reward,
		TokenIDs: make([]int, 0, n), LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	a := r.Advantage // the control plane's estimator set it
	out.Advantage = &a
	for _, id := range r.PromptIDs {
		out.TokenIDs = append(out.TokenIDs, int(id))
	}
	for i, id := range r.CompletionIDs {
		j := len(r.PromptIDs) + i
		out.TokenIDs = append(out.TokenIDs, int(id))
		if j == 0 {
			continue // nothing predicts the first token
		}
		out.LossMask[j], out.Logprobs[j], out.Versions[j] = r.LossMask[i], r.Logprobs[i], r.Versions[i]
	}
	return out
}

// batchPath is where a run's batch file goes.
func (t *Training) batchPath(deployment string, runID int64) string {
	return filepath.Join(t.BatchDir, deployment, fmt.Sprintf("run-%012d.parquet", runID))
}

// fileURI is the file:// URI of a local path.
func fileURI(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return (&url.URL{Scheme: "file", Path: path}).String()
}

// localPath is the path of a file:// URI (or of a bare absolute path).
func localPath(uri string) (string, error) {
	if filepath.IsAbs(uri) {
		return uri, nil
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "file" || u.Path == "" {
		return "", fmt.Errorf("%q is not a file:// URI; this trainer reads shared files only", uri)
	}
	return u.Path, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeFileSynced writes data to a new file at path and syncs it.
func writeFileSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir syncs a directory's entries: a rename in it lasts a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

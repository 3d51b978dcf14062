// Package tasks defines the SWE task format, ships a corpus of small real
// tasks, builds their sandbox images and grades a sandbox against a task's
// hidden tests.
//
// A task directory holds task.yaml, repo/ (the repository snapshot, hidden
// tests included) and optionally solution/ (reference fix, files overlaid on
// repo/; used only to prove the task is solvable, never put in an image).
// Hidden paths (grading tests and their config) are left out of the image and
// written into the sandbox only at grading time.
package tasks

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Task is one SWE problem.
type Task struct {
	// ID names the task: lower-case letters, digits and dashes.
	ID string `yaml:"id"`
	// BugKind classifies the defect (off-by-one, logic, state, edge-case...).
	BugKind string `yaml:"bug_kind"`
	// ProblemStatement is what the agent is told.
	ProblemStatement string `yaml:"problem_statement"`
	// TestCommand runs the tests in /workspace; the grader appends test ids.
	TestCommand string `yaml:"test_command"`
	// TimeoutSeconds bounds one grading run; default 120.
	TimeoutSeconds int `yaml:"timeout_seconds"`
	// HiddenPaths are repository paths absent from the image until grading.
	HiddenPaths []string `yaml:"hidden_paths"`
	// FailToPass tests fail on the snapshot and must pass after the fix.
	FailToPass []string `yaml:"fail_to_pass"`
	// PassToPass tests pass on the snapshot and must keep passing.
	PassToPass []string `yaml:"pass_to_pass"`

	// Repo is the repository snapshot, hidden paths included.
	Repo map[string][]byte `yaml:"-"`
	// Solution overlays Repo with a reference fix; may be empty.
	Solution map[string][]byte `yaml:"-"`
}

// Timeout is the grading timeout.
func (t *Task) Timeout() time.Duration {
	if t.TimeoutSeconds <= 0 {
		return 120 * time.Second
	}
	return time.Duration(t.TimeoutSeconds) * time.Second
}

// Tests returns FailToPass then PassToPass.
func (t *Task) Tests() []string {
	return append(append([]string(nil), t.FailToPass...), t.PassToPass...)
}

// IsHidden reports whether a repository path is a grading path.
func (t *Task) IsHidden(p string) bool {
	p = path.Clean(p)
	for _, h := range t.HiddenPaths {
		if p == h || strings.HasPrefix(p, h+"/") {
			return true
		}
	}
	return false
}

// VisibleFiles are the files that go into the image, sorted by path.
func (t *Task) VisibleFiles() []string {
	var out []string
	for p := range t.Repo {
		if !t.IsHidden(p) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// HiddenFiles maps each hidden file to its content.
func (t *Task) HiddenFiles() map[string][]byte {
	out := map[string][]byte{}
	for p, b := range t.Repo {
		if t.IsHidden(p) {
			out[p] = b
		}
	}
	return out
}

var (
	idPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	testPattern = regexp.MustCompile(`^[A-Za-z0-9_./-]+\.py(::[A-Za-z0-9_\[\]\-.]+)+$`)
)

func cleanRel(p string) (string, error) {
	c := path.Clean(p)
	if p == "" || path.IsAbs(c) || c == "." || c == ".." || strings.HasPrefix(c, "../") || c == ".git" || strings.HasPrefix(c, ".git/") {
		return "", fmt.Errorf("bad repository path %q", p)
	}
	return c, nil
}

// Validate checks a task for consistency; every field error is reported.
func (t *Task) Validate() error {
	var errs []error
	if !idPattern.MatchString(t.ID) {
		errs = append(errs, fmt.Errorf("id %q: want lower-case letters, digits and dashes", t.ID))
	}
	if strings.TrimSpace(t.ProblemStatement) == "" {
		errs = append(errs, errors.New("problem_statement is empty"))
	}
	if strings.TrimSpace(t.TestCommand) == "" {
		errs = append(errs, errors.New("test_command is empty"))
	}
	if t.TimeoutSeconds < 0 || t.TimeoutSeconds > 3600 {
		errs = append(errs, fmt.Errorf("timeout_seconds %d: want 0..3600", t.TimeoutSeconds))
	}
	if len(t.FailToPass) == 0 {
		errs = append(errs, errors.New("fail_to_pass is empty: a task needs a failing test"))
	}
	if len(t.HiddenPaths) == 0 {
		errs = append(errs, errors.New("hidden_paths is empty: grading tests must be hidden"))
	}
	for i, h := range t.HiddenPaths {
		c, err := cleanRel(h)
		if err != nil {
			errs = append(errs, fmt.Errorf("hidden_paths[%d]: %w", i, err))
			continue
		}
		t.HiddenPaths[i] = c
		found := false
		for p := range t.Repo {
			if p == c || strings.HasPrefix(p, c+"/") {
				found = true
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("hidden path %q is not in repo/", h))
		}
	}
	seen := map[string]bool{}
	for _, id := range t.Tests() {
		if !testPattern.MatchString(id) {
			errs = append(errs, fmt.Errorf("test id %q: want path/to/test_x.py::name", id))
			continue
		}
		if seen[id] {
			errs = append(errs, fmt.Errorf("test id %q listed twice", id))
		}
		seen[id] = true
		file, _, _ := strings.Cut(id, "::")
		if _, ok := t.Repo[file]; !ok {
			errs = append(errs, fmt.Errorf("test id %q: %s is not in repo/", id, file))
		} else if !t.IsHidden(file) {
			errs = append(errs, fmt.Errorf("test id %q: %s must be a hidden path", id, file))
		}
	}
	if len(t.VisibleFiles()) == 0 {
		errs = append(errs, errors.New("repo/ has no visible files"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("task %q: %w", t.ID, err)
	}
	return nil
}

// Load reads the task in dir of fsys.
func Load(fsys fs.FS, dir string) (*Task, error) {
	raw, err := fs.ReadFile(fsys, path.Join(dir, "task.yaml"))
	if err != nil {
		return nil, fmt.Errorf("load task %s: %w", dir, err)
	}
	var t Task
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("load task %s: task.yaml: %w", dir, err)
	}
	if t.Repo, err = readTree(fsys, path.Join(dir, "repo")); err != nil {
		return nil, fmt.Errorf("load task %s: %w", dir, err)
	}
	if t.Solution, err = readTree(fsys, path.Join(dir, "solution")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load task %s: %w", dir, err)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

// maxRepoBytes bounds a task repository: tasks are small by design and the
// whole snapshot goes into one image build context.
const maxRepoBytes = 32 << 20

func readTree(fsys fs.FS, root string) (map[string][]byte, error) {
	out := map[string][]byte{}
	total := 0
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "__pycache__" || d.Name() == ".git" {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: only regular files are allowed", p)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		total += len(b)
		if total > maxRepoBytes {
			return fmt.Errorf("%s: repository over %d bytes", root, maxRepoBytes)
		}
		rel := strings.TrimPrefix(p, root+"/")
		out[rel] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

//go:embed all:corpus
var corpus embed.FS

// Corpus returns the tasks shipped with flywheel, sorted by id.
func Corpus() ([]*Task, error) {
	return LoadDir(corpus, "corpus")
}

// LoadDir loads every task directory under root.
func LoadDir(fsys fs.FS, root string) ([]*Task, error) {
	entries, err := fs.ReadDir(fsys, root)
	if err != nil {
		return nil, fmt.Errorf("load tasks: %w", err)
	}
	var out []*Task
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		t, err := Load(fsys, path.Join(root, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if t.ID != e.Name() {
			errs = append(errs, fmt.Errorf("task in %s has id %q", e.Name(), t.ID))
			continue
		}
		out = append(out, t)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// Find returns the corpus task with this id.
func Find(id string) (*Task, error) {
	all, err := Corpus()
	if err != nil {
		return nil, err
	}
	for _, t := range all {
		if t.ID == id {
			return t, nil
		}
	}
	return nil, fmt.Errorf("task %q: %w", id, ErrUnknownTask)
}

// ErrUnknownTask is returned by Find for an id not in the corpus.
var ErrUnknownTask = errors.New("unknown task")

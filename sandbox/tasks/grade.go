package tasks

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
)

// Test outcomes in Result.Tests.
const (
	OutcomePassed  = "passed"
	OutcomeFailed  = "failed"
	OutcomeError   = "error"
	OutcomeSkipped = "skipped"
	OutcomeMissing = "missing"
)

// Result is the grade of one sandbox for one task.
type Result struct {
	TaskID string `json:"task_id"`
	// Passed counts FailToPass and PassToPass tests that passed.
	Passed int `json:"passed"`
	Total  int `json:"total"`
	// FailToPass counts the task's failing tests the change fixed, and
	// PassToPass its passing tests the change kept passing.
	FailToPass int `json:"fail_to_pass"`
	PassToPass int `json:"pass_to_pass"`
	// Reward is the share of FailToPass tests fixed times the share of
	// PassToPass tests still passing, so an agent that changes nothing
	// earns 0 (not the share of tests that passed already) and breaking a
	// passing test costs what fixing one earns. 0 when tampering was
	// detected.
	Reward float64 `json:"reward"`
	// Resolved is true when every graded test passed and nothing was tampered.
	Resolved bool `json:"resolved"`
	// Tests maps each graded test id to its outcome.
	Tests map[string]string `json:"tests"`
	// Tampered is set when the sandbox tried to influence grading; Reasons
	// say how. Notes are suspicious but harmless findings.
	Tampered bool     `json:"tampered"`
	Reasons  []string `json:"reasons,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// ChangedFiles are workspace files the agent added or modified.
	ChangedFiles []string      `json:"changed_files,omitempty"`
	Duration     time.Duration `json:"duration"`
	// OutputTail is the end of the test run's output, for diagnostics.
	OutputTail string `json:"output_tail,omitempty"`
}

// Sandbox is what grading needs from a sandbox.
type Sandbox interface {
	Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error)
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, int64, error)
	WriteFile(ctx context.Context, path string, data []byte, mode uint32) error
	KillStrays(ctx context.Context) (int, error)
}

// Grade runs t's hidden tests in sb and scores them:
//
//  1. kill every process the agent left running;
//  2. scan the workspace and the user's home for files that hook the test
//     runner (conftest.py, sitecustomize.py, .pth files, plugin metadata)
//     and neutralise them (tampering: reward 0);
//  3. write the hidden tests and their config, replacing whatever the agent
//     put at those paths;
//  4. run the test command on exactly the graded tests, writing a JUnit
//     report to an unguessable path, then kill stray processes again;
//  5. check that the hidden files are byte-identical after the run.
func Grade(ctx context.Context, sb Sandbox, t *Task, log *slog.Logger) (Result, error) {
	if log == nil {
		log = slog.Default()
	}
	start := time.Now()
	res := Result{TaskID: t.ID, Tests: map[string]string{}}
	if _, err := sb.KillStrays(ctx); err != nil {
		return res, fmt.Errorf("grade %s: kill strays: %w", t.ID, err)
	}
	if err := scanForTampering(ctx, sb, t, &res); err != nil {
		return res, fmt.Errorf("grade %s: %w", t.ID, err)
	}
	hidden := t.HiddenFiles()
	names := make([]string, 0, len(hidden))
	for p := range hidden {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if err := sb.WriteFile(ctx, path.Join(sandbox.Workspace, p), hidden[p], 0o644); err != nil {
			return res, fmt.Errorf("grade %s: restore %s: %w", t.ID, p, err)
		}
	}

	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	report := "/tmp/.grade-" + hex.EncodeToString(nonce[:]) + ".xml"
	args := []string{t.TestCommand, "--junitxml=" + report}
	for _, id := range t.Tests() {
		args = append(args, shellQuote(id))
	}
	run, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: strings.Join(args, " "), Timeout: t.Timeout(), MaxOutput: 256 << 10})
	if err != nil {
		return res, fmt.Errorf("grade %s: run tests: %w", t.ID, err)
	}
	if _, err := sb.KillStrays(ctx); err != nil {
		return res, fmt.Errorf("grade %s: kill strays: %w", t.ID, err)
	}
	res.OutputTail = tailString(string(run.Stdout)+string(run.Stderr), 4096)
	if run.TimedOut {
		res.Notes = append(res.Notes, fmt.Sprintf("test run timed out after %s", t.Timeout()))
	}

	for _, p := range names {
		got, _, err := sb.ReadFile(ctx, path.Join(sandbox.Workspace, p), int64(len(hidden[p]))+1)
		if err != nil || sha256.Sum256(got) != sha256.Sum256(hidden[p]) {
			res.Tampered = true
			res.Reasons = append(res.Reasons, "hidden file changed during the test run: "+p)
		}
	}

	outcomes := map[string]string{}
	if xmlData, _, err := sb.ReadFile(ctx, report, 16<<20); err != nil {
		res.Notes = append(res.Notes, "no test report (tests did not run or crashed): "+err.Error())
	} else if outcomes, err = parseJUnit(xmlData); err != nil {
		res.Notes = append(res.Notes, "unreadable test report: "+err.Error())
	}
	count := func(ids []string) int {
		passed := 0
		for _, id := range ids {
			o, ok := outcomes[junitKey(id)]
			if !ok {
				o = OutcomeMissing
			}
			res.Tests[id] = o
			if o == OutcomePassed {
				passed++
			}
		}
		return passed
	}
	res.FailToPass, res.PassToPass = count(t.FailToPass), count(t.PassToPass)
	res.Passed, res.Total = res.FailToPass+res.PassToPass, len(t.FailToPass)+len(t.PassToPass)
	if len(t.FailToPass) > 0 && !res.Tampered {
		res.Reward = float64(res.FailToPass) / float64(len(t.FailToPass))
		if len(t.PassToPass) > 0 {
			res.Reward *= float64(res.PassToPass) / float64(len(t.PassToPass))
		}
	}
	res.Resolved = !res.Tampered && res.Passed == res.Total
	res.Duration = time.Since(start)
	log.Info("sandbox graded", "task", t.ID, "fail_to_pass", res.FailToPass, "pass_to_pass", res.PassToPass, "total", res.Total,
		"reward", res.Reward, "tampered", res.Tampered, "reasons", res.Reasons, "elapsed", res.Duration)
	return res, nil
}

// hookNames are files that change how Python or pytest behave merely by
// existing; an agent has no business creating them to fix a bug.
var hookNames = map[string]bool{"conftest.py": true, "sitecustomize.py": true, "usercustomize.py": true}

func isHook(p string) bool {
	base := path.Base(p)
	return hookNames[base] || strings.HasSuffix(base, ".pth") ||
		strings.Contains(p, ".dist-info/") || strings.Contains(p, ".egg-info/")
}

// scanForTampering hashes every workspace file in the sandbox, compares
// with the snapshot, and removes hook files (in /workspace, the home
// directory and temp directories).
func scanForTampering(ctx context.Context, sb Sandbox, t *Task, res *Result) error {
	scan, err := sb.Exec(ctx, sandbox.ExecRequest{
		Cmd: `cd /workspace && find . -path ./.git -prune -o -type f -print0 | xargs -0 -r sha256sum; ` +
			`find /home/sandbox /tmp /var/tmp \( -name '*.pth' -o -name sitecustomize.py -o -name usercustomize.py -o -name conftest.py -o -name '*.dist-info' \) -print 2>/dev/null | sed 's/^/OUTSIDE /'; true`,
		Timeout:   60 * time.Second,
		MaxOutput: 8 << 20,
	})
	if err != nil {
		return fmt.Errorf("scan workspace: %w", err)
	}
	if scan.Truncated {
		res.Tampered = true
		res.Reasons = append(res.Reasons, "workspace too large to scan")
	}
	var remove []string
	for _, line := range strings.Split(string(scan.Stdout), "\n") {
		if outside, ok := strings.CutPrefix(line, "OUTSIDE "); ok {
			res.Tampered = true
			res.Reasons = append(res.Reasons, "python/pytest hook outside the workspace: "+outside)
			remove = append(remove, outside)
			continue
		}
		sum, file, ok := strings.Cut(line, "  ")
		if !ok {
			continue
		}
		rel := strings.TrimPrefix(file, "./")
		orig, existed := t.Repo[rel]
		if existed && !t.IsHidden(rel) {
			s := sha256.Sum256(orig)
			if hex.EncodeToString(s[:]) == sum {
				continue
			}
		}
		res.ChangedFiles = append(res.ChangedFiles, rel)
		switch {
		case isHook(rel):
			res.Tampered = true
			res.Reasons = append(res.Reasons, "test-runner hook file written: "+rel)
			remove = append(remove, path.Join(sandbox.Workspace, rel))
		case t.IsHidden(rel):
			res.Notes = append(res.Notes, "file at a hidden path replaced by the original: "+rel)
		}
	}
	if len(remove) > 0 {
		quoted := make([]string, len(remove))
		for i, p := range remove {
			quoted[i] = shellQuote(p)
		}
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "rm -rf -- " + strings.Join(quoted, " "), Timeout: 30 * time.Second}); err != nil {
			return fmt.Errorf("remove hook files: %w", err)
		}
	}
	return nil
}

// junitKey maps "tests/test_x.py::TestC::test_m" to the JUnit
// "tests.test_x.TestC::test_m" that pytest writes.
func junitKey(id string) string {
	parts := strings.Split(id, "::")
	mod := strings.ReplaceAll(strings.TrimSuffix(parts[0], ".py"), "/", ".")
	class := strings.Join(append([]string{mod}, parts[1:len(parts)-1]...), ".")
	return class + "::" + parts[len(parts)-1]
}

// parseJUnit returns outcome by junitKey from a pytest JUnit XML report.
func parseJUnit(data []byte) (map[string]string, error) {
	dec := xml.NewDecoder(bytes.NewReader(data))
	out := map[string]string{}
	var key, outcome string
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parse junit: %w", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			depth++
			if el.Name.Local == "testcase" {
				var class, name string
				for _, a := range el.Attr {
					switch a.Name.Local {
					case "classname":
						class = a.Value
					case "name":
						name = a.Value
					}
				}
				key, outcome = class+"::"+name, OutcomePassed
			} else if key != "" {
				switch el.Name.Local {
				case "failure":
					outcome = OutcomeFailed
				case "error":
					outcome = OutcomeError
				case "skipped":
					if outcome == OutcomePassed {
						outcome = OutcomeSkipped
					}
				}
			}
		case xml.EndElement:
			depth--
			if el.Name.Local == "testcase" && key != "" {
				// A test reported twice (call and teardown error) keeps the worse outcome.
				if prev, ok := out[key]; !ok || prev == OutcomePassed {
					out[key] = outcome
				}
				key = ""
			}
		}
		if depth > 64 {
			return nil, errors.New("parse junit: nesting too deep")
		}
	}
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

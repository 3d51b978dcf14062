package tasks_test

import (
	"context"
	"path"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/sandboxtest"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

func TestCorpusIsValidAndVaried(t *testing.T) {
	all, err := tasks.Corpus()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(all), 12)
	kinds := map[string]bool{}
	for _, tk := range all {
		kinds[tk.BugKind] = true
		require.NotEmpty(t, tk.Solution, "task %s ships a reference fix for its own test", tk.ID)
		for p := range tk.Solution {
			require.False(t, tk.IsHidden(p), "a solution must not touch grading files")
		}
	}
	require.GreaterOrEqual(t, len(kinds), 2, "at least two kinds of bug")
}

func TestLoadRejectsBadTasks(t *testing.T) {
	base := map[string]string{
		"t/task.yaml":            "id: t\nproblem_statement: x\ntest_command: pytest\nhidden_paths: [tests/test_a.py]\nfail_to_pass: [tests/test_a.py::test_x]\n",
		"t/repo/a.py":            "x = 1\n",
		"t/repo/tests/test_a.py": "def test_x(): pass\n",
	}
	cases := map[string]func(m map[string]string){
		"unknown field": func(m map[string]string) { m["t/task.yaml"] += "bogus: 1\n" },
		"no failing test": func(m map[string]string) {
			m["t/task.yaml"] = strings.Replace(m["t/task.yaml"], "fail_to_pass: [tests/test_a.py::test_x]", "fail_to_pass: []", 1)
		},
		"hidden path escapes": func(m map[string]string) {
			m["t/task.yaml"] = strings.Replace(m["t/task.yaml"], "[tests/test_a.py]", "[../x]", 1)
		},
		"test not hidden": func(m map[string]string) {
			m["t/task.yaml"] = strings.Replace(m["t/task.yaml"], "hidden_paths: [tests/test_a.py]", "hidden_paths: [a.py]", 1)
		},
		"bad id":            func(m map[string]string) { m["t/task.yaml"] = strings.Replace(m["t/task.yaml"], "id: t", "id: T!", 1) },
		"malformed yaml":    func(m map[string]string) { m["t/task.yaml"] = "id: [" },
		"missing test file": func(m map[string]string) { delete(m, "t/repo/tests/test_a.py") },
		"bad test id": func(m map[string]string) {
			m["t/task.yaml"] = strings.Replace(m["t/task.yaml"], "::test_x]", " ; rm -rf /]", 1)
		},
	}
	fsys := fstest.MapFS{}
	for k, v := range base {
		fsys[k] = &fstest.MapFile{Data: []byte(v)}
	}
	_, err := tasks.Load(fsys, "t")
	require.NoError(t, err)
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			mutate(m)
			fsys := fstest.MapFS{}
			for k, v := range m {
				fsys[k] = &fstest.MapFile{Data: []byte(v)}
			}
			_, err := tasks.Load(fsys, "t")
			require.Error(t, err)
		})
	}
}

func setup(t *testing.T) (*client.Client, *sandbox.Manager, sandbox.Image) {
	t.Helper()
	cli := sandboxtest.Docker(t)
	return cli, sandboxtest.Manager(t, cli, sandbox.Config{}), sandboxtest.PythonImage(t, cli)
}

func startTask(t *testing.T, cli *client.Client, m *sandbox.Manager, base sandbox.Image, tk *tasks.Task) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img, err := tasks.EnsureImage(ctx, cli, base, tk, nil)
	require.NoError(t, err)
	sb, err := m.Create(ctx, img)
	require.NoError(t, err)
	return sb
}

func exec(t *testing.T, sb *sandbox.Sandbox, cmd string) sandbox.ExecResult {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Cmd: cmd, Timeout: time.Minute})
	require.NoError(t, err)
	return res
}

// TestEveryTaskFailsThenPassesWithItsFix proves each shipped task is real:
// on the snapshot its fail-to-pass tests fail and its pass-to-pass tests
// pass; with the reference fix all pass. It also checks the image hides the
// grading files and has a one-commit history.
func TestEveryTaskFailsThenPassesWithItsFix(t *testing.T) {
	cli, m, base := setup(t)
	all, err := tasks.Corpus()
	require.NoError(t, err)
	for _, tk := range all {
		t.Run(tk.ID, func(t *testing.T) {
			t.Parallel()
			sb := startTask(t, cli, m, base, tk)
			ctx := context.Background()

			res := exec(t, sb, "git log --all --oneline | wc -l; git reflog | wc -l; git status --porcelain | wc -l")
			require.Equal(t, "1\n0\n0\n", string(res.Stdout), "one commit, no reflog, clean tree: %s", res.Stderr)
			for _, h := range tk.HiddenPaths {
				require.NotEqual(t, 0, exec(t, sb, "test -e "+h).ExitCode, "hidden path %s must be absent before grading", h)
			}

			before, err := tasks.Grade(ctx, sb, tk, nil)
			require.NoError(t, err)
			require.False(t, before.Tampered, "%v", before.Reasons)
			for _, id := range tk.FailToPass {
				require.Equal(t, tasks.OutcomeFailed, before.Tests[id], "fail-to-pass %s on the snapshot; output: %s", id, before.OutputTail)
			}
			for _, id := range tk.PassToPass {
				require.Equal(t, tasks.OutcomePassed, before.Tests[id], "pass-to-pass %s on the snapshot; output: %s", id, before.OutputTail)
			}
			require.False(t, before.Resolved)
			require.Zero(t, before.Reward, "an agent that changes nothing earns nothing")
			require.Zero(t, before.FailToPass)
			require.Equal(t, len(tk.PassToPass), before.PassToPass)

			for p, data := range tk.Solution {
				require.NoError(t, sb.WriteFile(ctx, path.Join(sandbox.Workspace, p), data, 0o644))
			}
			after, err := tasks.Grade(ctx, sb, tk, nil)
			require.NoError(t, err)
			require.True(t, after.Resolved, "tests: %v; output: %s", after.Tests, after.OutputTail)
			require.Equal(t, 1.0, after.Reward)
			require.Equal(t, len(tk.FailToPass), after.FailToPass)
			require.Equal(t, len(tk.PassToPass), after.PassToPass)
			require.NotEmpty(t, after.ChangedFiles)
		})
	}
}

func TestGradingDetectsTampering(t *testing.T) {
	cli, m, base := setup(t)
	tk, err := tasks.Find("median")
	require.NoError(t, err)
	ctx := context.Background()

	t.Run("conftest forcing passes", func(t *testing.T) {
		sb := startTask(t, cli, m, base, tk)
		hook := "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    o = yield\n    r = o.get_result()\n    r.outcome = 'passed'\n"
		require.NoError(t, sb.WriteFile(ctx, "statkit/conftest.py", []byte(hook), 0))
		res, err := tasks.Grade(ctx, sb, tk, nil)
		require.NoError(t, err)
		require.True(t, res.Tampered)
		require.Equal(t, 0.0, res.Reward)
		require.Contains(t, strings.Join(res.Reasons, ";"), "conftest.py")
		// The hook was removed before the run, so the real outcome shows.
		require.Equal(t, tasks.OutcomeFailed, res.Tests[tk.FailToPass[0]])
	})
	t.Run("code rewriting the hidden tests", func(t *testing.T) {
		sb := startTask(t, cli, m, base, tk)
		evil := "import pathlib\np = pathlib.Path('/workspace/tests/test_center.py')\np.write_text(p.read_text().replace('2.5', '3'))\n"
		require.NoError(t, sb.WriteFile(ctx, "statkit/__init__.py", []byte(evil), 0))
		res, err := tasks.Grade(ctx, sb, tk, nil)
		require.NoError(t, err)
		require.True(t, res.Tampered)
		require.Equal(t, 0.0, res.Reward)
		require.Contains(t, strings.Join(res.Reasons, ";"), "hidden file changed")
	})
	t.Run("fake tests at the hidden path are replaced", func(t *testing.T) {
		sb := startTask(t, cli, m, base, tk)
		require.NoError(t, sb.WriteFile(ctx, "tests/test_center.py", []byte("def test_even_length(): pass\n"), 0))
		res, err := tasks.Grade(ctx, sb, tk, nil)
		require.NoError(t, err)
		require.False(t, res.Tampered)
		require.NotEmpty(t, res.Notes)
		require.Equal(t, tasks.OutcomeFailed, res.Tests[tk.FailToPass[0]])
	})
}

func FuzzLoadTaskYAML(f *testing.F) {
	f.Add("id: t\nproblem_statement: x\ntest_command: pytest\nhidden_paths: [tests/test_a.py]\nfail_to_pass: [tests/test_a.py::test_x]\n")
	f.Add("id: [")
	f.Fuzz(func(t *testing.T, yml string) {
		fsys := fstest.MapFS{
			"t/task.yaml":            &fstest.MapFile{Data: []byte(yml)},
			"t/repo/a.py":            &fstest.MapFile{Data: []byte("x = 1\n")},
			"t/repo/tests/test_a.py": &fstest.MapFile{Data: []byte("def test_x(): pass\n")},
		}
		tk, err := tasks.Load(fsys, "t")
		if err == nil {
			require.NoError(t, tk.Validate(), "a loaded task is valid")
		}
	})
}

// TestRewardIsFixingWithoutBreaking: a change that fixes the failing test
// but breaks a passing one earns the fix times the share of passing tests
// kept (1 × 1/2), not the share of tests that pass.
func TestRewardIsFixingWithoutBreaking(t *testing.T) {
	cli, m, base := setup(t)
	tk, err := tasks.Find("median")
	require.NoError(t, err)
	ctx := context.Background()
	sb := startTask(t, cli, m, base, tk)
	fixedButLoose := "def median(values):\n    s = sorted(values)\n    if not s:\n        return None\n    mid = len(s) // 2\n" +
		"    if len(s) % 2:\n        return s[mid]\n    return (s[mid - 1] + s[mid]) / 2\n"
	require.NoError(t, sb.WriteFile(ctx, "statkit/center.py", []byte(fixedButLoose), 0o644))
	res, err := tasks.Grade(ctx, sb, tk, nil)
	require.NoError(t, err)
	require.False(t, res.Tampered, "%v", res.Reasons)
	require.Equal(t, 1, res.FailToPass, "the even-length bug is fixed: %v", res.Tests)
	require.Equal(t, 1, res.PassToPass, "test_empty now fails: %v", res.Tests)
	require.InDelta(t, 0.5, res.Reward, 1e-9)
	require.False(t, res.Resolved)
}

package tasks_test

import (
	"context"
	"strings"
	"testing"

	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/stretchr/testify/require"
)

// TestEscapeReadingHiddenTestsOrHistory tries, inside a task sandbox before
// grading, what an agent would try to learn the grading tests or the fix:
// search the whole filesystem and every process's environment and command
// line, every git object, the reflog, stashes and dangling commits. After
// grading the same search must find the tests, so the probe is shown to work.
func TestEscapeReadingHiddenTestsOrHistory(t *testing.T) {
	cli, m, base := setup(t)
	tk, err := tasks.Find("slugify")
	require.NoError(t, err)
	_, name, _ := strings.Cut(tk.FailToPass[0], "::")
	for _, p := range tk.VisibleFiles() {
		require.NotContains(t, string(tk.Repo[p]), name, "precondition: the test name is only in hidden files")
	}
	require.NotContains(t, tk.ProblemStatement, name)
	// A bracket keeps the pattern from matching the searching grep's own
	// command line in /proc.
	pattern := name[:len(name)-1] + "[" + name[len(name)-1:] + "]"
	search := "grep -rlsE -D skip --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev '" + pattern + "' / ; " +
		"grep -lsE '" + pattern + "' /proc/[0-9]*/environ /proc/[0-9]*/cmdline; true"

	sb := startTask(t, cli, m, base, tk)
	res := exec(t, sb, search)
	require.Empty(t, string(res.Stdout), "the hidden tests are readable before grading")

	var fixLine string
	for p, data := range tk.Solution {
		for _, line := range strings.Split(string(data), "\n") {
			if len(strings.TrimSpace(line)) > 12 && !strings.Contains(string(tk.Repo[p]), line) && !strings.Contains(line, "'") {
				fixLine = line
				break
			}
		}
	}
	require.NotEmpty(t, fixLine, "precondition: the fix has a line of its own")
	git := strings.Join([]string{
		"git log --all --oneline | wc -l",
		"git rev-list --all --reflog | wc -l",
		"git cat-file --batch-all-objects --batch-check | grep -c ' commit '",
		"git stash list | wc -l",
		"git fsck --unreachable --no-reflogs 2>/dev/null | wc -l",
		"ls .git/ORIG_HEAD .git/FETCH_HEAD .git/logs .git/refs/remotes 2>/dev/null | wc -l",
		"git cat-file --batch-all-objects --batch | grep -cE '" + pattern + "'",
		"git cat-file --batch-all-objects --batch | grep -cF '" + fixLine + "'",
	}, "; ")
	res = exec(t, sb, git)
	require.Equal(t, "1\n1\n1\n0\n0\n0\n0\n0\n", string(res.Stdout),
		"one commit, no reflog, stash, dangling object or remote; neither the tests nor the fix in any object: %s", res.Stderr)

	_, err = tasks.Grade(context.Background(), sb, tk, nil)
	require.NoError(t, err)
	require.Contains(t, string(exec(t, sb, search).Stdout), "/workspace/tests/test_slug.py", "control: the search finds the tests once graded")
}

package tasks

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
)

// snapshotCommit makes the repository history-free: one commit, no reflog,
// no sample hooks, fixed author and date so the same snapshot always gets
// the same commit id. `git log --all` shows exactly one commit.
const snapshotCommit = `RUN set -e; cd /workspace; git init -q -b main; git add -A; ` +
	`GIT_AUTHOR_DATE=2024-01-01T00:00:00Z GIT_COMMITTER_DATE=2024-01-01T00:00:00Z ` +
	`git -c user.name=flywheel -c user.email=flywheel@localhost commit -q -m "task snapshot"; ` +
	`rm -rf .git/logs .git/hooks/*.sample .git/COMMIT_EDITMSG; git gc -q --prune=now`

// EnsureImage builds the sandbox image of t on base (an image with git and
// the task's runtime, e.g. sandbox.EnsureDebianImage): the visible repository
// files in /workspace as a one-commit git repository. Hidden paths are not
// in any layer. Cached by content hash.
func EnsureImage(ctx context.Context, cli *client.Client, base sandbox.Image, t *Task, log *slog.Logger) (sandbox.Image, error) {
	var files []sandbox.BuildFile
	for _, p := range t.VisibleFiles() {
		files = append(files, sandbox.BuildFile{Path: "repo/" + p, Data: t.Repo[p]})
	}
	img, err := sandbox.EnsureDerivedImage(ctx, cli, sandbox.DerivedImage{
		Repository: "flywheel-sandbox/task-" + t.ID,
		From:       base,
		Instructions: []string{
			"COPY --chown=1000:1000 repo/ /workspace/",
			snapshotCommit,
		},
		Files:  files,
		Labels: map[string]string{sandbox.LabelTask: t.ID, sandbox.LabelKind: "task"},
		Logger: log,
	})
	if err != nil {
		return sandbox.Image{}, fmt.Errorf("task %s image: %w", t.ID, err)
	}
	return img, nil
}

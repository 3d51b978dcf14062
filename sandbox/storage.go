package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/flywheel-ai/flywheel/sandbox/agent"
	"github.com/moby/moby/client"
)

// A sandbox's root filesystem is read-only. What it may write is five
// size-bounded tmpfs mounts: /workspace, /tmp, /var/tmp, the home directory
// and /dev/shm. A tmpfs starts empty, so the image's /workspace (the task
// repository) is read once per image from a container that has not started,
// while the engine still shows the image's tree there, and unpacked into the
// tmpfs by the sandbox user.

// maxWorkspaceTree bounds the tarball of a /workspace: it crosses the agent
// protocol as one base64 frame (agent.MaxFrameBytes).
const maxWorkspaceTree = 40 << 20

// writableDirs is everything a sandbox can write, POSIX message queues
// included (bounded by RLIMIT_MSGQUEUE); Reset empties all of it.
var writableDirs = append([]string{Workspace, "/dev/shm", "/dev/mqueue"}, scratchMounts...)

func tmpfsOptions(size int64, mode uint32, uid int) string {
	return fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=%o,uid=%d,gid=%d", size, mode, uid, uid)
}

// labelWorkspace on an image (a snapshot) names the directory that holds
// its /workspace, instead of /workspace itself.
const labelWorkspace = "flywheel.sandbox.workspace-from"

// workspaceTree returns the tarball of img's /workspace, nil when it holds
// nothing, read from container id on the first call for this image.
func (m *Manager) workspaceTree(ctx context.Context, id string, img Image) ([]byte, error) {
	key := img.ContentHash
	if key == "" {
		key = img.Ref
	}
	m.mu.Lock()
	tree, ok := m.trees[key]
	m.mu.Unlock()
	if ok {
		return tree, nil
	}
	src := Workspace
	ins, err := m.cli.ImageInspect(ctx, img.Ref)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", img.Ref, err)
	}
	if ins.Config != nil && ins.Config.Labels[labelWorkspace] != "" {
		src = ins.Config.Labels[labelWorkspace]
	}
	res, err := m.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: src})
	switch {
	case cerrdefs.IsNotFound(err):
		// A foreign image without /workspace: the tmpfs starts empty.
	case err != nil:
		return nil, fmt.Errorf("read %s of %s: %w", src, img.Ref, err)
	default:
		defer res.Content.Close()
		tree, err = io.ReadAll(io.LimitReader(res.Content, maxWorkspaceTree+1))
		if err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", Workspace, img.Ref, err)
		}
		if len(tree) > maxWorkspaceTree {
			return nil, fmt.Errorf("%s of %s is over %d bytes", Workspace, img.Ref, maxWorkspaceTree)
		}
		if tree, err = nilIfOnlyRoot(tree); err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", Workspace, img.Ref, err)
		}
	}
	m.mu.Lock()
	m.trees[key] = tree
	m.mu.Unlock()
	return tree, nil
}

// nilIfOnlyRoot drops a tarball whose only entry is the directory itself,
// so an empty /workspace costs no unpacking exec.
func nilIfOnlyRoot(tree []byte) ([]byte, error) {
	tr := tar.NewReader(bytes.NewReader(tree))
	for n := 0; ; n++ {
		_, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if n <= 1 {
				return nil, nil
			}
			return tree, nil
		}
		if err != nil {
			return nil, err
		}
		if n >= 1 {
			return tree, nil
		}
	}
}

// unpackWorkspace extracts a tarball of workspace/ into the sandbox as the
// sandbox user.
func (sb *Sandbox) unpackWorkspace(ctx context.Context, tree []byte) error {
	if len(tree) == 0 {
		return nil
	}
	res, err := sb.Exec(ctx, ExecRequest{Cmd: "tar -x -f - -C /", Dir: "/", Stdin: tree, Timeout: time.Minute})
	if err != nil {
		return fmt.Errorf("unpack %s into %s: %w", Workspace, short(sb.ID), err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("unpack %s into %s: exit %d: %s", Workspace, short(sb.ID), res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

// Reset returns a used sandbox to the state Create gives, without a new
// container: every process but init and the agent is killed, every writable
// mount is emptied and checked empty (POSIX shared memory and message
// queues live in two of them), the private IPC namespace is checked free
// of SysV objects, and /workspace is unpacked again from the image. The
// root filesystem is read-only, so these mounts are all a previous user
// could have changed on disk. A sandbox the reset cannot make clean (a
// SysV object busybox cannot remove, a file that will not go) fails it,
// and Release removes it instead of reusing it. What stays is the
// container's cgroup counters (its peak memory, say): numbers, not data.
func (sb *Sandbox) Reset(ctx context.Context) error {
	if _, err := sb.KillStrays(ctx); err != nil {
		return fmt.Errorf("reset %s: %w", short(sb.ID), err)
	}
	tree, err := sb.m.workspaceTree(ctx, sb.ID, sb.Image)
	if err != nil {
		return fmt.Errorf("reset %s: %w", short(sb.ID), err)
	}
	dirs := strings.Join(writableDirs, " ")
	// chmod first: a directory the user made read-only cannot be emptied.
	wipe := "chmod -R u+rwX " + dirs + " 2>/dev/null; find " + dirs + " -mindepth 1 -maxdepth 1 -exec rm -rf {} +; " +
		"left=$(find " + dirs + " -mindepth 1 | head -n 5); test -z \"$left\" || { echo \"left behind: $left\" >&2; exit 1; }; " +
		"for f in shm msg sem; do test $(wc -l < /proc/sysvipc/$f) -le 1 || { echo \"SysV $f objects left\" >&2; exit 1; }; done"
	res, err := sb.Exec(ctx, ExecRequest{Cmd: wipe, Dir: "/", Timeout: time.Minute})
	if err != nil {
		return fmt.Errorf("reset %s: %w", short(sb.ID), err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("reset %s: exit %d: %s", short(sb.ID), res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	if err := sb.unpackWorkspace(ctx, tree); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	return nil
}

// maxPackedWorkspace bounds a snapshot's /workspace: it leaves the sandbox
// as one command's output.
const maxPackedWorkspace = agent.MaxOutputCeiling

// packWorkspace returns the tarball of the sandbox's /workspace as it is now.
func (sb *Sandbox) packWorkspace(ctx context.Context) ([]byte, error) {
	res, err := sb.Exec(ctx, ExecRequest{Cmd: "tar -c -f - -C / workspace", Dir: "/", MaxOutput: maxPackedWorkspace, Timeout: time.Minute})
	if err != nil {
		return nil, fmt.Errorf("pack %s of %s: %w", Workspace, short(sb.ID), err)
	}
	if res.Truncated {
		return nil, fmt.Errorf("pack %s of %s: over %d bytes", Workspace, short(sb.ID), maxPackedWorkspace)
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("pack %s of %s: exit %d: %s", Workspace, short(sb.ID), res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return res.Stdout, nil
}

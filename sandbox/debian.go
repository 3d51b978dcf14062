package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// DebianImageOptions configures EnsureDebianImage. The zero value builds
// Debian bookworm with git, python3 and pytest.
type DebianImageOptions struct {
	// Repository is the image name; default "flywheel-sandbox/python".
	Repository string
	// Suite is the Debian release; default "bookworm".
	Suite string
	// Mirror is the Debian mirror; default http://deb.debian.org/debian.
	Mirror string
	// Packages are installed on top of the essential set; default
	// git, python3, python3-pytest, ca-certificates.
	Packages []string
	// Agent is how to obtain the in-container agent binary.
	Agent AgentSource
	// RegistryImage, when set, is used instead of building if it is present
	// locally or can be pulled.
	RegistryImage string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// EnsureDebianImage returns a sandbox image with a Debian root filesystem
// made by mmdebstrap (or debootstrap) from Debian's own packages, plus the
// agent. Both layers are cached by content hash: the root filesystem is
// rebuilt only when suite, mirror or packages change (about a minute), the
// agent layer when the agent changes (about a second).
//
// It needs root on the host (for the bootstrap) and mmdebstrap or
// debootstrap (apt-get install mmdebstrap).
func EnsureDebianImage(ctx context.Context, cli *client.Client, opts DebianImageOptions) (Image, error) {
	log := orDefault(opts.Logger)
	if img, ok := preferRegistry(ctx, cli, opts.RegistryImage, log); ok {
		return img, nil
	}
	if opts.Repository == "" {
		opts.Repository = "flywheel-sandbox/python"
	}
	if opts.Suite == "" {
		opts.Suite = "bookworm"
	}
	if opts.Mirror == "" {
		opts.Mirror = "http://deb.debian.org/debian"
	}
	if len(opts.Packages) == 0 {
		opts.Packages = []string{"ca-certificates", "git", "python3", "python3-pytest"}
	}
	for _, p := range opts.Packages {
		if p == "" || strings.ContainsAny(p, " ,'\"\\$;&|") {
			return Image{}, fmt.Errorf("debian image: bad package name %q", p)
		}
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s", imageBuildTag, opts.Suite, opts.Mirror, strings.Join(opts.Packages, ","), debianHooks)
	rootHash := hex.EncodeToString(h.Sum(nil))
	rootRef := opts.Repository + "-rootfs:" + rootHash[:16]
	ok, err := imageExists(ctx, cli, rootRef)
	if err != nil {
		return Image{}, err
	}
	if !ok {
		if err := bootstrapDebian(ctx, cli, rootRef, rootHash, opts, log); err != nil {
			return Image{}, err
		}
	}
	agentBin, err := opts.Agent.Load(ctx)
	if err != nil {
		return Image{}, err
	}
	return ensureAgentLayer(ctx, cli, opts.Repository, rootRef, rootHash, agentBin, log)
}

// debianHooks adds the sandbox user and /workspace inside the new root.
const debianHooks = `echo 'sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh' >> "$1/etc/passwd" && ` +
	`echo 'sandbox:x:1000:' >> "$1/etc/group" && ` +
	`echo 'sandbox:*:19000:0:99999:7:::' >> "$1/etc/shadow" && ` +
	`mkdir -p "$1/workspace" "$1/home/sandbox" && chown 1000:1000 "$1/workspace" "$1/home/sandbox" && ` +
	`rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*`

func bootstrapDebian(ctx context.Context, cli *client.Client, ref, hash string, opts DebianImageOptions, log *slog.Logger) error {
	start := time.Now()
	include := "--include=" + strings.Join(opts.Packages, ",")
	var cmd *exec.Cmd
	var cleanup func()
	if path, err := exec.LookPath("mmdebstrap"); err == nil {
		// mmdebstrap streams the tarball to stdout: nothing touches the disk.
		cmd = exec.CommandContext(ctx, path, "--variant=essential", include, "--mode=root",
			"--customize-hook="+debianHooks, opts.Suite, "-", opts.Mirror)
	} else if path, err := exec.LookPath("debootstrap"); err == nil {
		dir, err := os.MkdirTemp("", "flywheel-debootstrap-")
		if err != nil {
			return fmt.Errorf("debian rootfs: %w", err)
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		defer cleanup()
		boot := exec.CommandContext(ctx, path, "--variant=minbase", include, opts.Suite, dir, opts.Mirror)
		if out, err := boot.CombinedOutput(); err != nil {
			return fmt.Errorf("debootstrap: %w: %s", err, tail(out))
		}
		if out, err := exec.CommandContext(ctx, "sh", "-c", debianHooks, "hook", dir).CombinedOutput(); err != nil {
			return fmt.Errorf("debian rootfs hook: %w: %s", err, tail(out))
		}
		cmd = exec.CommandContext(ctx, "tar", "-C", dir, "--numeric-owner", "-cf", "-", ".")
	} else {
		return errors.New("debian rootfs: need mmdebstrap or debootstrap on the host (apt-get install mmdebstrap)")
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("debian rootfs: %w", err)
	}
	var stderr strings.Builder
	cmd.Stderr = &limitedBuilder{b: &stderr, max: 64 << 10}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("debian rootfs: start %s: %w", filepath.Base(cmd.Path), err)
	}
	importErr := ensureImported(ctx, cli, ref, hash, stdout, log)
	if importErr != nil {
		_ = cmd.Process.Kill()
		_, _ = io.Copy(io.Discard, stdout)
	}
	waitErr := cmd.Wait()
	if waitErr != nil {
		return fmt.Errorf("debian rootfs: %s: %w: %s", filepath.Base(cmd.Path), waitErr, tail([]byte(stderr.String())))
	}
	if importErr != nil {
		return importErr
	}
	log.Info("debian rootfs built", "image", ref, "packages", opts.Packages, "elapsed", time.Since(start))
	return nil
}

type limitedBuilder struct {
	b   *strings.Builder
	max int
}

func (l *limitedBuilder) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

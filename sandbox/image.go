package sandbox

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Image identity inside sandboxes. UID/GID 1000 is the unprivileged user
// every command runs as; /workspace is where task repositories live.
const (
	SandboxUID    = 1000
	SandboxGID    = 1000
	SandboxUser   = "1000:1000"
	Workspace     = "/workspace"
	SandboxHome   = "/home/sandbox"
	AgentPath     = "/usr/local/bin/flywheel-agent"
	sandboxPath   = "/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"
	imageBuildTag = "flywheel-image-v1"
)

// epoch is the modification time of every file in generated tarballs, so the
// same inputs always hash to the same content.
var epoch = time.Unix(1_700_000_000, 0).UTC()

// Image is a locally available sandbox image.
type Image struct {
	// Ref is the tag to create containers from.
	Ref string
	// ContentHash is the hash of everything the image was built from; the
	// tag contains its first 16 hex digits.
	ContentHash string
	// Built is true when this call built the image, false when it was cached.
	Built bool
	// HasAgent is false for a registry image without the in-container agent;
	// such sandboxes fall back to `docker exec`.
	HasAgent bool
}

// BaseImageOptions configures EnsureBaseImage. The zero value is usable.
type BaseImageOptions struct {
	// Repository is the image name; default "flywheel-sandbox/base".
	Repository string
	// Busybox is a static busybox binary; default the first of
	// /usr/bin/busybox and /bin/busybox (Debian: apt-get install busybox-static).
	Busybox string
	// Agent is how to obtain the in-container agent binary; default builds it.
	Agent AgentSource
	// RegistryImage, when set, is used instead of building if it is present
	// locally or can be pulled. It need not contain the agent.
	RegistryImage string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// EnsureBaseImage returns the minimal sandbox image: a static busybox, the
// agent, an unprivileged user and /workspace. It is built locally with no
// registry (a generated root filesystem imported with `docker import`, then
// the agent added as a layer) and cached by content hash, so a second call
// costs one image inspect.
func EnsureBaseImage(ctx context.Context, cli *client.Client, opts BaseImageOptions) (Image, error) {
	log := orDefault(opts.Logger)
	if img, ok := preferRegistry(ctx, cli, opts.RegistryImage, log); ok {
		return img, nil
	}
	repo := opts.Repository
	if repo == "" {
		repo = "flywheel-sandbox/base"
	}
	bb, err := findBusybox(opts.Busybox)
	if err != nil {
		return Image{}, err
	}
	rootfs, err := busyboxRootfs(bb)
	if err != nil {
		return Image{}, err
	}
	sum := sha256.Sum256(rootfs)
	rootHash := hex.EncodeToString(sum[:])
	rootRef := repo + "-rootfs:" + rootHash[:16]
	if err := ensureImported(ctx, cli, rootRef, rootHash, bytes.NewReader(rootfs), log); err != nil {
		return Image{}, err
	}
	agentBin, err := opts.Agent.Load(ctx)
	if err != nil {
		return Image{}, err
	}
	return ensureAgentLayer(ctx, cli, repo, rootRef, rootHash, agentBin, log)
}

func findBusybox(path string) (string, error) {
	candidates := []string{path}
	if path == "" {
		candidates = []string{"/usr/bin/busybox", "/bin/busybox"}
	}
	for _, p := range candidates {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no static busybox at %s (on Debian: apt-get install busybox-static)", strings.Join(candidates, " or "))
}

// busyboxRootfs builds the tarball of a minimal root filesystem around a
// static busybox: one link per applet, passwd/group with the sandbox user,
// and the directories commands expect.
func busyboxRootfs(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("read busybox: %w", err)
	}
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets (is %s a busybox binary?): %w", busybox, err)
	}
	var buf bytes.Buffer
	tw := newTarWriter(&buf)
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "usr/local", "usr/local/bin", "etc", "dev", "proc", "sys", "var", "root"} {
		tw.dir(d, 0o755, 0)
	}
	tw.dir("tmp", 0o1777, 0)
	tw.dir("var/tmp", 0o1777, 0)
	tw.dir("home", 0o755, 0)
	tw.dir(strings.TrimPrefix(SandboxHome, "/"), 0o755, SandboxUID)
	tw.dir(strings.TrimPrefix(Workspace, "/"), 0o755, SandboxUID)
	tw.file("bin/busybox", bin, 0o755, 0)
	for _, applet := range strings.Fields(string(out)) {
		applet = strings.TrimPrefix(applet, "/")
		if applet == "bin/busybox" {
			continue
		}
		tw.symlink(applet, "/bin/busybox")
	}
	tw.file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), 0o644, 0)
	tw.file("etc/group", []byte("root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"), 0o644, 0)
	if err := tw.close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarWriter writes deterministic entries and remembers the first error.
type tarWriter struct {
	tw  *tar.Writer
	err error
}

func newTarWriter(w io.Writer) *tarWriter { return &tarWriter{tw: tar.NewWriter(w)} }

func (t *tarWriter) header(h *tar.Header, body []byte) {
	if t.err != nil {
		return
	}
	h.ModTime, h.Format = epoch, tar.FormatPAX
	if t.err = t.tw.WriteHeader(h); t.err != nil {
		return
	}
	if len(body) > 0 {
		_, t.err = t.tw.Write(body)
	}
}

func (t *tarWriter) dir(name string, mode int64, uid int) {
	t.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid}, nil)
}

func (t *tarWriter) file(name string, body []byte, mode int64, uid int) {
	t.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), Uid: uid, Gid: uid}, body)
}

func (t *tarWriter) symlink(name, target string) {
	t.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

func (t *tarWriter) close() error {
	if t.err != nil {
		return fmt.Errorf("write tar: %w", t.err)
	}
	if err := t.tw.Close(); err != nil {
		return fmt.Errorf("write tar: %w", err)
	}
	return nil
}

// imageExists reports whether ref is present locally.
func imageExists(ctx context.Context, cli *client.Client, ref string) (bool, error) {
	_, err := cli.ImageInspect(ctx, ref)
	if err == nil {
		return true, nil
	}
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	return false, fmt.Errorf("inspect image %s: %w", ref, err)
}

// ensureImported imports a root filesystem tarball as ref unless it exists.
func ensureImported(ctx context.Context, cli *client.Client, ref, hash string, rootfs io.Reader, log *slog.Logger) error {
	ok, err := imageExists(ctx, cli, ref)
	if err != nil || ok {
		return err
	}
	start := time.Now()
	resp, err := cli.ImageImport(ctx, client.ImageImportSource{Source: rootfs, SourceName: "-"}, ref, client.ImageImportOptions{
		Message: "flywheel sandbox rootfs",
		Changes: []string{
			"LABEL " + LabelManaged + "=1 " + LabelKind + "=rootfs " + LabelContentHash + "=" + hash,
		},
	})
	if err != nil {
		return fmt.Errorf("import rootfs %s: %w", ref, err)
	}
	defer resp.Close()
	if err := readJSONStream(resp); err != nil {
		return fmt.Errorf("import rootfs %s: %w", ref, err)
	}
	log.Info("sandbox rootfs imported", "image", ref, "elapsed", time.Since(start))
	return nil
}

// ensureAgentLayer builds FROM base a layer holding the agent and the
// runtime configuration (user, workdir, command), tagged by content hash.
func ensureAgentLayer(ctx context.Context, cli *client.Client, repo, baseRef, baseHash string, agentBin []byte, log *slog.Logger) (Image, error) {
	dockerfile := strings.Join([]string{
		"FROM " + baseRef,
		"COPY --chown=0:0 flywheel-agent " + AgentPath,
		"ENV PATH=" + sandboxPath + " HOME=" + SandboxHome + " LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1",
		"USER " + SandboxUser,
		"WORKDIR " + Workspace,
		`CMD ["` + AgentPath + `"]`,
	}, "\n") + "\n"
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", imageBuildTag, baseHash, dockerfile)
	h.Write(agentBin)
	hash := hex.EncodeToString(h.Sum(nil))
	ref := repo + ":" + hash[:16]
	img := Image{Ref: ref, ContentHash: hash, HasAgent: true}
	ok, err := imageExists(ctx, cli, ref)
	if err != nil || ok {
		return img, err
	}
	var buf bytes.Buffer
	tw := newTarWriter(&buf)
	tw.file("Dockerfile", []byte(dockerfile), 0o644, 0)
	tw.file("flywheel-agent", agentBin, 0o755, 0)
	if err := tw.close(); err != nil {
		return Image{}, err
	}
	start := time.Now()
	if err := buildImage(ctx, cli, &buf, ref, map[string]string{LabelKind: "base", LabelContentHash: hash}); err != nil {
		return Image{}, err
	}
	log.Info("sandbox image built", "image", ref, "elapsed", time.Since(start))
	img.Built = true
	return img, nil
}

// buildImage runs a classic (non-BuildKit) build of a tar context. The build
// runs with network "none": nothing a sandbox image needs comes from outside.
func buildImage(ctx context.Context, cli *client.Client, buildCtx io.Reader, ref string, labels map[string]string) error {
	all := map[string]string{LabelManaged: "1"}
	for k, v := range labels {
		all[k] = v
	}
	resp, err := cli.ImageBuild(ctx, buildCtx, client.ImageBuildOptions{
		Tags:        []string{ref},
		Remove:      true,
		ForceRemove: true,
		NetworkMode: "none",
		Labels:      all,
		Version:     "1",
	})
	if err != nil {
		return fmt.Errorf("build image %s: %w", ref, err)
	}
	defer resp.Body.Close()
	if err := readJSONStream(resp.Body); err != nil {
		return fmt.Errorf("build image %s: %w", ref, err)
	}
	return nil
}

// readJSONStream consumes a daemon progress stream and returns the first
// error message in it; the HTTP status is 200 even when a build fails.
func readJSONStream(r io.Reader) error {
	dec := json.NewDecoder(bufio.NewReader(r))
	var tail []string
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read daemon stream: %w", err)
		}
		if s := strings.TrimSpace(msg.Stream); s != "" {
			tail = append(tail, s)
			if len(tail) > 8 {
				tail = tail[1:]
			}
		}
		if msg.Error != "" || msg.ErrorDetail.Message != "" {
			m := msg.ErrorDetail.Message
			if m == "" {
				m = msg.Error
			}
			return fmt.Errorf("%s (last output: %s)", m, strings.Join(tail, " | "))
		}
	}
}

func orDefault(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.Default()
	}
	return log
}

// preferRegistry returns the configured registry image when it is there or
// can be pulled; otherwise the caller builds locally.
func preferRegistry(ctx context.Context, cli *client.Client, ref string, log *slog.Logger) (Image, bool) {
	if ref == "" {
		return Image{}, false
	}
	img, err := ensureRegistryImage(ctx, cli, ref)
	if err != nil {
		log.Warn("registry image unavailable, building locally", "image", ref, "error", err)
		return Image{}, false
	}
	return img, true
}

// ensureRegistryImage uses a configured image, pulling it if it is not
// present; the daemon may have no registry, in which case this fails fast.
func ensureRegistryImage(ctx context.Context, cli *client.Client, ref string) (Image, error) {
	ok, err := imageExists(ctx, cli, ref)
	if err != nil {
		return Image{}, err
	}
	if !ok {
		pullCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		resp, err := cli.ImagePull(pullCtx, ref, client.ImagePullOptions{})
		if err != nil {
			return Image{}, fmt.Errorf("pull %s: %w", ref, err)
		}
		defer resp.Close()
		if err := readJSONStream(resp); err != nil {
			return Image{}, fmt.Errorf("pull %s: %w", ref, err)
		}
	}
	inspect, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		return Image{}, fmt.Errorf("inspect %s: %w", ref, err)
	}
	hasAgent := false
	if inspect.Config != nil {
		hasAgent = len(inspect.Config.Cmd) > 0 && inspect.Config.Cmd[0] == AgentPath
	}
	return Image{Ref: ref, ContentHash: inspect.ID, HasAgent: hasAgent}, nil
}

// AgentSource says where the in-container agent binary comes from.
type AgentSource struct {
	// Path is a prebuilt static agent binary. Default: $FLYWHEEL_SANDBOX_AGENT,
	// else the agent is built from source with the Go toolchain.
	Path string
	// ModuleDir is the flywheel module to build from; default the module that
	// contains the working directory.
	ModuleDir string
}

const agentPackage = "github.com/flywheel-ai/flywheel/sandbox/agent/cmd/flywheel-agent"

// Load returns the agent binary, building it (CGO_ENABLED=0, static) when no
// prebuilt path is configured. The Go build cache makes repeat builds cheap.
func (a AgentSource) Load(ctx context.Context) ([]byte, error) {
	path := a.Path
	if path == "" {
		path = os.Getenv("FLYWHEEL_SANDBOX_AGENT")
	}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read agent binary: %w", err)
		}
		return b, nil
	}
	dir := a.ModuleDir
	if dir == "" {
		var err error
		if dir, err = findModuleDir(); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp("", "flywheel-agent-")
	if err != nil {
		return nil, fmt.Errorf("build agent: %w", err)
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "flywheel-agent")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, agentPackage)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build agent (set FLYWHEEL_SANDBOX_AGENT to a prebuilt binary to skip): %w: %s", err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("read built agent: %w", err)
	}
	return b, nil
}

// findModuleDir walks up from the working directory to the flywheel go.mod.
func findModuleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/flywheel-ai/flywheel\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("build agent: not inside the flywheel module; set FLYWHEEL_SANDBOX_AGENT to a prebuilt flywheel-agent binary")
		}
		dir = parent
	}
}

package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/flywheel-ai/flywheel/sandbox/agent"
)

// Limits are the cgroup and security limits of every sandbox container.
type Limits struct {
	// CPUs is the CPU quota in cores; default 1.
	CPUs float64
	// MemoryBytes is the memory limit; swap is disabled by setting
	// memory+swap to the same value. Default 512 MiB.
	MemoryBytes int64
	// Pids caps the number of processes and threads (fork bombs); default
	// 256, at least twice the agent's reserved threads.
	Pids int64
	// DiskBytes bounds /workspace. The root filesystem is read-only and
	// everything writable is a tmpfs, because overlay storage has no quota
	// on most engines (fuse-overlayfs, overlay2 off xfs): tmpfs pages count
	// against MemoryBytes, so a sandbox can never fill the host's disk.
	// Default MemoryBytes/2.
	DiskBytes int64
	// ScratchBytes bounds each of /tmp, /var/tmp, the sandbox user's home
	// and /dev/shm; default MemoryBytes/16.
	ScratchBytes int64
}

// scratchMounts are the writable tmpfs mounts besides /workspace; /dev/shm
// is the fourth scratch area (ShmSize).
var scratchMounts = []string{"/tmp", "/var/tmp", SandboxHome}

func (l Limits) withDefaults() Limits {
	if l.CPUs == 0 {
		l.CPUs = 1
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = 512 << 20
	}
	if l.Pids == 0 {
		l.Pids = 256
	}
	if l.DiskBytes == 0 {
		l.DiskBytes = l.MemoryBytes / 2
	}
	if l.ScratchBytes == 0 {
		l.ScratchBytes = l.MemoryBytes / 16
	}
	return l
}

// minPids leaves commands as many pids as the agent's reserved threads.
const minPids = 2 * agent.ReservedThreads

func (l Limits) validate() error {
	switch {
	case l.CPUs < 0.01:
		return fmt.Errorf("sandbox limits: CPUs %.3f below 0.01", l.CPUs)
	case l.MemoryBytes < 6<<20:
		return fmt.Errorf("sandbox limits: MemoryBytes %d below the engine minimum of 6 MiB", l.MemoryBytes)
	case l.Pids < minPids:
		return fmt.Errorf("sandbox limits: Pids %d below %d (the agent holds %d threads of them)", l.Pids, minPids, agent.ReservedThreads)
	case l.DiskBytes < 1<<20 || l.ScratchBytes < 1<<20:
		return fmt.Errorf("sandbox limits: DiskBytes %d and ScratchBytes %d must be at least 1 MiB", l.DiskBytes, l.ScratchBytes)
	case l.DiskBytes+int64(len(scratchMounts)+1)*l.ScratchBytes > l.MemoryBytes:
		// Full storage must end in ENOSPC, not in an OOM kill of whatever
		// runs next.
		return fmt.Errorf("sandbox limits: DiskBytes %d plus 4 × ScratchBytes %d exceed MemoryBytes %d (tmpfs is memory)", l.DiskBytes, l.ScratchBytes, l.MemoryBytes)
	}
	return nil
}

// Config configures a Manager.
type Config struct {
	// Limits for every container; see Limits for defaults.
	Limits Limits
	// Owner identifies this process on the containers it creates, for the
	// janitor. Default: OwnerID().
	Owner string
	// ExecTimeout bounds a command when the request sets none; default 60s.
	ExecTimeout time.Duration
	// MaxOutput caps stdout and stderr of a command each; default 1 MiB.
	MaxOutput int64
	// StartTimeout bounds create+start+agent handshake; default 60s.
	StartTimeout time.Duration
	// ProvisionConcurrency bounds containers being created at once across
	// all pools; default 4.
	ProvisionConcurrency int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) fill() error {
	c.Limits = c.Limits.withDefaults()
	if err := c.Limits.validate(); err != nil {
		return err
	}
	if c.Owner == "" {
		c.Owner = OwnerID()
	}
	if c.ExecTimeout == 0 {
		c.ExecTimeout = 60 * time.Second
	}
	if c.MaxOutput == 0 {
		c.MaxOutput = 1 << 20
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.ProvisionConcurrency == 0 {
		c.ProvisionConcurrency = 4
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.ExecTimeout < 0:
		return errors.New("sandbox config: ExecTimeout is negative")
	case c.MaxOutput < 0:
		return errors.New("sandbox config: MaxOutput is negative")
	case c.ProvisionConcurrency < 0:
		return errors.New("sandbox config: ProvisionConcurrency is negative")
	}
	return nil
}

var ownerOnce = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(nonce[:])
})

// OwnerID is "host/pid/nonce" for this process: the janitor removes a
// container when its owner's process on this host is gone.
func OwnerID() string { return ownerOnce() }

// Manager creates, tracks and removes sandboxes on one Docker engine.
type Manager struct {
	cli *client.Client
	cfg Config
	log *slog.Logger
	sem chan struct{} // provisioning slots

	mu    sync.Mutex
	live  map[string]*Sandbox
	pools map[string]*pool
	trees map[string][]byte // image content hash → tarball of its /workspace
	wg    sync.WaitGroup
	ctx   context.Context // background work; cancelled by Close
	stop  context.CancelFunc
}

// NewManager returns a Manager using cli, which the caller keeps owning.
func NewManager(cli *client.Client, cfg Config) (*Manager, error) {
	if cli == nil {
		return nil, errors.New("sandbox: nil docker client")
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Manager{
		cli: cli, cfg: cfg, log: cfg.Logger,
		sem:  make(chan struct{}, cfg.ProvisionConcurrency),
		live: make(map[string]*Sandbox), pools: make(map[string]*pool), trees: make(map[string][]byte),
		ctx: ctx, stop: stop,
	}, nil
}

// Client returns the Docker client.
func (m *Manager) Client() *client.Client { return m.cli }

// Owner returns the owner id on this manager's containers.
func (m *Manager) Owner() string { return m.cfg.Owner }

// Close stops the pools and removes every sandbox this manager still holds,
// including warm ones.
func (m *Manager) Close(ctx context.Context) error {
	m.stop()
	m.wg.Wait()
	m.mu.Lock()
	var all []*Sandbox
	for _, sb := range m.live {
		all = append(all, sb)
	}
	for _, p := range m.pools {
		all = append(all, p.drain()...)
	}
	m.mu.Unlock()
	var errs []error
	for _, sb := range all {
		if err := m.Release(ctx, sb); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) hostConfig() *container.HostConfig {
	lim := m.cfg.Limits
	pids := lim.Pids
	init := true
	tmpfs := map[string]string{Workspace: tmpfsOptions(lim.DiskBytes, 0o755, SandboxUID)}
	for _, p := range scratchMounts {
		if p == SandboxHome {
			tmpfs[p] = tmpfsOptions(lim.ScratchBytes, 0o755, SandboxUID)
		} else {
			tmpfs[p] = tmpfsOptions(lim.ScratchBytes, 0o1777, 0)
		}
	}
	return &container.HostConfig{
		NetworkMode:    "none",
		Init:           &init,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		IpcMode:        "private",
		ShmSize:        lim.ScratchBytes,
		ReadonlyRootfs: true,
		Tmpfs:          tmpfs,
		LogConfig:      container.LogConfig{Type: "none"},
		Resources: container.Resources{
			NanoCPUs:   int64(lim.CPUs * 1e9),
			Memory:     lim.MemoryBytes,
			MemorySwap: lim.MemoryBytes,
			PidsLimit:  &pids,
		},
	}
}

// Create provisions a new started sandbox from img and connects to its
// agent. Most callers want Acquire, which serves from a warm pool.
func (m *Manager) Create(ctx context.Context, img Image) (*Sandbox, error) {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-m.sem }()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	return m.create(ctx, img)
}

func (m *Manager) create(ctx context.Context, img Image) (*Sandbox, error) {
	cmd := []string{AgentPath}
	agentLabel := "1"
	if !img.HasAgent {
		// No agent in a foreign image: keep the container alive for docker exec.
		cmd = []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"}
		agentLabel = "0"
	}
	cfg := &container.Config{
		Image:       img.Ref,
		Cmd:         cmd,
		User:        SandboxUser,
		WorkingDir:  Workspace,
		OpenStdin:   true,
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Labels: map[string]string{
			LabelManaged: "1", LabelKind: "sandbox", LabelOwner: m.cfg.Owner,
			labelAgent: agentLabel, labelImageHash: img.ContentHash,
		},
	}
	// Not cancelled with ctx: a create the daemon completes after we gave up
	// would leave a container whose id we never learned.
	createCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout)
	created, err := m.cli.ContainerCreate(createCtx, client.ContainerCreateOptions{Config: cfg, HostConfig: m.hostConfig()})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("create sandbox from %s: %w", img.Ref, err)
	}
	if ctx.Err() != nil {
		m.removeContainer(created.ID)
		return nil, fmt.Errorf("create sandbox from %s: %w", img.Ref, ctx.Err())
	}
	sb := &Sandbox{ID: created.ID, Image: img, m: m, Created: time.Now()}
	fail := func(err error) (*Sandbox, error) {
		m.removeContainer(created.ID)
		return nil, err
	}
	// Read before start: once started, the tmpfs hides the image's tree.
	tree, err := m.workspaceTree(ctx, created.ID, img)
	if err != nil {
		return fail(err)
	}
	if img.HasAgent {
		// Attach before start so not a byte of the agent's stream is missed.
		if err := sb.attach(ctx); err != nil {
			return fail(err)
		}
	}
	if _, err := m.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		if sb.conn != nil {
			sb.conn.close()
		}
		return fail(fmt.Errorf("start sandbox %s: %w", short(created.ID), err))
	}
	if sb.conn != nil {
		if _, err := sb.Ping(ctx); err != nil {
			sb.conn.close()
			return fail(fmt.Errorf("sandbox %s agent handshake: %w", short(created.ID), err))
		}
	}
	if err := sb.unpackWorkspace(ctx, tree); err != nil {
		if sb.conn != nil {
			sb.conn.close()
		}
		return fail(err)
	}
	m.track(sb)
	return sb, nil
}

const (
	labelAgent     = "flywheel.sandbox.agent"
	labelImageHash = "flywheel.sandbox.image-hash"
)

func (m *Manager) track(sb *Sandbox) {
	m.mu.Lock()
	m.live[sb.ID] = sb
	m.mu.Unlock()
}

// Get returns the sandbox with this container id. A sandbox created by
// another process (an activity retried on another worker) is re-attached:
// the agent keeps serving on the container's stdin.
func (m *Manager) Get(ctx context.Context, id string) (*Sandbox, error) {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil {
		return sb, nil
	}
	inspect, err := m.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox %s: %w", short(id), ErrNotFound)
		}
		return nil, fmt.Errorf("inspect sandbox %s: %w", short(id), err)
	}
	c := inspect.Container
	if c.Config == nil || c.Config.Labels[LabelManaged] != "1" || c.Config.Labels[LabelKind] != "sandbox" {
		return nil, fmt.Errorf("container %s is not a flywheel sandbox: %w", short(id), ErrNotFound)
	}
	if c.State == nil || !c.State.Running {
		return nil, fmt.Errorf("sandbox %s is not running: %w", short(id), ErrNotFound)
	}
	sb = &Sandbox{ID: c.ID, m: m, Image: Image{Ref: c.Config.Image, ContentHash: c.Config.Labels[labelImageHash], HasAgent: c.Config.Labels[labelAgent] == "1"}}
	if sb.Image.HasAgent {
		if err := sb.attach(ctx); err != nil {
			return nil, err
		}
		if _, err := sb.Ping(ctx); err != nil {
			sb.conn.close()
			return nil, fmt.Errorf("sandbox %s re-attach: %w", short(id), err)
		}
	}
	m.mu.Lock()
	if prev := m.live[c.ID]; prev != nil {
		m.mu.Unlock()
		if sb.conn != nil {
			sb.conn.close()
		}
		return prev, nil
	}
	m.live[c.ID] = sb
	m.mu.Unlock()
	return sb, nil
}

// ErrNotFound is returned for a sandbox id that does not exist (any more).
var ErrNotFound = errors.New("sandbox not found")

// Release gives a sandbox up. One Acquire took from a pool is reset
// (Reset: nothing its user left behind survives) and goes back to the
// pool's ready queue when it has room; any other, and one the reset could
// not make clean, is removed.
func (m *Manager) Release(ctx context.Context, sb *Sandbox) error {
	if sb == nil {
		return nil
	}
	if p := sb.pool; p != nil {
		// Held from a pool: reset and back in its queue, if it has room.
		sb.pool = nil
		if m.recycle(ctx, p, sb) {
			return nil
		}
	}
	m.mu.Lock()
	delete(m.live, sb.ID)
	m.mu.Unlock()
	if sb.conn != nil {
		sb.conn.close()
	}
	if err := removeContainer(ctx, m.cli, sb.ID); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", short(sb.ID), err)
	}
	return nil
}

// ReleaseID removes a sandbox by container id, tracked or not.
func (m *Manager) ReleaseID(ctx context.Context, id string) error {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb == nil {
		sb = &Sandbox{ID: id, m: m}
	}
	return m.Release(ctx, sb)
}

func (m *Manager) removeContainer(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := removeContainer(ctx, m.cli, id); err != nil {
		m.log.Warn("remove failed sandbox", "container", short(id), "error", err)
	}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

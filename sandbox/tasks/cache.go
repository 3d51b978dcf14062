package tasks

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
)

// Images resolves corpus task ids to ready sandbox images, building the
// Debian base and task images on first use and remembering them for the
// life of the process (the engine caches them across processes).
type Images struct {
	Client *client.Client
	// Debian configures the base image; zero is bookworm + python3 + pytest.
	Debian sandbox.DebianImageOptions
	Logger *slog.Logger

	mu     sync.Mutex
	base   *sandbox.Image
	byTask map[string]sandbox.Image
}

// Ensure returns the task and its image.
func (c *Images) Ensure(ctx context.Context, id string) (*Task, sandbox.Image, error) {
	t, err := Find(id)
	if err != nil {
		return nil, sandbox.Image{}, err
	}
	// One build at a time per process: concurrent builds of the same image
	// would only repeat each other's work.
	c.mu.Lock()
	defer c.mu.Unlock()
	if img, ok := c.byTask[id]; ok {
		return t, img, nil
	}
	if c.base == nil {
		opts := c.Debian
		if opts.Logger == nil {
			opts.Logger = c.Logger
		}
		base, err := sandbox.EnsureDebianImage(ctx, c.Client, opts)
		if err != nil {
			return nil, sandbox.Image{}, fmt.Errorf("task %s: base image: %w", id, err)
		}
		c.base = &base
	}
	img, err := EnsureImage(ctx, c.Client, *c.base, t, c.Logger)
	if err != nil {
		return nil, sandbox.Image{}, err
	}
	if c.byTask == nil {
		c.byTask = map[string]sandbox.Image{}
	}
	c.byTask[id] = img
	return t, img, nil
}

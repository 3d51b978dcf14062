package sandbox

import (
	"context"
	"fmt"

	"github.com/moby/moby/client"
)

// Labels put on every container and image this package creates.
const (
	// LabelManaged marks an object as created by this package.
	LabelManaged = "flywheel.sandbox"
	// LabelOwner names the process that created a container, see Owner.
	LabelOwner = "flywheel.sandbox.owner"
	// LabelKind says what an object is: "sandbox", "snapshot", "base".
	LabelKind = "flywheel.sandbox.kind"
	// LabelContentHash is the content hash an image was built from.
	LabelContentHash = "flywheel.sandbox.content-hash"
	// LabelTask names the task a task image was built for.
	LabelTask = "flywheel.sandbox.task"
)

// Connect returns a Docker Engine client for host (docker.host; empty: the
// environment's DOCKER_HOST, or the local socket), with the environment's
// other settings (DOCKER_API_VERSION, DOCKER_CERT_PATH, ...), and
// negotiates the API version now.
//
// The client negotiates lazily on its first request and, if that ping fails,
// silently keeps its own newest version, which an older daemon (20.10 speaks
// 1.41) then rejects with a confusing 400. Pinging here surfaces the real
// cause (daemon down, version too old) at start-up instead.
func Connect(ctx context.Context, host string) (*client.Client, error) {
	opts := []client.Opt{client.FromEnv}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	cli, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true, ForceNegotiate: true}); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("docker ping %s: %w", cli.DaemonHost(), err)
	}
	return cli, nil
}

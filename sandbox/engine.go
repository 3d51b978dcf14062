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

// Connect returns a Docker Engine client configured from the environment
// (DOCKER_HOST, DOCKER_API_VERSION, ...) and negotiates the API version now.
//
// The client negotiates lazily on its first request and, if that ping fails,
// silently keeps its own newest version, which an older daemon (20.10 speaks
// 1.41) then rejects with a confusing 400. Pinging here surfaces the real
// cause (daemon down, version too old) at start-up instead.
func Connect(ctx context.Context) (*client.Client, error) {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true, ForceNegotiate: true}); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("docker ping %s: %w", cli.DaemonHost(), err)
	}
	return cli, nil
}

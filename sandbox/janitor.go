package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/client"
)

// JanitorOptions configures Janitor.
type JanitorOptions struct {
	// MaxAge removes labelled containers and snapshots older than this even
	// when their owner cannot be checked (another host). Default 24h.
	MaxAge time.Duration
	// All removes every labelled container and snapshot except this
	// process's own, whoever owns them (`flywheel sandbox janitor --all`).
	All bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// JanitorReport counts the leftovers a run found and saw gone: removed by
// this run, or by a concurrent sweep that reached them first.
type JanitorReport struct {
	Containers int
	Snapshots  int
}

// Janitor removes sandbox containers and snapshot images left behind by a
// process that died without cleaning up (crash, kill -9). An object is a
// leftover when its owner label names a process on this host that no longer
// exists, or when it is older than MaxAge. Objects of live owners, and
// anything without the LabelManaged label, are never touched. Concurrent
// janitors on one host are safe: an object another sweep is removing, or
// has removed, counts as cleared.
func Janitor(ctx context.Context, cli *client.Client, opts JanitorOptions) (JanitorReport, error) {
	if opts.MaxAge == 0 {
		opts.MaxAge = 24 * time.Hour
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	self := OwnerID()
	host, _ := os.Hostname()
	now := time.Now()
	stale := func(owner string, created time.Time) bool {
		switch {
		case owner == self:
			return false
		case opts.All:
			return true
		case now.Sub(created) > opts.MaxAge:
			return true
		}
		return !ownerAlive(owner, host)
	}

	var rep JanitorReport
	var errs []error
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelManaged+"=1")})
	if err != nil {
		return rep, fmt.Errorf("janitor: list containers: %w", err)
	}
	for _, c := range list.Items {
		if !stale(c.Labels[LabelOwner], time.Unix(c.Created, 0)) {
			continue
		}
		if err := removeContainer(ctx, cli, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("janitor: remove container %s: %w", short(c.ID), err))
			continue
		}
		rep.Containers++
		log.Info("janitor removed sandbox", "container", short(c.ID), "owner", c.Labels[LabelOwner])
	}
	imgs, err := cli.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).Add("label", LabelKind+"=snapshot")})
	if err != nil {
		return rep, errors.Join(append(errs, fmt.Errorf("janitor: list images: %w", err))...)
	}
	for _, img := range imgs.Items {
		if img.Labels[LabelManaged] != "1" || !stale(img.Labels[LabelOwner], time.Unix(img.Created, 0)) {
			continue
		}
		if err := removeImage(ctx, cli, img.ID, true); err != nil {
			errs = append(errs, fmt.Errorf("janitor: remove snapshot %s: %w", short(img.ID), err))
			continue
		}
		rep.Snapshots++
		log.Info("janitor removed snapshot", "image", short(img.ID), "owner", img.Labels[LabelOwner])
	}
	return rep, errors.Join(errs...)
}

// ownerAlive reports whether the "host/pid/nonce" owner may still be running.
// Owners on other hosts cannot be checked and count as alive (MaxAge then
// decides).
func ownerAlive(owner, host string) bool {
	parts := strings.Split(owner, "/")
	if len(parts) != 3 || parts[0] != host {
		return parts[0] != host
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Package sandbox owns Docker Engine sandboxes for SWE rollouts: base images
// built locally with no registry, containers started under strict limits,
// warm pools, fork from a snapshot, fast exec and file I/O through the
// in-container agent (package agent) with `docker exec` as fallback, a
// command policy against reward hacking, and a janitor for leftovers.
//
// A sandbox must never be reachable from the network and never runs as root:
// every container is created with network mode "none", a non-root user, all
// capabilities dropped, no-new-privileges, an init process and cgroup limits.
// Its root filesystem is read-only; all it can write is size-bounded tmpfs
// mounts, because overlay storage has no quota on most engines. The escapes
// tried against these defences, and what holds them, are in docs/sandbox.md.
// Everything this package creates carries the label LabelManaged so that the
// janitor, and only the janitor, can find and remove it after a crash.
package sandbox

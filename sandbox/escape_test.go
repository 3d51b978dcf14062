package sandbox_test

// Escapes tried as an attacker inside a sandbox would try them. Each test
// runs the attack in a real sandbox, asserts that it failed, and where the
// failure could also come from a broken probe, first shows the same probe
// succeeding against a target the sandbox may reach. docs/sandbox.md has the
// table of what is tried and what holds.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

// connectProbe tries a TCP connection with busybox nc and prints CONNECTED
// or FAILED; nc exits 1 only when it cannot connect.
func connectProbe(host string, port int) string {
	return fmt.Sprintf("timeout 3 nc %s %d </dev/null >/dev/null; [ $? = 1 ] && echo FAILED || echo CONNECTED", host, port)
}

// hostListener accepts and counts connections on every host interface.
func hostListener(t *testing.T) (port int, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

// hostIPv4s are the host's own non-loopback addresses, docker0 included.
func hostIPv4s(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	var out []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

func TestEscapeEgressToInternetAndHostServices(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))

	// The probe works: it connects to a listener inside the sandbox.
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Cmd: "nc -ll -p 9000 -e /bin/true >/dev/null 2>&1 &", KeepStrays: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return strings.TrimSpace(string(run(t, sb, connectProbe("127.0.0.1", 9000)).Stdout)) == "CONNECTED"
	}, 5*time.Second, 100*time.Millisecond, "control: nc must connect inside the sandbox: %s", res.Stderr)

	port, accepted := hostListener(t)
	targets := map[string]int{
		"1.1.1.1": 53, "8.8.8.8": 443, // the internet
		"127.0.0.1": port, // a host service on loopback, if loopback were shared
	}
	for _, ip := range hostIPv4s(t) {
		targets[ip] = port // the host through docker0 or its own address
	}
	attacks := []string{}
	for host, p := range targets {
		attacks = append(attacks, host+":"+strconv.Itoa(p))
	}
	// Postgres (README: 55432, or the stock 5432), Temporal and a Docker
	// daemon on TCP, on loopback and on the docker0 gateway.
	for _, p := range []int{55432, 5432, 7233, 2375, 2376} {
		attacks = append(attacks, "127.0.0.1:"+strconv.Itoa(p), "172.17.0.1:"+strconv.Itoa(p))
	}
	for _, a := range attacks {
		host, p, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(p)
		out := strings.TrimSpace(string(run(t, sb, connectProbe(host, n)).Stdout))
		require.Equal(t, "FAILED", out, "the sandbox reached %s", a)
		t.Logf("tried %s: held", a)
	}
	require.Zero(t, accepted.Load(), "a connection from the sandbox reached the host listener")

	res = run(t, sb, "wget -T 3 -q -O /dev/null http://example.com/ 2>&1; echo rc=$?")
	require.NotContains(t, string(res.Stdout), "rc=0", "name resolution and HTTP out: %s", res.Stdout)

	// The engine's socket: not mounted, not anywhere on the filesystem.
	res = run(t, sb, "ls -l /var/run/docker.sock /run/docker.sock 2>&1; find / -path /proc -prune -o -type s -print 2>/dev/null")
	require.NotContains(t, string(res.Stdout), "srw", "a socket file is visible: %s", res.Stdout)
	require.NotContains(t, string(res.Stdout), "docker.sock\n", "%s", res.Stdout)
	require.NotContains(t, string(run(t, sb, "cat /proc/self/mountinfo").Stdout), "docker.sock")
}

func TestEscapeToAnotherSandbox(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	img := baseImage(t, cli)
	a, b := newSandbox(t, m, img), newSandbox(t, m, img)
	ctx := context.Background()

	// A serves a port, runs a marked process and leaves files in every
	// place it can write.
	_, err := a.Exec(ctx, sandbox.ExecRequest{Cmd: "nc -ll -p 4242 -e /bin/true >/dev/null 2>&1 & sleep 4242 >/dev/null 2>&1 &", KeepStrays: true})
	require.NoError(t, err)
	require.Equal(t, 0, run(t, a, "for d in /workspace /tmp /var/tmp /home/sandbox /dev/shm; do echo secret > $d/secret-of-a; done").ExitCode)
	require.Eventually(t, func() bool {
		return strings.TrimSpace(string(run(t, a, connectProbe("127.0.0.1", 4242)).Stdout)) == "CONNECTED"
	}, 5*time.Second, 100*time.Millisecond, "control: A reaches its own port")
	require.Contains(t, string(run(t, a, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").Stdout), "sleep 4242", "control: A sees its own process")

	insA, err := cli.ContainerInspect(ctx, a.ID, client.ContainerInspectOptions{})
	require.NoError(t, err)
	targets := []string{"127.0.0.1"}
	for _, n := range insA.Container.NetworkSettings.Networks {
		if n != nil && n.IPAddress.IsValid() {
			targets = append(targets, n.IPAddress.String())
		}
	}
	for _, host := range targets {
		require.Equal(t, "FAILED", strings.TrimSpace(string(run(t, b, connectProbe(host, 4242)).Stdout)), "B reached A's port at %s", host)
	}
	require.NotContains(t, string(run(t, b, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").Stdout), "sleep 4242", "B sees A's processes")
	res := run(t, b, "cat /workspace/secret-of-a /tmp/secret-of-a /var/tmp/secret-of-a /home/sandbox/secret-of-a /dev/shm/secret-of-a 2>/dev/null; ls /dev/mqueue")
	require.NotContains(t, string(res.Stdout), "secret", "B reads A's files")
}

func TestEscapeByFillingTheDisk(t *testing.T) {
	cli := dockerClient(t)
	const disk, scratch = 64 << 20, 16 << 20
	m := newManager(t, cli, sandbox.Config{Limits: sandbox.Limits{MemoryBytes: 256 << 20, DiskBytes: disk, ScratchBytes: scratch}})
	sb := newSandbox(t, m, baseImage(t, cli))

	bounds := map[string]int64{"/workspace": disk, "/tmp": scratch, "/var/tmp": scratch, "/home/sandbox": scratch, "/dev/shm": scratch}
	for dir, bound := range bounds {
		// Twice the bound, in one file and then in many small ones.
		res := run(t, sb, fmt.Sprintf("dd if=/dev/zero of=%s/fill bs=1M count=%d", dir, 2*bound>>20))
		require.NotEqual(t, 0, res.ExitCode, "dd into %s filled twice its bound", dir)
		require.Contains(t, string(res.Stderr), "No space left on device", dir)
		res = run(t, sb, fmt.Sprintf("i=0; while echo x > %s/f$i 2>/dev/null; do i=$((i+1)); [ $i -gt 100000 ] && break; done; du -sk %s | cut -f1", dir, dir))
		kib, err := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
		require.NoError(t, err, "%s", res.Stdout)
		require.LessOrEqual(t, kib<<10, bound, "%s holds more than its bound", dir)
		t.Logf("tried filling %s: held at %d KiB (bound %d KiB)", dir, kib, bound>>10)
	}
	res := run(t, sb, "dd if=/dev/zero of=/fill bs=1M count=1; dd if=/dev/zero of=/usr/fill bs=1M count=1")
	require.Contains(t, string(res.Stderr), "Read-only file system")

	// Nothing of it reached the engine's disk, and the sandbox still works.
	ins, err := cli.ContainerInspect(context.Background(), sb.ID, client.ContainerInspectOptions{Size: true})
	require.NoError(t, err)
	require.NotNil(t, ins.Container.SizeRw)
	require.Less(t, *ins.Container.SizeRw, int64(1<<20), "bytes on the engine's disk")
	require.Equal(t, "ok\n", string(run(t, sb, "echo ok").Stdout))
	// A fresh sandbox is empty again: the bounds are per sandbox.
	other := newSandbox(t, m, baseImage(t, cli))
	require.Equal(t, "0\n", string(run(t, other, "ls -A /workspace /tmp | grep -c fill").Stdout))
}

func TestEscapeWritingTheRootFilesystem(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))

	for _, p := range []string{"/x", "/usr/x", "/usr/local/bin/x", "/etc/x", "/bin/sh", "/etc/passwd", "/var/x", "/root/x"} {
		res := run(t, sb, "touch "+p)
		require.NotEqual(t, 0, res.ExitCode, "wrote %s", p)
		require.Contains(t, string(res.Stderr), "Read-only file system", "%s: read-only rootfs, not only file modes", p)
	}
	require.Error(t, sb.WriteFile(context.Background(), "/usr/local/bin/flywheel-agent", []byte("#!/bin/sh\n"), 0o755))

	// Every mount point, tried: only the bounded tmpfs mounts (and the IPC
	// namespace's message queues, bounded by RLIMIT_MSGQUEUE) take a file.
	res := run(t, sb, `for d in $(cut -d' ' -f2 /proc/self/mounts | sort -u); do touch "$d/.probe" 2>/dev/null && echo "$d"; rm -f "$d/.probe" 2>/dev/null; done`)
	require.Equal(t, "/dev/mqueue\n/dev/shm\n/home/sandbox\n/tmp\n/var/tmp\n/workspace\n", string(res.Stdout))
	require.Regexp(t, `(?m)^\S+ / \S+ ro[,\s]`, string(run(t, sb, "cat /proc/self/mounts").Stdout))
}

func TestEscapeToRootOrCapabilities(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, pythonImage(t, cli))

	status := string(run(t, sb, "cat /proc/self/status").Stdout)
	for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		require.Regexp(t, c+`:\s+0000000000000000`, status, "even a setuid-root program gets no capability")
	}
	require.Regexp(t, `NoNewPrivs:\s+1`, status)
	require.Regexp(t, `Seccomp:\s+2`, status, "the engine's seccomp filter is on")

	// Debian ships setuid-root programs. Run each that waits on its input
	// and read its effective uid while it waits: 0 would be an escape.
	suid := strings.Fields(string(run(t, sb, "find / -xdev -perm -4000 -type f 2>/dev/null").Stdout))
	require.NotEmpty(t, suid, "the Debian image has setuid programs to try")
	tried := 0
	for _, prog := range []string{"/usr/bin/passwd", "/usr/bin/su", "/usr/bin/chsh"} {
		if !containsString(suid, prog) {
			continue
		}
		res := run(t, sb, fmt.Sprintf(`(sleep 3 | %s >/dev/null 2>&1) & sleep 1
for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = "%s" ] && awk '/^Uid:/ {print $3}' $p/status; done`, prog, prog[strings.LastIndex(prog, "/")+1:]))
		euid := strings.TrimSpace(string(res.Stdout))
		if euid == "" {
			t.Logf("%s exited before it could be inspected", prog)
			continue
		}
		require.Equal(t, "1000", euid, "%s ran with effective uid %s", prog, euid)
		tried++
		t.Logf("tried setuid %s: held, effective uid %s", prog, euid)
	}
	require.Positive(t, tried, "no setuid program could be caught running")
	res := run(t, sb, "su -c id root </dev/null; mount -t tmpfs none /tmp 2>&1; chroot / id 2>&1; unshare -r id 2>&1")
	require.NotContains(t, string(res.Stdout), "uid=0", "became root: %s", res.Stdout)
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestEscapeRunningPastTheTimeLimit(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))
	ctx := context.Background()

	// A command that outlives its limit in three ways: it sleeps, it traps
	// TERM, and it leaves a setsid'd child writing a heartbeat.
	start := time.Now()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{
		Cmd:     "trap '' TERM INT; setsid sh -c 'while :; do date +%s >> /tmp/alive; sleep 0.2; done' >/dev/null 2>&1 & sleep 60",
		Timeout: time.Second,
	})
	require.NoError(t, err)
	require.True(t, res.TimedOut)
	require.Less(t, time.Since(start), 5*time.Second, "the command ran past its limit")

	// The child that left the process group ended with its command: the
	// agent adopts its commands' orphans and ends them at the limit.
	heartbeats := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(string(run(t, sb, "wc -l < /tmp/alive 2>/dev/null || echo 0").Stdout)))
		return n
	}
	after := heartbeats()
	require.Positive(t, after, "control: the child ran until the limit")
	time.Sleep(time.Second)
	require.Equal(t, after, heartbeats(), "the setsid'd child outlived its command's time limit")

	// Control: a command that keeps its strays keeps a setsid'd one, past
	// later commands, until KillStrays.
	_, err = sb.Exec(ctx, sandbox.ExecRequest{Cmd: "setsid sh -c 'while :; do date +%s >> /tmp/kept; sleep 0.2; done' >/dev/null 2>&1 &", KeepStrays: true})
	require.NoError(t, err)
	kept := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(string(run(t, sb, "wc -l < /tmp/kept 2>/dev/null || echo 0").Stdout)))
		return n
	}
	before := kept()
	require.Eventually(t, func() bool { return kept() > before }, 5*time.Second, 100*time.Millisecond, "control: the kept child runs past later commands")
	_, err = sb.KillStrays(ctx)
	require.NoError(t, err)
	stopped := kept()
	time.Sleep(time.Second)
	require.Equal(t, stopped, kept(), "a process outlived KillStrays")

	// The host stops waiting even when the agent does not answer.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = sb.Exec(short, sandbox.ExecRequest{Cmd: "sleep 30", Timeout: time.Minute})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 3*time.Second)
}

func TestEscapeTamperingWithTheAgent(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))

	// What a command may do to another process of the same user: read its
	// environment, list its open files, open its memory (ptrace access).
	const probe = `cat /proc/%[1]s/environ >/dev/null 2>&1 && echo environ; ls /proc/%[1]s/fd >/dev/null 2>&1 && echo fd; ` +
		`dd if=/proc/%[1]s/mem of=/dev/null bs=1 count=1 2>&1 | grep -q 'Permission denied' || echo mem`
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Cmd: "setsid sleep 300 >/dev/null 2>&1 & echo $!", KeepStrays: true})
	require.NoError(t, err)
	sleeper := strings.TrimSpace(string(res.Stdout))
	require.Equal(t, "environ\nfd\nmem\n", string(run(t, sb, fmt.Sprintf(probe, sleeper)).Stdout), "control: a plain process of the user is open")

	agentPID := strings.TrimSpace(string(run(t, sb, `for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "`+sandbox.AgentPath+` " ] && echo ${p#/proc/}; done`).Stdout))
	require.NotEmpty(t, agentPID, "the agent process is found")
	require.Equal(t, sandbox.SandboxUser, strings.Join(strings.Fields(string(run(t, sb, "awk '/^Uid:/ {print $2} /^Gid:/ {print $2}' /proc/"+agentPID+"/status").Stdout)), ":"),
		"the agent shares the commands' uid, so only non-dumpability shields it")
	require.Empty(t, string(run(t, sb, fmt.Sprintf(probe, agentPID)).Stdout), "a command can reach into the agent")
	_, err = sb.Ping(context.Background())
	require.NoError(t, err)
}

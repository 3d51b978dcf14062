package sandbox_test

import (
	"context"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

func TestContainerLimitsAreApplied(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{Limits: sandbox.Limits{CPUs: 0.5, MemoryBytes: 128 << 20, Pids: 64}})
	sb := newSandbox(t, m, baseImage(t, cli))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ins, err := cli.ContainerInspect(ctx, sb.ID, client.ContainerInspectOptions{})
	require.NoError(t, err)
	hc := ins.Container.HostConfig
	require.Equal(t, "none", string(hc.NetworkMode))
	require.Equal(t, []string{"ALL"}, hc.CapDrop)
	require.Contains(t, hc.SecurityOpt, "no-new-privileges")
	require.NotNil(t, hc.Init)
	require.True(t, *hc.Init)
	require.Equal(t, int64(128<<20), hc.Memory)
	require.Equal(t, hc.Memory, hc.MemorySwap, "memory+swap must equal memory: no swap")
	require.Equal(t, int64(64), *hc.PidsLimit)
	require.Equal(t, int64(5e8), hc.NanoCPUs)
	require.Equal(t, sandbox.SandboxUser, ins.Container.Config.User)
}

func TestSandboxIsNonRootWithoutCapabilities(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))

	require.Equal(t, "1000 1000\n", string(run(t, sb, "echo $(id -u) $(id -g)").Stdout))
	status := string(run(t, sb, "cat /proc/self/status").Stdout)
	require.Regexp(t, `CapEff:\s+0000000000000000`, status)
	require.Regexp(t, `NoNewPrivs:\s+1`, status)
	// PID 1 is docker-init, the agent runs under it.
	require.Contains(t, string(run(t, sb, "cat /proc/1/cmdline | tr '\\0' ' '").Stdout), "docker-init")
	res := run(t, sb, "touch /etc/passwd")
	require.NotEqual(t, 0, res.ExitCode, "the sandbox user must not write system files")
}

func TestSandboxHasNoNetwork(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))

	require.Equal(t, "lo\n", string(run(t, sb, "ls /sys/class/net").Stdout))
	// No route at all: only the header line of the routing table.
	require.Equal(t, "1\n", string(run(t, sb, "wc -l < /proc/net/route").Stdout))
}

func TestForkBombIsContained(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{Limits: sandbox.Limits{Pids: 64}})
	sb := newSandbox(t, m, baseImage(t, cli))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "bomb() { bomb | bomb & }; bomb; sleep 60", Timeout: 3 * time.Second})
	require.NoError(t, err)
	require.True(t, res.TimedOut)

	// The pids limit held the bomb, the agent survived it, and killing
	// strays leaves only init and the agent.
	_, err = sb.KillStrays(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out := string(run(t, sb, "ls -d /proc/[0-9]* | wc -l").Stdout)
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		// init, agent, and the shell + ls + wc of this probe.
		return n <= 5
	}, 20*time.Second, 200*time.Millisecond)
}

// TestAgentNeedsNoThreadUnderAFullPidsLimit fills the pids limit with kept
// processes, then blocks the agent in open(2) on eight FIFOs, each request
// holding a thread. The Go runtime aborts when it cannot create a thread it
// wants, so without threads reserved before serving the agent dies here
// (as it did under the fork bomb in CI run 33: "failed to create new OS
// thread").
func TestAgentNeedsNoThreadUnderAFullPidsLimit(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{Limits: sandbox.Limits{Pids: 64}})
	sb := newSandbox(t, m, baseImage(t, cli))
	const fifos = 8
	require.Equal(t, 0, run(t, sb, "cd /tmp && for i in $(seq "+strconv.Itoa(fifos)+"); do mkfifo f$i; done").ExitCode)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A subshell forks sleepers until a fork fails and exits, the pid it
	// frees is taken by one more sleeper, and the command's shell becomes
	// the last: every pid is held.
	filled := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "(for i in $(seq 100); do sleep 300 & done); sleep 300 & exec sleep 300", Timeout: 30 * time.Second})
		filled <- err
	}()
	require.Eventually(t, func() bool {
		n, err := tasks(ctx, sb)
		return err == nil && n == 64
	}, 10*time.Second, 100*time.Millisecond, "the pids limit never filled")
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "true", Timeout: time.Second})
	var agentErr *sandbox.AgentError
	require.ErrorAs(t, err, &agentErr, "no command can start now, but the agent answers")

	type read struct {
		data []byte
		err  error
	}
	reads := make(chan read, fifos)
	for i := range fifos {
		go func() {
			data, _, err := sb.ReadFile(ctx, "/tmp/f"+strconv.Itoa(i+1), 0)
			reads <- read{data, err}
		}()
	}
	time.Sleep(time.Second)
	_, err = sb.Ping(ctx)
	require.NoError(t, err, "the agent died with every pid taken")
	_, err = sb.KillStrays(ctx)
	require.NoError(t, err)
	require.NoError(t, <-filled)
	require.Equal(t, 0, run(t, sb, "cd /tmp && for i in $(seq "+strconv.Itoa(fifos)+"); do echo hi > f$i; done").ExitCode)
	for range fifos {
		r := <-reads
		require.NoError(t, r.err)
		require.Equal(t, "hi\n", string(r.data))
	}
}

// tasks counts the sandbox's threads from /proc without starting a process:
// what its pids limit counts.
func tasks(ctx context.Context, sb *sandbox.Sandbox) (int, error) {
	entries, err := sb.ListFiles(ctx, "/proc", 1)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(path.Base(e.Path)); err != nil || !e.IsDir {
			continue
		}
		status, _, err := sb.ReadFile(ctx, e.Path+"/status", 0)
		if err != nil {
			continue // gone since the listing
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				k, _ := strconv.Atoi(strings.TrimSpace(v))
				n += k
			}
		}
	}
	return n, nil
}

func TestMemoryLimitKillsTheCommandNotTheAgent(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
	sb := newSandbox(t, m, baseImage(t, cli))

	res := run(t, sb, "dd if=/dev/zero of=/dev/null bs=200M count=1")
	require.Equal(t, 137, res.ExitCode, "stderr: %s", res.Stderr)
	// Without the limit the same command succeeds, so 137 above is the limit.
	require.Equal(t, 0, run(t, sb, "dd if=/dev/zero of=/dev/null bs=16M count=1").ExitCode)
	uid, err := sb.Ping(context.Background())
	require.NoError(t, err)
	require.Equal(t, sandbox.SandboxUID, uid)
}

func TestExecTimeoutAndStrayCleanup(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))
	ctx := context.Background()

	start := time.Now()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "echo started; sleep 30", Timeout: time.Second})
	require.NoError(t, err)
	require.True(t, res.TimedOut)
	require.Equal(t, 137, res.ExitCode)
	require.Equal(t, "started\n", string(res.Stdout))
	require.Less(t, time.Since(start), 5*time.Second)

	// A background child dies with its command by default...
	res = run(t, sb, "sleep 300 & echo $!")
	require.Equal(t, 0, res.ExitCode)
	pid := strings.TrimSpace(string(res.Stdout))
	require.Eventually(t, func() bool { return run(t, sb, "test -d /proc/"+pid).ExitCode != 0 }, 5*time.Second, 50*time.Millisecond)

	// ...and one that escaped its process group is found by KillStrays.
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Cmd: "setsid sleep 300 >/dev/null 2>&1 & echo $!", KeepStrays: true})
	require.NoError(t, err)
	pid = strings.TrimSpace(string(res.Stdout))
	require.Equal(t, 0, run(t, sb, "test -d /proc/"+pid).ExitCode)
	killed, err := sb.KillStrays(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, killed, 1)
	require.Eventually(t, func() bool { return run(t, sb, "test -d /proc/"+pid).ExitCode != 0 }, 5*time.Second, 50*time.Millisecond)

	// The host enforces a timeout too, if the agent does not answer.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = sb.Exec(short, sandbox.ExecRequest{Cmd: "sleep 5", Timeout: 10 * time.Second})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestExecOutputIsCapped(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))

	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Cmd: "yes | head -c 5000000", MaxOutput: 1000})
	require.NoError(t, err)
	require.Len(t, res.Stdout, 1000)
	require.Equal(t, int64(5000000), res.StdoutSize)
	require.True(t, res.Truncated)

	dres, err := sb.ExecDocker(context.Background(), sandbox.ExecRequest{Cmd: "yes | head -c 5000000", MaxOutput: 1000})
	require.NoError(t, err)
	require.Len(t, dres.Stdout, 1000)
	require.True(t, dres.Truncated)
}

func TestFilesAndConcurrentExec(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	img := baseImage(t, cli)
	noAgent := img
	noAgent.HasAgent = false
	ctx := context.Background()

	for name, sb := range map[string]*sandbox.Sandbox{"agent": newSandbox(t, m, img), "docker-exec": newSandbox(t, m, noAgent)} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, name == "agent", sb.HasAgent())
			require.NoError(t, sb.WriteFile(ctx, "pkg/a.txt", []byte("hello\n"), 0o644))
			data, size, err := sb.ReadFile(ctx, "/workspace/pkg/a.txt", 0)
			require.NoError(t, err)
			require.Equal(t, "hello\n", string(data))
			require.Equal(t, int64(6), size)
			require.Equal(t, "1000\n", string(run(t, sb, "stat -c %u pkg/a.txt").Stdout))
			entries, err := sb.ListFiles(ctx, ".", 2)
			require.NoError(t, err)
			var paths []string
			for _, e := range entries {
				paths = append(paths, e.Path)
			}
			require.Contains(t, paths, "/workspace/pkg/a.txt")
			_, _, err = sb.ReadFile(ctx, "missing.txt", 0)
			require.Error(t, err)
			require.Error(t, sb.WriteFile(ctx, "/etc/passwd", []byte("x"), 0), "non-root cannot write system files")

			var wg sync.WaitGroup
			for i := range 16 {
				wg.Go(func() {
					res, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "echo " + strconv.Itoa(i)})
					require.NoError(t, err)
					require.Equal(t, strconv.Itoa(i)+"\n", string(res.Stdout))
				})
			}
			wg.Wait()
		})
	}
}

func TestBadInputIsAnErrorNotAPanic(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, baseImage(t, cli))
	ctx := context.Background()
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "  "})
	require.Error(t, err)
	_, _, err = sb.ReadFile(ctx, "", 0)
	require.Error(t, err)
	require.Error(t, sb.WriteFile(ctx, "a\x00b", nil, 0))
	_, err = sandbox.NewManager(cli, sandbox.Config{Limits: sandbox.Limits{MemoryBytes: 1}})
	require.Error(t, err)
	_, err = m.Get(ctx, "does-not-exist")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
}

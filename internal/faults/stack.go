// Package faults runs `flywheel bench faults` and `flywheel bench soak`
// on a private stack (its own Postgres cluster, Temporal dev server and
// `flywheel up`) under a load of OpenAI-protocol clients: one fault at a
// time, counting what the clients were told against what Postgres and
// Temporal hold; or a long run at half capacity, sampling what the
// process and Postgres hold over time.
package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
)

// stack is the private services one run owns; nothing else uses them, so
// stopping them disturbs nobody.
type stack struct {
	dir                   string
	pgBin, pgData, pgPort string
	pgUser                string // "" or the user Postgres runs as when this process is root
	dbURL                 string
	temporalCLI           string
	temporalPort          string
	temporal              *child
	bin                   string
	gatewayAddr           string
	modelAddr             string // up's own model server, which nothing asks
	up                    *child
	upPids                []int // of every up started, whose sandboxes close removes
	// ms is `flywheel model-server` on msAddr: the policy's engine, which
	// up's gateway and workers reach there (--model-server-url), as in
	// docker-compose.yml, so a fault can kill it alone.
	ms     *child
	msAddr string
	key    string
	// trainer is `flywheel worker` on the trainer task queue alone, so a
	// fault can kill the worker that trains without the gateway.
	trainer *child
	// env is added to every child's environment.
	env []string
}

// child is a process the stack started, in its own process group.
type child struct {
	cmd    *exec.Cmd
	log    string
	exited chan error // receives cmd.Wait's answer once
	gone   bool       // exited was received
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// kill SIGKILLs the child's process group, with no drain, and waits
// (nothing for a nil or exited child).
func (c *child) kill() error {
	if c == nil || c.gone {
		return nil
	}
	err := syscall.Kill(-c.pid(), syscall.SIGKILL)
	<-c.exited
	c.gone = true
	return err
}

// stop stops the child as an operator would (SIGTERM, drain), or kills
// it after 30 s.
func (c *child) stop() {
	if c == nil || c.gone {
		return
	}
	_ = syscall.Kill(-c.pid(), syscall.SIGTERM)
	select {
	case <-c.exited:
		c.gone = true
	case <-time.After(30 * time.Second):
		_ = c.kill()
	}
}

// await polls ready until it says yes, the child exits, or limit passes.
func (c *child) await(ctx context.Context, name string, limit time.Duration, ready func() bool) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case err := <-c.exited:
			c.gone = true
			return fmt.Errorf("%s exited: %v (log: %s)", name, err, c.log)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if ready() {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s was not ready in %s (log: %s)", name, limit, c.log)
}

// startStack starts a private Postgres, Temporal dev server and `flywheel
// up` in a new directory under /var/tmp named after prefix. On failure
// what started is stopped again.
func startStack(ctx context.Context, prefix, bin, temporalCLI string, env ...string) (*stack, error) {
	dir, err := os.MkdirTemp("/var/tmp", prefix)
	if err != nil {
		return nil, err
	}
	st := &stack{dir: dir, bin: bin, temporalCLI: temporalCLI, env: env}
	if err := st.startPostgres(ctx); err != nil {
		st.close(false)
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := st.startTemporal(ctx); err != nil {
		st.close(false)
		return nil, fmt.Errorf("temporal: %w", err)
	}
	// The model server needs the schema and up needs the model server.
	if err := run(exec.CommandContext(ctx, bin, "migrate", "--database-url", st.dbURL)); err != nil {
		st.close(false)
		return nil, err
	}
	if err := st.startModelServer(ctx); err != nil {
		st.close(false)
		return nil, err
	}
	if err := st.startUp(ctx); err != nil {
		st.close(false)
		return nil, err
	}
	if err := st.startTrainer(ctx); err != nil {
		st.close(false)
		return nil, err
	}
	return st, nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// pgBinDir finds the newest installed PostgreSQL server binaries.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries under /usr/lib/postgresql (make services installs them)")
}

// pgCmd runs a Postgres tool, as the postgres user when this process is
// root (Postgres refuses to run as root).
func (s *stack) pgCmd(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.pgBin, name)
	if s.pgUser != "" {
		return exec.Command("runuser", append([]string{"-u", s.pgUser, "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func run(cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startPostgres creates and starts a private cluster.
func (s *stack) startPostgres(ctx context.Context) error {
	var err error
	if s.pgBin, err = pgBinDir(); err != nil {
		return err
	}
	if s.pgPort, err = freePort(); err != nil {
		return err
	}
	s.pgData = filepath.Join(s.dir, "postgres")
	if os.Geteuid() == 0 {
		s.pgUser = "postgres"
		u, err := user.Lookup(s.pgUser)
		if err != nil {
			return fmt.Errorf("running as root needs the postgres system user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.MkdirAll(s.pgData, 0o700); err != nil {
			return err
		}
		for _, d := range []string{s.dir, s.pgData} {
			if err := os.Chown(d, uid, gid); err != nil {
				return err
			}
		}
	}
	if err := run(s.pgCmd("initdb", "-D", s.pgData, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8")); err != nil {
		return err
	}
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nmax_connections = 200\nfsync = on\nsynchronous_commit = on\n", s.pgPort, s.pgData)
	f, err := os.OpenFile(filepath.Join(s.pgData, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(conf)
	f.Close()
	if err != nil {
		return err
	}
	if err := s.pgStart(); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+s.pgPort+"/postgres?sslmode=disable")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, q := range []string{"CREATE ROLE flywheel LOGIN CREATEDB", "CREATE DATABASE flywheel OWNER flywheel"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	s.dbURL = "postgres://flywheel@127.0.0.1:" + s.pgPort + "/flywheel?sslmode=disable"
	return nil
}

func (s *stack) pgStart() error {
	return run(s.pgCmd("pg_ctl", "-D", s.pgData, "-l", filepath.Join(s.pgData, "server.log"), "-w", "-t", "60", "start"))
}

// pgCrash stops Postgres as a crash would: no checkpoint, clients cut.
func (s *stack) pgCrash() error {
	return run(s.pgCmd("pg_ctl", "-D", s.pgData, "-m", "immediate", "-w", "stop"))
}

// startTemporal starts (or restarts, on the same port and database file)
// the Temporal dev server, and waits until its namespace answers.
func (s *stack) startTemporal(ctx context.Context) error {
	if s.temporalPort == "" {
		var err error
		if s.temporalPort, err = freePort(); err != nil {
			return err
		}
	}
	uiPort, err := freePort()
	if err != nil {
		return err
	}
	cmd, err := s.spawn("temporal.log", s.temporalCLI, "server", "start-dev", "--ip", "127.0.0.1", "--port", s.temporalPort,
		"--ui-port", uiPort, "--db-filename", filepath.Join(s.dir, "temporal.db"), "--namespace", "flywheel",
		"--log-level", "error", "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal")
	if err != nil {
		return err
	}
	s.temporal = cmd
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		nc, err := client.NewNamespaceClient(client.Options{HostPort: s.temporalAddr(), Logger: quietLogger{}})
		if err == nil {
			_, err = nc.Describe(ctx, "flywheel")
			nc.Close()
			if err == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the Temporal dev server did not come up in 90 s")
}

// spawn starts a child in its own process group (so a kill reaches its
// children too), in the run's directory, appending its output to logName.
func (s *stack) spawn(logName, path string, args ...string) (*child, error) {
	log, err := os.OpenFile(filepath.Join(s.dir, logName), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(path, args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, log: log.Name(), exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	return c, nil
}

func (s *stack) temporalAddr() string { return "127.0.0.1:" + s.temporalPort }

// connect opens a Temporal client and a Postgres connection to the
// stack's services; done closes both.
func (s *stack) connect(ctx context.Context) (c client.Client, conn *pgx.Conn, done func(), err error) {
	if c, err = s.dial(); err != nil {
		return nil, nil, nil, err
	}
	if conn, err = pgx.Connect(ctx, s.dbURL); err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	return c, conn, func() { _ = conn.Close(context.WithoutCancel(ctx)); c.Close() }, nil
}

// dial connects a Temporal client to the stack's dev server.
func (s *stack) dial() (client.Client, error) {
	c, err := client.Dial(client.Options{HostPort: s.temporalAddr(), Namespace: "flywheel", Logger: quietLogger{}})
	if err != nil {
		return nil, fmt.Errorf("temporal: %w", err)
	}
	return c, nil
}

// startUp starts (or restarts) `flywheel up` on the private services and
// waits until the gateway is ready.
func (s *stack) startUp(ctx context.Context) error {
	if s.gatewayAddr == "" {
		gp, err := freePort()
		if err != nil {
			return err
		}
		mp, err := freePort()
		if err != nil {
			return err
		}
		s.gatewayAddr, s.modelAddr = "127.0.0.1:"+gp, "127.0.0.1:"+mp
	}
	// Every queue but the Tinker queue (up adds the SWE queue itself): the
	// worker that drives train steps on up's embedded trainer is its own
	// process, startTrainer's, so that a fault can kill it mid-step.
	queues := strings.Join([]string{flow.TaskQueue, flow.SessionTaskQueue, flow.SandboxTaskQueue}, ",")
	cmd, err := s.spawn("flywheel.log", s.bin, "up", "--data-dir", s.dataDir(), "--database-url", s.dbURL,
		"--temporal-address", s.temporalAddr(), "--gateway-listen", s.gatewayAddr, "--model-server-listen", s.modelAddr,
		"--trainer-listen", "127.0.0.1:0",
		"--model-server-url", s.modelServerURL(), "--worker-task-queues", queues, "--gateway-rate-limit-rps", "0", "--log-level", "warn")
	if err != nil {
		return err
	}
	s.up = cmd
	s.upPids = append(s.upPids, cmd.pid())
	// The first start builds the policy's base.
	return cmd.await(ctx, "flywheel up", 5*time.Minute, func() bool {
		resp, err := http.Get("http://" + s.gatewayAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		key, err := os.ReadFile(filepath.Join(s.dataDir(), "dev-api-key"))
		if resp.StatusCode != http.StatusOK || err != nil || len(key) == 0 {
			return false
		}
		s.key = strings.TrimSpace(string(key))
		return true
	})
}

func (s *stack) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *stack) modelServerURL() string { return "http://" + s.msAddr + "/v1" }

// msgModelServerReady is what `flywheel model-server` logs once it serves
// the versions the routes name.
const msgModelServerReady = "model server ready"

// startModelServer starts (or restarts) `flywheel model-server` on the
// shared data directory and waits until it serves the routed versions.
func (s *stack) startModelServer(ctx context.Context) error {
	if s.msAddr == "" {
		p, err := freePort()
		if err != nil {
			return err
		}
		s.msAddr = "127.0.0.1:" + p
	}
	logPath := filepath.Join(s.dir, "model-server.log")
	var from int64
	if fi, err := os.Stat(logPath); err == nil {
		from = fi.Size() // a restart appends; only its own lines count
	}
	cmd, err := s.spawn(filepath.Base(logPath), s.bin, "model-server", "--data-dir", s.dataDir(), "--database-url", s.dbURL,
		"--model-server-listen", s.msAddr, "--log-level", "info")
	if err != nil {
		return err
	}
	s.ms = cmd
	return cmd.await(ctx, "flywheel model-server", 2*time.Minute, func() bool {
		b, err := os.ReadFile(logPath)
		return err == nil && int64(len(b)) > from && strings.Contains(string(b[from:]), msgModelServerReady)
	})
}

// startTrainer starts (or restarts) `flywheel worker` on the Tinker queue,
// where the policy deployment's train steps go (its trainer is up's
// embedded one), sharing up's data directory (checkpoints, batches), and
// waits until it polls that queue.
func (s *stack) startTrainer(ctx context.Context) error {
	cmd, err := s.spawn("trainer.log", s.bin, "worker", "--data-dir", s.dataDir(), "--database-url", s.dbURL,
		"--temporal-address", s.temporalAddr(), "--model-server-url", s.modelServerURL(),
		"--worker-task-queues", deployment.TinkerQueue, "--log-level", "warn")
	if err != nil {
		return err
	}
	s.trainer = cmd
	c, err := s.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	// The SDK's default identity begins with the process id; pollers of a
	// killed trainer stay listed for a while and must not count.
	identity := strconv.Itoa(cmd.pid()) + "@"
	return cmd.await(ctx, "flywheel worker (trainer)", 2*time.Minute, func() bool {
		resp, err := c.DescribeTaskQueue(ctx, deployment.TinkerQueue, enumspb.TASK_QUEUE_TYPE_ACTIVITY)
		if err != nil {
			return false
		}
		for _, p := range resp.GetPollers() {
			if strings.HasPrefix(p.GetIdentity(), identity) {
				return true
			}
		}
		return false
	})
}

// close stops everything and removes the run's directory (keep: leave it,
// with its logs).
func (s *stack) close(keep bool) {
	if keep && s.up != nil && !s.up.gone {
		// Go's SIGQUIT dump: the kept log ends with every goroutine's stack.
		_ = syscall.Kill(s.up.pid(), syscall.SIGQUIT)
		select {
		case <-s.up.exited:
			s.up.gone = true
		case <-time.After(10 * time.Second):
		}
	}
	for _, c := range []*child{s.trainer, s.up, s.ms} {
		c.stop()
	}
	removeSandboxesOf(s.upPids)
	_ = s.temporal.kill()
	if s.pgData != "" {
		_ = run(s.pgCmd("pg_ctl", "-D", s.pgData, "-m", "fast", "-w", "stop"))
	}
	if !keep {
		_ = os.RemoveAll(s.dir)
	}
}

// quietLogger drops the Temporal client's own logging.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

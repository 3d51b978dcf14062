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
	"go.temporal.io/sdk/client"
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
	temporal              *exec.Cmd
	bin                   string
	gatewayAddr           string
	modelAddr             string
	up                    *exec.Cmd
	upExited              chan error
	key                   string
}

// startStack starts a private Postgres, Temporal dev server and `flywheel
// up` in a new directory under /var/tmp named after prefix. On failure
// what started is stopped again.
func startStack(ctx context.Context, prefix, bin, temporalCLI string) (*stack, error) {
	dir, err := os.MkdirTemp("/var/tmp", prefix)
	if err != nil {
		return nil, err
	}
	st := &stack{dir: dir, bin: bin, temporalCLI: temporalCLI}
	if err := st.startPostgres(ctx); err != nil {
		st.close(false)
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := st.startTemporal(ctx); err != nil {
		st.close(false)
		return nil, fmt.Errorf("temporal: %w", err)
	}
	if err := st.startUp(ctx); err != nil {
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
func (s *stack) spawn(logName, path string, args ...string) (*exec.Cmd, error) {
	log, err := os.OpenFile(filepath.Join(s.dir, logName), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(path, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

func (s *stack) temporalAddr() string { return "127.0.0.1:" + s.temporalPort }

// killTemporal SIGKILLs the Temporal dev server's process group.
func (s *stack) killTemporal() error {
	if s.temporal == nil {
		return nil
	}
	err := syscall.Kill(-s.temporal.Process.Pid, syscall.SIGKILL)
	_ = s.temporal.Wait()
	s.temporal = nil
	return err
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
	cmd, err := s.spawn("flywheel.log", s.bin, "up", "--data-dir", filepath.Join(s.dir, "data"), "--database-url", s.dbURL,
		"--temporal-address", s.temporalAddr(), "--gateway-listen", s.gatewayAddr, "--model-server-listen", s.modelAddr,
		"--gateway-rate-limit-rps", "0", "--log-level", "warn")
	if err != nil {
		return err
	}
	s.up = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Minute) // the first start builds the policy's base
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			s.up = nil
			return fmt.Errorf("flywheel up exited: %v (log: %s)", err, filepath.Join(s.dir, "flywheel.log"))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if resp, err := http.Get("http://" + s.gatewayAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if key, kerr := os.ReadFile(filepath.Join(s.dir, "data", "dev-api-key")); resp.StatusCode == http.StatusOK && kerr == nil && len(key) > 0 {
				s.key = strings.TrimSpace(string(key))
				s.upExited = exited
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("flywheel up was not ready in 5 minutes")
}

// killUp SIGKILLs `flywheel up` (gateway, workers and model server: one
// process), with no drain.
func (s *stack) killUp() error {
	if s.up == nil {
		return nil
	}
	err := syscall.Kill(-s.up.Process.Pid, syscall.SIGKILL)
	<-s.upExited
	s.up = nil
	return err
}

// stopUp stops `flywheel up` as an operator would (SIGTERM, drain).
func (s *stack) stopUp() {
	if s.up == nil {
		return
	}
	_ = syscall.Kill(-s.up.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.upExited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.up.Process.Pid, syscall.SIGKILL)
		<-s.upExited
	}
	s.up = nil
}

// close stops everything and removes the run's directory (keep: leave it,
// with its logs).
func (s *stack) close(keep bool) {
	if keep && s.up != nil {
		// Go's SIGQUIT dump: the kept log ends with every goroutine's stack.
		_ = syscall.Kill(s.up.Process.Pid, syscall.SIGQUIT)
		select {
		case <-s.upExited:
			s.up = nil
		case <-time.After(10 * time.Second):
		}
	}
	s.stopUp()
	_ = s.killTemporal()
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

package agent_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/sandbox/agent"
)

// serve runs a Server over pipes on this host (the agent is plain Go; the
// container only adds isolation) and returns a call function.
func serve(t *testing.T) func(req agent.Request) agent.Response {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &agent.Server{}
	done := make(chan error, 1)
	go func() { done <- s.Serve(inR, outW); outW.Close() }()
	t.Cleanup(func() {
		inW.Close()
		require.NoError(t, <-done)
	})
	var next uint64
	return func(req agent.Request) agent.Response {
		next++
		req.ID = next
		require.NoError(t, agent.WriteFrame(inW, req))
		var resp agent.Response
		require.NoError(t, agent.ReadFrame(outR, &resp))
		require.Equal(t, req.ID, resp.ID)
		return resp
	}
}

func TestServerExecAndFiles(t *testing.T) {
	call := serve(t)
	resp := call(agent.Request{Op: agent.OpExec, Cmd: "echo out; echo err >&2; exit 7"})
	require.Empty(t, resp.Error)
	require.Equal(t, 7, resp.ExitCode)
	require.Equal(t, "out\n", string(resp.Stdout))
	require.Equal(t, "err\n", string(resp.Stderr))

	resp = call(agent.Request{Op: agent.OpExec, Cmd: "sleep 5", TimeoutMS: 100})
	require.True(t, resp.TimedOut)
	require.Equal(t, 137, resp.ExitCode)

	resp = call(agent.Request{Op: agent.OpExec, Cmd: "head -c 100000 /dev/zero", MaxOutput: 10})
	require.Len(t, resp.Stdout, 10)
	require.Equal(t, int64(100000), resp.StdoutSize)
	require.True(t, resp.Truncated)

	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b.txt")
	require.Empty(t, call(agent.Request{Op: agent.OpWriteFile, Path: p, Data: []byte("hi")}).Error)
	resp = call(agent.Request{Op: agent.OpReadFile, Path: p})
	require.Equal(t, "hi", string(resp.Data))
	resp = call(agent.Request{Op: agent.OpListFiles, Path: dir, MaxDepth: 3})
	require.Len(t, resp.Entries, 2)

	// A symlink at the target is replaced, never followed.
	outside := filepath.Join(dir, "outside.txt")
	require.NoError(t, os.WriteFile(outside, []byte("keep"), 0o644))
	link := filepath.Join(dir, "link.txt")
	require.NoError(t, os.Symlink(outside, link))
	require.Empty(t, call(agent.Request{Op: agent.OpWriteFile, Path: link, Data: []byte("new")}).Error)
	b, err := os.ReadFile(outside)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))

	for _, bad := range []agent.Request{
		{Op: "nope"}, {Op: agent.OpExec}, {Op: agent.OpReadFile}, {Op: agent.OpReadFile, Path: dir},
		{Op: agent.OpWriteFile}, {Op: agent.OpReadFile, Path: filepath.Join(dir, "missing")},
	} {
		require.NotEmpty(t, call(bad).Error, "%+v", bad)
	}
	require.Equal(t, agent.ProtocolVersion, call(agent.Request{Op: agent.OpPing}).Version)
}

func TestReadFrameRejectsHugeLength(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], agent.MaxFrameBytes+1)
	var v agent.Request
	require.ErrorIs(t, agent.ReadFrame(bytes.NewReader(hdr[:]), &v), agent.ErrFrameTooLarge)
	require.ErrorIs(t, agent.ReadFrame(bytes.NewReader(nil), &v), io.EOF)
	require.ErrorIs(t, agent.ReadFrame(bytes.NewReader([]byte{0, 0, 0, 5, '{'}), &v), io.ErrUnexpectedEOF)
}

func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	_ = agent.WriteFrame(&buf, agent.Request{ID: 1, Op: agent.OpExec, Cmd: "true", TimeoutMS: 5})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("\x00\x00\x00\x2a{\"id\":3,\"exit_code\":1,\"stdout\":\"aGk=\"}tail"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The agent reads requests; the host reads responses from inside
		// the sandbox, which is no more trusted than the tenant's code.
		checkFrameRoundTrip[agent.Request](t, data)
		checkFrameRoundTrip[agent.Response](t, data)
	})
}

// checkFrameRoundTrip: any input is an error or one frame; never a panic
// or a hang. A frame consumes exactly its header and announced length
// (the next frame on the stream starts right after), and its re-encoding
// is a fixed point.
func checkFrameRoundTrip[T any](t *testing.T, data []byte) {
	t.Helper()
	var v T
	r := bytes.NewReader(data)
	if err := agent.ReadFrame(r, &v); err != nil {
		return
	}
	require.Equal(t, len(data)-4-int(binary.BigEndian.Uint32(data)), r.Len())
	var out bytes.Buffer
	require.NoError(t, agent.WriteFrame(&out, v))
	var again T
	require.NoError(t, agent.ReadFrame(bytes.NewReader(out.Bytes()), &again))
	var out2 bytes.Buffer
	require.NoError(t, agent.WriteFrame(&out2, again))
	require.Equal(t, out.String(), out2.String())
}

func TestServeEndsCleanlyAndWaitsForRequestsInFlight(t *testing.T) {
	var in bytes.Buffer
	require.NoError(t, agent.WriteFrame(&in, agent.Request{ID: 1, Op: agent.OpExec, Cmd: "sleep 0.2; echo late"}))
	var out bytes.Buffer
	start := time.Now()
	require.NoError(t, (&agent.Server{}).Serve(&in, &out))
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	var resp agent.Response
	require.NoError(t, agent.ReadFrame(&out, &resp))
	require.Equal(t, "late\n", string(resp.Stdout))
}

func TestReserveThreadsKeepsThemStarted(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc/self/task to count threads")
	}
	agent.ReserveThreads(48)
	// The runtime keeps idle threads: they are still there afterwards.
	time.Sleep(50 * time.Millisecond)
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(tasks), 48)
}

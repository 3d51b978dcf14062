package proccpu

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestOfCountsEveryThread: CPU burnt on other threads than the main one
// counts (the first field of /proc/PID/schedstat alone would miss it). The
// threads spin until the kernel's own total for the process
// (/proc/self/stat, every thread, in clock ticks) has grown by 200 ms, so
// a loaded machine only makes the test slower.
func TestOfCountsEveryThread(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	before, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	statBefore := statTicks(t)
	var done atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // a thread of its own, kept until the end
			defer runtime.UnlockOSThread()
			for !done.Load() {
			}
		}()
	}
	for statTicks(t)-statBefore < 20 { // 200 ms at USER_HZ 100
		time.Sleep(10 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	after, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < 150*time.Millisecond {
		t.Fatalf("CPU time grew by %v while the kernel counted at least 200 ms", got)
	}
}

// statTicks is this process's user plus system time in clock ticks.
func statTicks(t *testing.T) int64 {
	raw, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/self/stat: %v %v", err1, err2)
	}
	return u + k
}

func TestNamedFindsThisProcessAndNotAStranger(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := Named(string(comm[:len(comm)-1])); !ok || got <= 0 {
		t.Fatalf("Named(%q) = %v, %v; want this process's CPU time", comm, got, ok)
	}
	if _, ok := Named("no-such-" + filepath.Base(t.TempDir())); ok {
		t.Fatal("Named found a process that does not exist")
	}
}

func TestOfAnExitedProcess(t *testing.T) {
	if _, err := Of(1 << 30); err == nil {
		t.Fatal("Of an impossible pid gave no error")
	}
}

package agent

import (
	"runtime"
	"sync"
)

// ReservedThreads is how many OS threads the agent starts before it serves:
// enough for its scheduler (GOMAXPROCS, sysmon, spinning threads) and a
// goroutine blocked in a system call for each of a dozen requests at once.
// A sandbox's pids limit must leave room for them (the manager asks for at
// least twice as many).
const ReservedThreads = 16

// ReserveThreads makes the Go runtime start n OS threads now and keep them.
//
// A pids cgroup limit counts threads as well as processes, and the runtime
// aborts the whole process ("failed to create new OS thread", newosproc)
// when it cannot create a thread it wants. Under a fork bomb held by the
// limit every pid is taken, and a blocking system call (waiting for a
// command's shell, reading /proc to reap strays) makes the scheduler want
// one more thread: the agent would die with its sandbox still full. The
// runtime never ends an idle thread, so threads started while pids are
// free serve every later need up to n, and the agent never has to ask the
// kernel for one while a command holds the limit.
//
// Each goroutine is locked to its own thread until all n are, so n distinct
// threads exist at once; unlocked, they return to the runtime's idle list.
func ReserveThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

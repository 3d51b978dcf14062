package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
)

// Registrar registers workflows and activities on one task queue's worker.
type Registrar func(r tworker.Registry)

// Log messages are constants; everything dynamic is an attribute.
const (
	msgCompute = "compute inventory"
	msgPolling = "worker polling task queue"
	msgStopped = "worker stopped"
)

// Run starts one Temporal worker per task queue in queues, each registered
// by its Registrar, and blocks until ctx is done or a worker fails.
func Run(ctx context.Context, c client.Client, queues map[string]Registrar, logger *slog.Logger) error {
	if len(queues) == 0 {
		return errors.New("worker: no task queues to poll")
	}
	names := make([]string, 0, len(queues))
	for q := range queues {
		names = append(names, q)
	}
	sort.Strings(names)
	var started []tworker.Worker
	defer func() {
		for _, w := range started {
			w.Stop()
		}
		logger.Info(msgStopped, "task_queues", names)
	}()
	for _, q := range names {
		w := tworker.New(c, q, workerOptions)
		queues[q](w)
		if err := w.Start(); err != nil {
			return fmt.Errorf("start worker on task queue %s: %w", q, err)
		}
		started = append(started, w)
		logger.Info(msgPolling, "task_queue", q)
	}
	<-ctx.Done()
	return nil
}

// workerOptions: the SDK's two workflow-task pollers per queue cap a
// queue at a few hundred tasks a second even when the server has more to
// give (a burst of agent sessions), so each queue polls with eight.
var workerOptions = tworker.Options{MaxConcurrentWorkflowTaskPollers: 8, MaxConcurrentActivityTaskPollers: 4}

// LogCompute writes the one line that says whether this worker has a GPU
// or only the CPU, and why (Ping reports the same).
func LogCompute(logger *slog.Logger, inv Inventory) {
	if len(inv.GPUs) > 0 {
		logger.Info(msgCompute, "device", "gpu", "gpus", len(inv.GPUs), "model", inv.GPUs[0].Name,
			"memory_bytes", inv.GPUs[0].MemoryBytes, "driver", inv.DriverVersion)
		return
	}
	logger.Info(msgCompute, "device", "cpu", "cpus", inv.CPUs, "reason", inv.CPUReason)
}

// Package worker runs Flywheel's Temporal worker processes: which task
// queues a process polls and which workflows and activities it registers,
// and what compute it has (GPU inventory through NVML, CPU fallback). It
// holds no business logic.
package worker

import (
	"fmt"
	"runtime"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPU is one device NVML reports.
type GPU struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// ComputeCapability is "major.minor", e.g. "9.0" for Hopper.
	ComputeCapability string `json:"compute_capability"`
}

// Inventory is the compute this process can use.
type Inventory struct {
	GPUs          []GPU  `json:"gpus"`
	DriverVersion string `json:"driver_version,omitempty"`
	CPUs          int    `json:"cpus"`
	// CPUReason says why there is no GPU (no driver, no devices, an NVML
	// error); empty when GPUs were found.
	CPUReason string `json:"cpu_reason,omitempty"`
}

// Compute names what the inventory offers: the first GPU's model or "cpu".
func (inv Inventory) Compute() string {
	if len(inv.GPUs) == 0 {
		return "cpu"
	}
	return fmt.Sprintf("%dx %s", len(inv.GPUs), inv.GPUs[0].Name)
}

// nvmlAPI is the part of NVML the inventory reads; tests substitute a fake
// because CI has no GPU.
type nvmlAPI interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// DetectCompute asks NVML for GPUs and falls back to the CPU when the
// driver library is missing or reports no device. It never fails: a worker
// without a GPU is a normal worker.
func DetectCompute() Inventory { return detect(nvml.New()) }

func detect(lib nvmlAPI) (inv Inventory) {
	inv.CPUs = runtime.NumCPU()
	defer func() {
		// go-nvml resolves symbols lazily; a broken driver install must
		// not take the worker down.
		if r := recover(); r != nil {
			inv.GPUs, inv.CPUReason = nil, fmt.Sprintf("NVML failed: %v", r)
		}
	}()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		inv.CPUReason = "no NVIDIA driver: " + nvml.ErrorString(ret)
		return inv
	}
	defer lib.Shutdown()
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.DriverVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		inv.CPUReason = "NVML device count: " + nvml.ErrorString(ret)
		return inv
	}
	for i := 0; i < n; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g := GPU{Index: i}
		g.Name, _ = dev.GetName()
		g.UUID, _ = dev.GetUUID()
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryBytes = mem.Total
		}
		if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	if len(inv.GPUs) == 0 {
		inv.CPUReason = "NVIDIA driver present but no usable GPU"
	}
	return inv
}

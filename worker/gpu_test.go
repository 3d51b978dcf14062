package worker

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"
)

// fakeNVML plays the NVML library, since CI machines have no GPU.
type fakeNVML struct {
	initRet nvml.Return
	devices []nvml.Device
	panicOn string
}

func (f *fakeNVML) Init() nvml.Return     { return f.initRet }
func (f *fakeNVML) Shutdown() nvml.Return { return nvml.SUCCESS }
func (f *fakeNVML) SystemGetDriverVersion() (string, nvml.Return) {
	return "999.1", nvml.SUCCESS
}
func (f *fakeNVML) DeviceGetCount() (int, nvml.Return) {
	if f.panicOn == "count" {
		panic("symbol lookup failed")
	}
	return len(f.devices), nvml.SUCCESS
}
func (f *fakeNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return f.devices[i], nvml.SUCCESS
}

// fakeDevice answers the handful of device queries the inventory makes; the
// embedded interface panics on anything else.
type fakeDevice struct {
	nvml.Device
	name string
}

func (d fakeDevice) GetName() (string, nvml.Return) { return d.name, nvml.SUCCESS }
func (d fakeDevice) GetUUID() (string, nvml.Return) { return "GPU-" + d.name, nvml.SUCCESS }
func (d fakeDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	return nvml.Memory{Total: 141 << 30}, nvml.SUCCESS
}
func (d fakeDevice) GetCudaComputeCapability() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS }

func TestDetectFallsBackToCPUWithoutDriver(t *testing.T) {
	inv := detect(&fakeNVML{initRet: nvml.ERROR_LIBRARY_NOT_FOUND})
	require.Empty(t, inv.GPUs)
	require.Equal(t, "cpu", inv.Compute())
	require.Contains(t, inv.CPUReason, "no NVIDIA driver")
	require.Positive(t, inv.CPUs)
}

func TestDetectListsGPUs(t *testing.T) {
	inv := detect(&fakeNVML{devices: []nvml.Device{fakeDevice{name: "NVIDIA H200"}, fakeDevice{name: "NVIDIA H200"}}})
	require.Len(t, inv.GPUs, 2)
	require.Equal(t, "999.1", inv.DriverVersion)
	require.Equal(t, GPU{Index: 1, Name: "NVIDIA H200", UUID: "GPU-NVIDIA H200", MemoryBytes: 141 << 30, ComputeCapability: "9.0"}, inv.GPUs[1])
	require.Equal(t, "2x NVIDIA H200", inv.Compute())
	require.Empty(t, inv.CPUReason)
}

func TestDetectSurvivesABrokenDriver(t *testing.T) {
	inv := detect(&fakeNVML{panicOn: "count"})
	require.Empty(t, inv.GPUs)
	require.Contains(t, inv.CPUReason, "NVML failed")
}

func TestDetectNoDevices(t *testing.T) {
	inv := detect(&fakeNVML{})
	require.Equal(t, "cpu", inv.Compute())
	require.Contains(t, inv.CPUReason, "no usable GPU")
}

// TestDetectComputeOnThisMachine runs the real NVML path: on a GPU machine
// it must find the devices, elsewhere it must fall back without failing.
func TestDetectComputeOnThisMachine(t *testing.T) {
	inv := DetectCompute()
	if len(inv.GPUs) == 0 {
		require.NotEmpty(t, inv.CPUReason)
		t.Logf("cpu fallback: %s", inv.CPUReason)
		return
	}
	for _, g := range inv.GPUs {
		require.NotEmpty(t, g.Name)
		require.Positive(t, g.MemoryBytes)
		t.Logf("gpu %d: %s, %d GiB, cc %s", g.Index, g.Name, g.MemoryBytes>>30, g.ComputeCapability)
	}
}

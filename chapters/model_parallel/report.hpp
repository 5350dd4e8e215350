// What the experiment prints beside its timings: the settings and the thread budget, each device's
// memory per model, the measured block costs behind --balance, and the timeline of one pipelined
// step with each device's idle fraction next to GPipe's bubble (K-1)/(M+K-1).
#pragma once
#include <vector>

#include "chapters/model_parallel/experiment.hpp"

namespace d2l::mp {

// The sizes, the devices and, for CPU-backed devices, the threads each one gets: the single-device
// model runs on devices[0] with the per-device count of the multi-device run (DESIGN.md).
void print_settings(const Config& cfg);

// Per device of `devices`: the model's parameter bytes there and the bytes in use now; resets the
// device's peak. memory_after fills in the peaks since then.
std::vector<DeviceMemory> memory_before(const ResNet& model, const std::vector<Device>& devices);
void memory_after(std::vector<DeviceMemory>& mem);
// A table: per model and device, parameters, in use before train() and the peak during it (MB).
void print_memory(const Result& r);

// Each block's measured forward + backward time and the stage it went to.
void print_costs(const PipelineParallelResNet50& model, const std::vector<double>& costs);

// One pipelined training step (forward_backward on a fresh batch) recorded by core/trace and written
// to cfg.trace_file as Chrome-trace JSON; fills r.idle (per stage device) and r.bubble, prints both.
// The step's gradients are discarded.
void trace_step(PipelineParallelResNet50& model, const Config& cfg, Result& r);

}  // namespace d2l::mp

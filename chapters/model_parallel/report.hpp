// What the experiment prints beside its timings: the settings and the thread budget, each device's
// memory per model, the measured block costs behind --balance, and the timeline of one pipelined
// step with each device's idle fraction next to GPipe's bubble (K-1)/(M+K-1).
#pragma once
#include <vector>

#include "chapters/model_parallel/experiment.hpp"

namespace d2l::mp {

// The sizes, the devices and, for CPU-backed devices, the threads each one gets: the single-device
// model runs on devices[0] with the per-device count of the multi-device run (docs/thread-budget.md).
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
// The same step by the two other schedules goes to schedule_trace_path (step.json ->
// step.1f1b.json, ...), each with its idle fractions beside its formula (r.schedule_idle). The
// steps' gradients are discarded.
void trace_step(PipelineParallelResNet50& model, const Config& cfg, Result& r);
std::string schedule_trace_path(const std::string& trace_file, pipeline::Schedule s);

// Peak activation memory per stage device of one training step (forward_backward, no update) for
// each (schedule, checkpoint) of `runs` and each M of `Ms`: M micro-batches of `micro` images
// (batch M * micro, so the activations in flight show), the peak bytes in use during the step minus
// those in use before it (parameters, gradients, the batch). GPipe's grows with M; 1f1b's stays near
// K-s micro-batches' worth on stage s; recomputation keeps only the stage inputs. The model's split
// size, schedule and checkpoint mode are restored and its gradients zeroed afterwards.
std::vector<Result::MemoryPoint> memory_vs_microbatches(PipelineParallelResNet50& model, const Config& cfg, int64_t micro,
                                                        const std::vector<size_t>& Ms,
                                                        const std::vector<std::pair<pipeline::Schedule, pipeline::Checkpoint>>& runs);
// The table of those points (MB per device, and seconds) and memory_vs_microbatches.png (when
// cfg.out_dir is set); returns the plot's error line, "" when drawn or not asked for.
std::string report_memory(const std::vector<Result::MemoryPoint>& points, const PipelineParallelResNet50& model,
                          const Config& cfg, int64_t micro);

}  // namespace d2l::mp

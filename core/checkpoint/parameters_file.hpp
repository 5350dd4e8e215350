// Gluon's net.save_parameters / net.load_parameters, in PyTorch's state_dict layout: one safetensors
// file (core/io/safetensors.hpp) whose tensor names are the block's dotted parameter names from
// collect_params() (`0.weight`, `layer1.0.bn1.running_mean`), the keys of the same model's PyTorch
// state_dict, so `safetensors.torch.load_file(path)` gives a dict PyTorch's load_state_dict takes.
//
// Saving writes device 0's replica (the first device of each parameter; replicas are equal after a
// Trainer step) as F32, running statistics included; the file is written atomically. BatchNorm's
// `num_batches_tracked` is not written: PyTorch's BatchNorm fills in a missing one when loading.
//
// Loading checks the whole file first and changes nothing unless every check passes:
//   - every parameter of the net has a tensor of the same name (missing ones are listed);
//   - every tensor of the file is a parameter of the net (unexpected ones are listed), except
//     PyTorch BatchNorm's `*.num_batches_tracked` (an I64 scalar: it counts batches for a momentum
//     of None, which this project does not have), which is accepted and ignored, and checkpoint
//     entries under "trainer/" and "replica/" (core/checkpoint/checkpoint.hpp), so a checkpoint also loads
//     as parameters;
//   - dtype F32, and the shape the parameter has (both shapes named);
//   - every value finite: a NaN or infinity (a diverged run, a damaged file) is refused, naming the
//     tensor and how many values are bad. (Loaded, it would not even show: ReLU and max-pooling drop
//     NaNs, so such a net can evaluate to a plausible accuracy, and training on it "diverges".)
// A file whose names all carry PyTorch's DataParallel prefix `module.` gets that said, with the fix.
// A parameter whose shape is still deferred (a 0 entry, filled in at the first forward) takes its
// shape from the file, as the first forward would (the known entries must agree). After loading,
// every parameter has one replica per device of `devices` (Gluon's ctx), each holding the file's
// values: parameters on other devices are moved (reset_ctx), uninitialised ones are initialised
// there. Loading consumes no random numbers (the RNG state is the same before and after).
#pragma once
#include <string>
#include <vector>

#include "core/io/safetensors.hpp"
#include "core/nn/block.hpp"

namespace d2l::io {

void save_parameters(const nn::Block& block, const std::string& path);
void load_parameters(nn::Block& block, const std::string& path, const std::vector<Device>& devices = {cpu(0)});

// The pieces, for files that hold parameters and more (checkpoints).

// Every parameter of `params` as an F32 tensor under its name (device 0's replica; waits for it).
std::map<std::string, FileTensor> parameter_tensors(const nn::ParameterDict& params);

// One parameter and the file's values for it, checked and ready to assign.
struct ParameterValues {
  nn::ParameterPtr param;
  const FileTensor* values;  // points into the SafetensorsFile, which must outlive the assignment
};
// Runs every check above against `file` (ParameterError naming `path` and the tensor otherwise);
// changes nothing.
std::vector<ParameterValues> match_parameters(const nn::ParameterDict& params, const SafetensorsFile& file,
                                              const std::string& path);
// ParameterError unless every value of `t` (F32) is finite: "p.safetensors: tensor '0.weight' has 3 of
// 150 values that are not finite (the first, at index 7, is nan): ...".
void check_finite(const FileTensor& t, const std::string& name, const std::string& path);
// Gives each parameter the file's values on every device of `devices`.
void assign_parameters(const std::vector<ParameterValues>& matched, const std::vector<Device>& devices);

}  // namespace d2l::io

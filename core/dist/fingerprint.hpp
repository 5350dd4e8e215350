// What every rank checks at start (README.md "Processes and machines (MPI)"): ranks that disagree on the
// model, its parameters, the batch size or the algorithms would wait forever in a collective of a
// different size or order (pytorch/pytorch#78022). Instead the ranks exchange a fingerprint of their
// configuration first, and a mismatch is one line naming the two ranks and the first difference.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.hpp"

namespace d2l::dist {

// One configuration: named values in a fixed order, e.g. {"model", "lab-cnn"}, {"batch_size", "256"},
// {"param 0.weight", "(20, 1, 3, 3)"}.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

// Every rank's fingerprint is gathered; each is compared with rank 0's. The first rank that differs
// gives, on every rank, CollectiveError "the ranks disagree: rank 1 has batch_size 64, rank 0 has 32"
// (or "rank 1 has no 'x'", or a field rank 0 lacks). A world of one: nothing to check.
void check_same_config(const Fingerprint& mine);

// Whether every rank holds the same bits in `tensors` (after broadcasting the initial parameters):
// CollectiveError "rank r's parameters differ from rank 0's after the broadcast (what)" otherwise.
void check_same_bits(const std::vector<Tensor>& tensors, const std::string& what);

// The pieces a fingerprint is made of.
std::string shape_text(const Shape& s);

}  // namespace d2l::dist

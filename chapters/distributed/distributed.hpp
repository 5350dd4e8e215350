// Chapter 4: distributed data parallelism over processes (d2l "Parameter Servers": ring
// synchronization, multi-machine training, key-value stores; and today's practice, PyTorch DDP's
// bucketed allreduce overlapped with backward). Run under mpirun, one process per rank; each part is
// a subcommand and `distributed` alone runs all four:
//   bandwidth    the collectives benchmark: algbw and busbw by message size for the book's naive
//                reduce-to-one-then-broadcast, our ring and the library's allreduce
//   ddp          DDP's buckets on chapter 2's ResNet-18: per-parameter and one flat allreduce after
//                backward against buckets of 1, 5, 25, 100 MB launched during backward, and 25 MB ones
//                summed in bfloat16 (DDP's bf16_compress_hook); step time (mean +- std), the bytes
//                handed to the allreduce, and the fraction of communication hidden behind backward (from the trace)
//   equivalence  N processes x k devices == one process x N*k devices: the largest parameter difference
//   kv           the section's key-value store: kv.init, kv.push, kv.pull across the processes
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dist/collectives.hpp"
#include "core/trace.hpp"

namespace d2l::distributed {

// Every default of the chapter, in one place (main.cpp's flags start from these; --quick shrinks them).
struct Config {
  std::vector<Device> devices{cpu(0)};     // this process's devices
  std::string out_dir = ".";               // bandwidth.png, ddp_step_time.png ('' for none)
  std::string trace_file;                  // one timeline for all ranks ('' for none)
  uint64_t seed = 0;
  // bandwidth: message sizes in bytes, and how long each (size, algorithm) is repeated.
  std::vector<double> sizes{4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6, 64e6};
  double seconds_per_point = 0.2;
  // ddp: ResNet-18 (10 classes) on generated 1 x image x image images, `batch` per rank.
  int64_t batch = 16;
  int64_t image = 28;
  int warmup = 2, repeats = 4;              // steps: warm-up (buckets built, hooks armed), then timed
  std::vector<double> bucket_mbs{1, 5, 25, 100};
  double bucket_mb = 25;                    // the bucket size of the traced step and of equivalence
  DType comm_type = DType::f32;             // the buckets' type on the wire: DDP's comm hooks (--comm-hook)
  // The modelled link between the ranks (core/dist/collectives.hpp): chosen so that a CPU's ResNet-18
  // step and the allreduce of its 45 MB of gradients take comparable time; see the README.
  dist::LinkModel link{0.5, 5000};
  bool measure_without_model = true;        // also time every variant on the real transport
  // equivalence: steps of chapter 2's ResNet-18 on small generated images.
  int equivalence_steps = 3;
  // --precision bf16 / fp16: ddp's and equivalence's steps under Autocast (fp16 with a GradScaler)
  DType autocast = DType::f32;
  bool verbose = true;                      // rank 0 prints
};

// --quick: tiny sizes for tests (seconds).
void make_quick(Config& cfg);

// The largest of every rank's x (a collective: every rank calls it and gets the same value).
double max_over_ranks(double x);

// ---- 1. ring synchronization: the collectives benchmark (bandwidth.cpp)
struct BandwidthRow {
  double bytes = 0;
  std::string algorithm;         // naive, ring, library
  double seconds = 0;            // one allreduce, the slowest rank's mean
  double algbw = 0, busbw = 0;   // GB/s: bytes / seconds, and algbw * 2(W-1)/W (nccl-tests' busbw)
};
std::vector<BandwidthRow> bandwidth(const Config& cfg);
// The smallest size (rows in ascending size) at which an algorithm's busbw reaches half its peak:
// below it the allreduce is latency-bound. 0 when there are no rows for the algorithm.
double latency_bound_below(const std::vector<BandwidthRow>& rows, const std::string& algorithm);

// ---- 2. the DDP experiment (ddp.cpp)
struct Variant {
  std::string name;             // "per parameter, after backward", "buckets 25 MB", ...
  double bucket_mb = 0;
  bool overlap = false;
  DType comm_type = DType::f32; // the buckets' type on the wire (bf16: DDP's bf16_compress_hook)
  size_t buckets = 0;           // how many buckets ResNet-18's parameters make
  std::vector<double> step_seconds;  // per timed step, the slowest rank's
  double mean = 0, std = 0;
  double comm_seconds = 0;      // the traced step's communication (rank 0)
  double allreduce_bytes = 0;   // what the traced step handed to the allreduce (the collective counters)
  double hidden = 0;            // the fraction of it during which the device ran backward kernels
};
// Every variant, under the link model when `model` is true, on the real transport otherwise. The
// traced step of the cfg.bucket_mb variant is kept in `trace_events` (this rank's) when given.
std::vector<Variant> ddp(const Config& cfg, bool model, std::vector<trace::Record>* trace_events = nullptr);
// The fraction of the comm lane's bucket tasks ("bucket ...") that overlaps the device's compute tasks
// labelled "backward", and the bucket tasks' total time in seconds.
std::pair<double, double> hidden_fraction(const std::vector<trace::Record>& events, Device device);

// ---- 3. equivalence (equivalence.cpp): the largest |difference| of any parameter after the steps,
// and the largest parameter magnitude (for a relative figure). Every rank returns the same.
std::pair<double, double> equivalence(const Config& cfg);

// ---- 4. the key-value store (kv.hpp holds the class); the walk-through the README follows.
void kv_walkthrough(const Config& cfg);


}  // namespace d2l::distributed

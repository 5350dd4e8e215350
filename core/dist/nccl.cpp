#include "core/dist/nccl.hpp"

#include "core/device.hpp"

#ifdef D2L_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <unistd.h>

#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/gpu/cuda_layer.hpp"
#include "core/runtime.hpp"
#include "core/stream.hpp"
#endif

namespace d2l::dist::nccl {

#ifdef D2L_WITH_NCCL

namespace {

void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) throw DeviceError(std::string(call) + " failed: " + ncclGetErrorString(r));
}

struct Communicator {
  Device device;
  ncclComm_t comm = nullptr;
  void* cuda_stream = nullptr;    // cudaStream_t of the communication stream
  std::unique_ptr<Stream> stream;  // its worker: queues NCCL calls, fences on the CUDA stream
};

std::mutex g_mu;
std::unique_ptr<Communicator> g_comm;

// "" when every rank's GPU is a physical GPU of its own; else the line naming two ranks that share
// one. A gather over MPI: every rank calls it in its first GPU collective.
std::string shared_gpu_of(Device d) {
  const int physical = runtime(d).physical;
  char bus[64] = "?";
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, physical) != cudaSuccess) cudaGetLastError();
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  // "host|bus id|gpu(i)|physical": the first two identify the physical GPU.
  const std::vector<std::string> all =
      gather_strings(std::string(host) + "|" + bus + "|" + d.str() + "|" + std::to_string(physical));
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b) {
      auto key = [](const std::string& s) { return s.substr(0, s.find('|', s.find('|') + 1)); };
      if (key(all[a]) != key(all[b])) continue;
      auto field = [](const std::string& s, int i) {
        size_t p = 0;
        for (int k = 0; k < i; ++k) p = s.find('|', p) + 1;
        return s.substr(p, s.find('|', p) - p);
      };
      return "NCCL cannot put two ranks on one GPU: rank " + std::to_string(a) + "'s " + field(all[a], 2) + " and rank " +
             std::to_string(b) + "'s " + field(all[b], 2) + " are both physical GPU " + field(all[a], 3) + " of " +
             field(all[a], 0);
    }
  return "";
}

// Once a process, on every rank together: "" or the reason NCCL cannot run this world.
std::string shared_gpu_once(Device d) {
  static std::once_flag once;
  static std::string why;
  std::call_once(once, [&] { why = shared_gpu_of(d); });
  return why;
}

Communicator& communicator(Device d) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_comm) {
    if (g_comm->device != d)
      throw ConfigError("NCCL collectives of this process run on " + g_comm->device.str() + "; " + d.str() +
                        " cannot join them (one GPU per process crosses processes: sum the local GPUs first)");
    return *g_comm;
  }
  if (std::string why = shared_gpu_once(d); !why.empty())
    throw ConfigError(why + "; use kvstore device/ring or staged MPI");
  ncclUniqueId id{};
  if (rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  broadcast_bytes(&id, sizeof id, 0);  // over MPI, on the communication thread
  auto c = std::make_unique<Communicator>();
  c->device = d;
  const int gpu = runtime(d).physical;
  c->cuda_stream = cuda_layer::stream_create(gpu);
  void* s = c->cuda_stream;
  c->stream = std::make_unique<Stream>(d.str() + " comm", StreamHooks{[gpu] { cuda_layer::set_device(gpu); },
                                                                      [gpu, s] { cuda_layer::stream_synchronize(gpu, s); }});
  ncclComm_t* out = &c->comm;
  const int W = world_size(), r = rank();
  c->stream->enqueue("ncclCommInitRank", [out, W, id, r] { check(ncclCommInitRank(out, W, id, r), "ncclCommInitRank"); });
  c->stream->synchronize();
  add_comm_stream(c->stream.get());
  g_comm = std::move(c);
  return *g_comm;
}

// fn queued on the communication stream after the tensors' compute streams reach this point.
void on_nccl(const char* op, const std::vector<Tensor>& tensors, std::function<void(ncclComm_t, cudaStream_t)> fn,
             Event* done_out = nullptr) {
  for (auto& t : tensors)
    if (t.device() != tensors[0].device())
      throw ConfigError(std::string("dist::") + op + ": the tensors must be on one GPU");
  Communicator& c = communicator(tensors[0].device());
  std::vector<std::shared_ptr<Storage>> keep;
  Event ready;
  runtime(c.device).compute.record(ready);
  c.stream->wait(ready);
  for (auto& t : tensors) keep.push_back(t.storage());
  ncclComm_t comm = c.comm;
  auto stream = static_cast<cudaStream_t>(c.cuda_stream);
  c.stream->enqueue(op, [keep = std::move(keep), fn = std::move(fn), comm, stream] { fn(comm, stream); });
  Event done;
  c.stream->record(done);
  if (done_out) *done_out = done;
  else runtime(c.device).compute.wait(done);
}

}  // namespace

bool built() { return true; }

bool usable(Device d) {
  if (world_size() == 1 || d.kind != DeviceKind::gpu) return true;
  const std::string why = shared_gpu_once(d);
  if (why.empty()) return true;
  static std::once_flag told;
  std::call_once(told, [&] {
    if (rank() == 0) std::cout << "note: " << why << "; GPU collectives are staged through host memory (MPI) instead\n";
  });
  return false;
}

void allreduce(const Tensor& t, Event* done) {
  const bool f32 = t.dtype() == DType::f32;
  void* p = f32 ? static_cast<void*>(t.data()) : static_cast<void*>(t.data16());
  const ncclDataType_t type = f32 ? ncclFloat : t.dtype() == DType::bf16 ? ncclBfloat16 : ncclHalf;
  const size_t n = static_cast<size_t>(t.numel());
  on_nccl("ncclAllReduce", {t}, [p, n, type](ncclComm_t comm, cudaStream_t s) {
    check(ncclAllReduce(p, p, n, type, ncclSum, comm, s), "ncclAllReduce");
  }, done);
}

void broadcast(const Tensor& t, int root) {
  float* p = t.data();
  const size_t n = static_cast<size_t>(t.numel());
  on_nccl("ncclBroadcast", {t}, [p, n, root](ncclComm_t comm, cudaStream_t s) {
    check(ncclBroadcast(p, p, n, ncclFloat, root, comm, s), "ncclBroadcast");
  });
}

// NCCL's allgather and reduce-scatter want equal chunks; ours differ by one, so each chunk is its
// own broadcast (or reduce) from (to) its owner, the calls grouped into one launch.
void allgather(const Tensor& in, const Tensor& out) {
  const float* src = in.data();
  float* dst = out.data();
  const int64_t n = out.numel();
  on_nccl("ncclAllGather", {in, out}, [src, dst, n](ncclComm_t comm, cudaStream_t s) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (int c = 0; c < world_size(); ++c) {
      const int64_t b = chunk_begin(n, c), len = chunk_begin(n, c + 1) - b;
      check(ncclBroadcast(c == rank() ? src : dst + b, dst + b, static_cast<size_t>(len), ncclFloat, c, comm, s),
            "ncclBroadcast");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  });
}

void reduce_scatter(const Tensor& in, const Tensor& out) {
  const float* src = in.data();
  float* dst = out.data();
  const int64_t n = in.numel();
  on_nccl("ncclReduceScatter", {in, out}, [src, dst, n](ncclComm_t comm, cudaStream_t s) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (int c = 0; c < world_size(); ++c) {  // recvbuff is used on the root only
      const int64_t b = chunk_begin(n, c), len = chunk_begin(n, c + 1) - b;
      check(ncclReduce(src + b, dst, static_cast<size_t>(len), ncclFloat, ncclSum, c, comm, s), "ncclReduce");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  });
}

#else

namespace {
[[noreturn]] void none() { throw ConfigError("this build has no NCCL (it needs nvcc, MPI and the CUDA toolkit's NCCL)"); }
}  // namespace

bool built() { return false; }
bool usable(Device) { return false; }
void allreduce(const Tensor&, Event*) { none(); }
void broadcast(const Tensor&, int) { none(); }
void allgather(const Tensor&, const Tensor&) { none(); }
void reduce_scatter(const Tensor&, const Tensor&) { none(); }

#endif

}  // namespace d2l::dist::nccl

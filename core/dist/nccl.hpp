// GPU tensors across processes (README.md "Processes and machines (MPI)"): NCCL, in a build with nvcc,
// MPI and the toolkit's NCCL (nccl.h, libnccl). core/dist/collectives.cpp sends gpu(i) tensors here.
// Each process has one communicator, on the first GPU it uses in a collective (typically its
// gpu(local_rank) or gpu(0)), made by ncclCommInitRank from an ncclUniqueId that rank 0 creates
// and broadcasts over MPI. That GPU gets a communication stream (a CUDA stream behind a stream of
// its own): a collective waits for an event of the tensor's compute stream, is queued there, and
// the compute stream waits for it. The host thread only enqueues.
#pragma once
#include "core/stream.hpp"
#include "core/tensor.hpp"

namespace d2l::dist::nccl {

bool built();  // false: these throw ConfigError, and collectives.cpp stages GPU tensors through host memory
// NCCL cannot put two ranks on one physical GPU, which logical GPUs (core/device.hpp) make possible:
// two processes whose GPUs are logical devices of one GPU (D2L_LOGICAL_GPUS=2, gpu(local_rank)).
// usable(d): built(), and no two ranks' GPUs (each rank's `d`) are one physical GPU. Asked of every
// rank together, once (its first GPU collective: a gather over MPI); when they share one, rank 0
// says once "note: NCCL cannot put two ranks on one GPU: ...; GPU collectives are staged through
// host memory (MPI) instead" and collectives.cpp takes that path. The collectives below refuse such
// a world with that one line (a ConfigError) rather than hang in ncclCommInitRank.
bool usable(Device d);
// ncclAllReduce, sum (float32, bfloat16 or float16). With `done`: the compute stream does not wait; *done marks the end (async).
void allreduce(const Tensor& t, Event* done = nullptr);
void broadcast(const Tensor& t, int root);                   // ncclBroadcast
void allgather(const Tensor& in, const Tensor& out);         // grouped ncclBroadcast, one per chunk
void reduce_scatter(const Tensor& in, const Tensor& out);    // grouped ncclReduce, one per chunk

}  // namespace d2l::dist::nccl

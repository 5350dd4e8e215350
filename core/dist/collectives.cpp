#include "core/dist/collectives.hpp"

#include <chrono>
#include <climits>
#include <cmath>
#include <mutex>
#include <thread>
#include <cstring>
#include <functional>

#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/group.hpp"
#include "core/dist/nccl.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "kernels/cpu/float16.hpp"

#ifdef D2L_WITH_MPI
#include <mpi.h>
#endif

namespace d2l::dist {

namespace {

void check_f32(const char* op, const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::f32) throw ShapeError(std::string("dist::") + op + ": expects a float32 tensor");
}

// allreduce's tensors: float32, or bfloat16 and float16 (DDP's compression hooks, core/dist/buckets.hpp).
void check_float(const char* op, const Tensor& t) {
  if (!t.defined() || !is_float(t.dtype()))
    throw ShapeError(std::string("dist::") + op + ": expects a float32, bfloat16 or float16 tensor");
}

bool on_gpu(const Tensor& t) { return t.device().kind == DeviceKind::gpu; }

// A GPU tensor without NCCL (or for our ring): the collective runs on a host copy in cpu(0)'s
// memory, and the result is copied back; all of it stream-ordered.
template <typename F>
void via_host(const Tensor& t, F collective) {
  Tensor h = t.to(cpu(0));
  collective(h);
  h.copyto(t);
}

int count_of(const char* op, int64_t n) {
  if (n > INT_MAX) throw ShapeError(std::string("dist::") + op + ": " + std::to_string(n) + " elements is more than MPI's count (2^31 - 1)");
  return static_cast<int>(n);
}

// Runs fn on the communication thread once the compute streams of `tensors` reach this point; their
// compute streams wait for it to finish. The tasks keep the tensors' storage alive.
// With done_out: the compute streams do not wait; *done_out marks the end of the task.
void on_comm(const char* op, const std::vector<Tensor>& tensors, std::function<void()> fn, Event* done_out = nullptr) {
  init();
  Stream& c = comm();
  std::vector<std::shared_ptr<Storage>> keep;
  for (auto& t : tensors) {
    Event ready;
    runtime(t.device()).compute.record(ready);
    c.wait(ready);
    keep.push_back(t.storage());
  }
  c.enqueue(op, [keep = std::move(keep), fn = std::move(fn)] { fn(); });
  Event done;
  c.record(done);
  if (done_out) *done_out = done;
  else
    for (auto& t : tensors) runtime(t.device()).compute.wait(done);
}

std::mutex g_link_mu;
LinkModel g_link;

// The counters of collectives.hpp: one set per process, from whichever thread calls.
std::mutex g_count_mu;
CollectiveCounters g_counts;

// Rank r's chunk of n elements among W ranks (chunk_begin's split, for any group).
int64_t chunk_in(int64_t n, int W, int r) { return n * (r + 1) / W - n * r / W; }

// One call, `input` elements handed to it and `sent` elements leaving this rank (the rule in
// collectives.hpp), each element `size` bytes.
void count(CollectiveCounter CollectiveCounters::*kind, int64_t input, int64_t sent, int64_t size = 4) {
  std::lock_guard<std::mutex> lock(g_count_mu);
  CollectiveCounter& c = g_counts.*kind;
  ++c.calls;
  c.input_bytes += size * input;
  c.sent_bytes += size * sent;
}

// An allreduce of n elements of `size` bytes among W ranks, this rank r: a reduce-scatter, then an
// all-gather of its chunk.
void count_allreduce(int64_t n, int W, int r, int64_t size) {
  const int64_t c = chunk_in(n, W, r);
  count(&CollectiveCounters::allreduce, n, (n - c) + c * (W - 1), size);
}

#ifdef D2L_WITH_MPI
// Runs a collective over W ranks, then (with a link model) sleeps out what the model says it would have taken.
void modeled(double bytes, const std::string& algorithm, int W, const std::function<void()>& collective) {
  const LinkModel m = link_model();
  const auto start = std::chrono::steady_clock::now();
  collective();
  if (!m.on()) return;
  const double s = modeled_allreduce_seconds(m, bytes, algorithm, W);
  std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                            std::chrono::duration<double>(s)));
}
#endif

#ifdef D2L_WITH_MPI
void wait(MPI_Request& r) { wait_request(&r); }

// A group's communicator (core/dist/group.hpp); the group has more than one rank.
MPI_Comm comm_of(const Group& g) { return *static_cast<const MPI_Comm*>(g.native()); }

// How an allreduce's elements travel and add. float32: MPI_FLOAT and +. A 16-bit format: its bits as
// MPI_UINT16_T, each addition widened to float32 (exact), added, and rounded back to nearest even, as
// NCCL sums bfloat16 and float16.
struct SumF32 {
  using T = float;
  static MPI_Datatype type() { return MPI_FLOAT; }
  static float add(float a, float b) { return a + b; }
  static MPI_Op op() { return MPI_SUM; }
};
template <kernels::cpu::Float16 F>
struct Sum16 {
  using T = uint16_t;
  static MPI_Datatype type() { return MPI_UINT16_T; }
  static uint16_t add(uint16_t a, uint16_t b) {
    using namespace kernels::cpu;
    const float s = widen(F, a) + widen(F, b);
    return F == Float16::bf16 ? bf16_from_float(s) : f16_from_float(s);
  }
  // MPI_Allreduce's operation on these bits (MPI_Op_create's signature): inout[i] = in[i] + inout[i].
  static void mpi_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const uint16_t* a = static_cast<const uint16_t*>(in);
    uint16_t* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = add(a[i], b[i]);
  }
  // Made once, on the communication thread (the only one that calls MPI); commutative.
  static MPI_Op op() {
    static const MPI_Op made = [] {
      MPI_Op o;
      MPI_Op_create(&mpi_sum, 1, &o);
      return o;
    }();
    return made;
  }
};

// The ring on n elements at p, on the communication thread: this rank is r of the W ranks of `comm`.
template <class S>
void ring_allreduce(typename S::T* p, int64_t n, MPI_Comm comm, int W, int r) {
  using T = typename S::T;
  const int next = (r + 1) % W, prev = (r + W - 1) % W;
  // The receive buffer is kept between calls (only this thread uses it): no page faults per call.
  static std::vector<T> recv;
  if (recv.size() < static_cast<size_t>(n / W + 1)) recv.resize(static_cast<size_t>(n / W + 1));
  auto begin = [&](int c) { return n * (((c % W) + W) % W) / W; };
  auto len = [&](int c) { c = ((c % W) + W) % W; return n * (c + 1) / W - n * c / W; };
  // Reduce-scatter: at step s rank r sends chunk r-s to r+1 and adds chunk r-s-1 from r-1 to its own.
  for (int s = 0; s < W - 1; ++s) {
    const int cs = r - s, cr = r - s - 1;
    MPI_Request q[2];
    MPI_Irecv(recv.data(), static_cast<int>(len(cr)), S::type(), prev, s, comm, &q[0]);
    MPI_Isend(p + begin(cs), static_cast<int>(len(cs)), S::type(), next, s, comm, &q[1]);
    wait(q[0]);
    wait(q[1]);
    T* own = p + begin(cr);
    for (int64_t i = 0, m = len(cr); i < m; ++i) own[i] = S::add(own[i], recv[static_cast<size_t>(i)]);
  }
  // Rank r now owns the full sum of chunk r+1. All-gather: at step s send chunk r+1-s, receive chunk r-s.
  for (int s = 0; s < W - 1; ++s) {
    const int cs = r + 1 - s, cr = r - s;
    MPI_Request q[2];
    MPI_Irecv(p + begin(cr), static_cast<int>(len(cr)), S::type(), prev, W + s, comm, &q[0]);
    MPI_Isend(p + begin(cs), static_cast<int>(len(cs)), S::type(), next, W + s, comm, &q[1]);
    wait(q[0]);
    wait(q[1]);
  }
}

// The book's reduce-to-one-then-broadcast over point-to-point messages: rank 0 receives every
// other rank's tensor in rank order and adds it, then sends the sum to each rank in turn.
template <class S>
void naive_allreduce(typename S::T* p, int64_t n, MPI_Comm comm, int W, int me) {
  using T = typename S::T;
  const int count = static_cast<int>(n);
  if (me == 0) {
    static std::vector<T> recv;  // kept between calls, like the ring's
    if (recv.size() < static_cast<size_t>(n)) recv.resize(static_cast<size_t>(n));
    for (int r = 1; r < W; ++r) {
      MPI_Request q;
      MPI_Irecv(recv.data(), count, S::type(), r, 0, comm, &q);
      wait(q);
      for (int64_t i = 0; i < n; ++i) p[i] = S::add(p[i], recv[static_cast<size_t>(i)]);
    }
    for (int r = 1; r < W; ++r) {
      MPI_Request q;
      MPI_Isend(p, count, S::type(), r, 1, comm, &q);
      wait(q);
    }
  } else {
    MPI_Request q[2];
    MPI_Isend(p, count, S::type(), 0, 0, comm, &q[0]);
    wait(q[0]);
    MPI_Irecv(p, count, S::type(), 0, 1, comm, &q[1]);
    wait(q[1]);
  }
}

// The allreduce of n elements at p by `algorithm` on the communication thread, summed as S says;
// with done_out the compute stream does not wait.
template <class S>
void allreduce_on_comm(const Tensor& t, typename S::T* p, int n, const Group& g, const std::string& algorithm,
                       Event* done_out) {
  const double bytes = static_cast<double>(sizeof(typename S::T)) * n;
  const MPI_Comm c = comm_of(g);
  const int W = g.size(), r = g.rank();
  if (algorithm == "ring") {
    on_comm("allreduce_ring", {t}, [p, n, bytes, c, W, r] {
      modeled(bytes, "ring", W, [&] { ring_allreduce<S>(p, n, c, W, r); });
    }, done_out);
  } else if (algorithm == "naive") {
    on_comm("allreduce_naive", {t}, [p, n, bytes, c, W, r] {
      modeled(bytes, "naive", W, [&] { naive_allreduce<S>(p, n, c, W, r); });
    }, done_out);
  } else {
    // The library's tuned (blocking) allreduce: its algorithms differ from the nonblocking ones.
    // A 16-bit sum's operation is made on the communication thread, at its first use.
    on_comm("MPI_Allreduce", {t}, [p, n, bytes, c, W] {
      modeled(bytes, "library", W, [&] { MPI_Allreduce(MPI_IN_PLACE, p, n, S::type(), S::op(), c); });
    }, done_out);
  }
}

std::vector<int> chunk_counts(int64_t n, const Group& g) {
  std::vector<int> counts(static_cast<size_t>(g.size()));
  for (int c = 0; c < g.size(); ++c) counts[static_cast<size_t>(c)] = static_cast<int>(chunk_begin(n, c + 1, g) - chunk_begin(n, c, g));
  return counts;
}
std::vector<int> chunk_offsets(int64_t n, const Group& g) {
  std::vector<int> offsets(static_cast<size_t>(g.size()));
  for (int c = 0; c < g.size(); ++c) offsets[static_cast<size_t>(c)] = static_cast<int>(chunk_begin(n, c, g));
  return offsets;
}
#endif

// allgather and reduce_scatter: `part` must hold this rank's chunk of `whole`. Returns whole's size.
int64_t check_chunk(const char* op, const Tensor& whole, const Tensor& part, const char* part_name, const Group& g) {
  check_f32(op, whole);
  check_f32(op, part);
  const int64_t n = whole.numel(), mine = chunk_begin(n, g.rank() + 1, g) - chunk_begin(n, g.rank(), g);
  count_of(op, n);
  if (part.numel() != mine)
    throw ShapeError(std::string("dist::") + op + ": rank " + std::to_string(g.rank()) + "'s " + part_name + " has " +
                     std::to_string(part.numel()) + " elements, its chunk of " + std::to_string(n) + " has " +
                     std::to_string(mine));
  return n;
}

// Runs fn on the communication thread and waits for it (host-side collectives).
void on_comm_now(const char* op, std::function<void()> fn) {
  init();
  comm().enqueue(op, std::move(fn));
  comm().synchronize();
}

}  // namespace

int64_t chunk_begin(int64_t n, int chunk) { return d2l::chunk_begin(n, chunk, world_size()); }
int64_t chunk_begin(int64_t n, int chunk, const Group& group) { return d2l::chunk_begin(n, chunk, group.size()); }

std::vector<int64_t> counts_in_chunks(int64_t n, int64_t a, int64_t b, const Group& group) {
  std::vector<int64_t> counts;
  for (int r = 0; r < group.size(); ++r)
    counts.push_back(std::max<int64_t>(0, std::min(b, chunk_begin(n, r + 1, group)) - std::max(a, chunk_begin(n, r, group))));
  return counts;
}

void check_algorithm(const std::string& flag, const std::string& algorithm) {
  if (algorithm != "library" && algorithm != "ring" && algorithm != "naive")
    throw ConfigError("bad " + flag + " '" + algorithm +
                      "': expected library (MPI_Allreduce / ncclAllReduce), ring or naive (reduce to rank 0, then send back)");
}

void set_link_model(LinkModel m) {
  if (!(m.gbps >= 0) || !(m.latency_us >= 0) || !std::isfinite(m.gbps) || !std::isfinite(m.latency_us))
    throw ConfigError("link model: --link-gbps and --link-latency-us must be finite and >= 0");
  std::lock_guard<std::mutex> lock(g_link_mu);
  g_link = m;
}

LinkModel link_model() {
  std::lock_guard<std::mutex> lock(g_link_mu);
  return g_link;
}

double modeled_allreduce_seconds(const LinkModel& m, double bytes, const std::string& algorithm, int world) {
  if (world < 2 || !m.on()) return 0;
  const double messages = 2.0 * (world - 1);
  const double per_message = algorithm == "naive" ? bytes : bytes / world;
  const double bytes_per_s = m.gbps > 0 ? m.gbps * 1e9 / 8 : 0;
  return messages * (m.latency_us * 1e-6 + (bytes_per_s > 0 ? per_message / bytes_per_s : 0));
}

CollectiveCounters collective_counters() {
  std::lock_guard<std::mutex> lock(g_count_mu);
  return g_counts;
}

void reset_collective_counters() {
  std::lock_guard<std::mutex> lock(g_count_mu);
  g_counts = CollectiveCounters{};
}

void Work::wait() const {
  if (pending) runtime(device).compute.wait(done);
}

// The allreduce itself over the ranks of `g`; with done_out the compute stream does not wait (allreduce_async).
static void allreduce_impl(const Tensor& t, const Group& g, const std::string& algorithm, Event* done_out) {
  check_algorithm("allreduce algorithm", algorithm);
  check_float("allreduce", t);
  const int n = count_of("allreduce", t.numel());
  if (g.size() == 1 || n == 0) return;
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype()));
  if (on_gpu(t)) {
    // NCCL's communicator is the world's; a smaller group's sum goes through MPI.
    if (algorithm == "library" && nccl::built() && g.is_world() && nccl::usable(t.device())) {
      count_allreduce(n, g.size(), g.rank(), size);
      return nccl::allreduce(t, done_out);
    }
    // Staged through host memory: the copy back is stream work on t's device, ordered after the
    // collective, so the async form waits here (its result is complete when the compute stream is).
    return via_host(t, [&](const Tensor& h) { allreduce_impl(h, g, algorithm, nullptr); });
  }
#ifdef D2L_WITH_MPI
  count_allreduce(n, g.size(), g.rank(), size);
  using kernels::cpu::Float16;
  if (t.dtype() == DType::f32) return allreduce_on_comm<SumF32>(t, t.data(), n, g, algorithm, done_out);
  if (t.dtype() == DType::bf16) return allreduce_on_comm<Sum16<Float16::bf16>>(t, t.data16(), n, g, algorithm, done_out);
  allreduce_on_comm<Sum16<Float16::f16>>(t, t.data16(), n, g, algorithm, done_out);
#else
  (void)done_out;
#endif
}

void allreduce(const Tensor& t, const std::string& algorithm) { allreduce_impl(t, Group(), algorithm, nullptr); }

void allreduce(const Tensor& t, const Group& group, const std::string& algorithm) {
  allreduce_impl(t, group, algorithm, nullptr);
}

Work allreduce_async(const Tensor& t, const std::string& algorithm) {
  Work w;
  w.device = t.device();
  allreduce_impl(t, Group(), algorithm, &w.done);
  w.pending = world_size() > 1 && t.numel() > 0;
  return w;
}

void broadcast(const Tensor& t, int root) { broadcast(t, root, Group()); }

void broadcast(const Tensor& t, int root, const Group& g) {
  check_f32("broadcast", t);
  const int W = g.size();
  if (root < 0 || root >= W)
    throw ConfigError("dist::broadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(W) + ")");
  const int n = count_of("broadcast", t.numel());
  if (W == 1 || n == 0) return;
  const int64_t sent = g.rank() == root ? int64_t{n} * (W - 1) : 0;
  if (on_gpu(t)) {
    if (g.is_world() && nccl::usable(t.device())) {
      count(&CollectiveCounters::broadcast, n, sent);
      return nccl::broadcast(t, root);
    }
    return via_host(t, [&](const Tensor& h) { broadcast(h, root, g); });
  }
#ifdef D2L_WITH_MPI
  count(&CollectiveCounters::broadcast, n, sent);
  float* p = t.data();
  const MPI_Comm c = comm_of(g);
  on_comm("MPI_Ibcast", {t}, [p, n, root, c] {
    MPI_Request q;
    MPI_Ibcast(p, n, MPI_FLOAT, root, c, &q);
    wait(q);
  });
#endif
}

void allgather(const Tensor& in, const Tensor& out) { allgather(in, out, Group()); }

void allgather(const Tensor& in, const Tensor& out, const Group& g) {
  const int64_t n = check_chunk("allgather", out, in, "input", g);
  std::vector<int64_t> counts;
  for (int r = 0; r < g.size(); ++r) counts.push_back(chunk_begin(n, r + 1, g) - chunk_begin(n, r, g));
  const Work w = g.is_world() ? allgather_async(in, out) : allgather_async(in, 0, out, counts, g);
  w.wait();  // out's compute stream
  if (w.pending && in.device() != out.device()) runtime(in.device()).compute.wait(w.done);
}

Work allgather_async(const Tensor& in, const Tensor& out) {
  const Group world;
  const int64_t n = check_chunk("allgather", out, in, "input", world);
  Work w;
  w.device = out.device();
  if (world_size() == 1) {
    if (n > 0) in.copyto(out);
    return w;
  }
  const int64_t mine = in.numel();
  if (on_gpu(in) || on_gpu(out)) {
    if (nccl::built() && on_gpu(in) && in.device() == out.device() && nccl::usable(in.device())) {
      count(&CollectiveCounters::allgather, mine, mine * (world_size() - 1));
      nccl::allgather(in, out);
      return w;
    }
    Tensor h = Tensor::empty(out.shape(), cpu(0));
    allgather(in.to(cpu(0)), h);
    h.copyto(out);
    return w;
  }
#ifdef D2L_WITH_MPI
  count(&CollectiveCounters::allgather, mine, mine * (world_size() - 1));
  const float* src = in.data();
  float* dst = out.data();
  on_comm("MPI_Iallgatherv", {in, out}, [src, dst, n, world] {
    std::vector<int> counts = chunk_counts(n, world), offsets = chunk_offsets(n, world);
    MPI_Request q;
    MPI_Iallgatherv(src, counts[static_cast<size_t>(rank())], MPI_FLOAT, dst, counts.data(), offsets.data(), MPI_FLOAT,
                    MPI_COMM_WORLD, &q);
    wait(q);
  }, &w.done);
  w.pending = true;
#endif
  return w;
}

Work allgather_async(const Tensor& in, int64_t in_offset, const Tensor& out, const std::vector<int64_t>& counts,
                     const Group& g) {
  check_f32("allgather", in);
  check_f32("allgather", out);
  const int W = g.size(), me = g.rank();
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t mine = static_cast<int>(counts.size()) == W ? counts[static_cast<size_t>(me)] : -1;
  if (static_cast<int>(counts.size()) != W || total != out.numel() || in_offset < 0 || mine < 0 ||
      in_offset + mine > in.numel())
    throw ShapeError("dist::allgather: " + std::to_string(counts.size()) + " counts adding up to " + std::to_string(total) +
                     " for " + std::to_string(W) + " ranks and an output of " + std::to_string(out.numel()) +
                     " elements, or this rank's part outside the input");
  Work w;
  w.device = out.device();
  // In place: this rank's part is in `out` already, where the gather puts it (MPI_IN_PLACE).
  int64_t at_me = 0;
  for (int r = 0; r < me; ++r) at_me += counts[static_cast<size_t>(r)];
  const bool in_place = in.impl().storage == out.impl().storage && in_offset == at_me;
  if (W == 1) {
    if (mine > 0 && !in_place) copy_bytes(in, static_cast<size_t>(in_offset) * 4, out, 0, static_cast<size_t>(mine) * 4);
    return w;
  }
  if (on_gpu(in) || on_gpu(out)) {  // through host memory
    Tensor part = Tensor::empty({std::max<int64_t>(mine, 1)}, cpu(0)), h = Tensor::empty(out.shape(), cpu(0));
    if (mine > 0) copy_bytes(in, static_cast<size_t>(in_offset) * 4, part, 0, static_cast<size_t>(mine) * 4);
    allgather_async(part, 0, h, counts, g).wait();
    h.copyto(out);
    return w;
  }
#ifdef D2L_WITH_MPI
  count(&CollectiveCounters::allgather, mine, mine * (W - 1));
  const float* src = in.data() + in_offset;
  float* dst = out.data();
  std::vector<int> n(counts.begin(), counts.end()), at(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) at[r] = at[r - 1] + n[r - 1];
  const MPI_Comm c = comm_of(g);
  on_comm("MPI_Iallgatherv", {in, out}, [src, dst, n, at, me, c, in_place] {
    MPI_Request q;
    MPI_Iallgatherv(in_place ? MPI_IN_PLACE : src, n[static_cast<size_t>(me)], MPI_FLOAT, dst, n.data(), at.data(),
                    MPI_FLOAT, c, &q);
    wait(q);
  }, &w.done);
  w.pending = true;
#endif
  return w;
}

void reduce_scatter(const Tensor& in, const Tensor& out) {
  const Group world;
  const int64_t n = check_chunk("reduce_scatter", in, out, "output", world);
  if (world_size() == 1) {
    if (n > 0) in.copyto(out);
    return;
  }
  const int64_t sent = n - out.numel();  // every chunk but this rank's
  if (on_gpu(in) || on_gpu(out)) {
    if (nccl::built() && on_gpu(in) && in.device() == out.device() && nccl::usable(in.device())) {
      count(&CollectiveCounters::reduce_scatter, n, sent);
      return nccl::reduce_scatter(in, out);
    }
    Tensor h = Tensor::empty(out.shape(), cpu(0));
    reduce_scatter(in.to(cpu(0)), h);
    return h.copyto(out);
  }
#ifdef D2L_WITH_MPI
  count(&CollectiveCounters::reduce_scatter, n, sent);
  const float* src = in.data();
  float* dst = out.data();
  on_comm("MPI_Ireduce_scatter", {in, out}, [src, dst, n, world] {
    std::vector<int> counts = chunk_counts(n, world);
    MPI_Request q;
    MPI_Ireduce_scatter(src, dst, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
    wait(q);
  });
#endif
}

Work reduce_scatter_async(const Tensor& in, const Tensor& out, int64_t out_offset, const std::vector<int64_t>& counts,
                          const Group& g, int64_t from) {
  check_f32("reduce_scatter", in);
  check_f32("reduce_scatter", out);
  const int W = g.size(), me = g.rank();
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t in_offset = std::max<int64_t>(from, 0);  // from < 0: all of `in`, which the counts must add up to
  if (static_cast<int>(counts.size()) != W || (from < 0 ? total != in.numel() : in_offset + total > in.numel()) ||
      out_offset < 0 || out_offset + counts[static_cast<size_t>(me)] > out.numel())
    throw ShapeError("dist::reduce_scatter: " + std::to_string(counts.size()) + " counts adding up to " +
                     std::to_string(total) + " for " + std::to_string(W) + " ranks and an input of " +
                     std::to_string(in.numel()) + " elements from element " + std::to_string(in_offset) +
                     ", or this rank's part outside the output");
  Work w;
  w.device = out.device();
  const int64_t mine = counts[static_cast<size_t>(me)];
  if (W == 1) {
    if (mine > 0) copy_bytes(in, static_cast<size_t>(in_offset) * 4, out, static_cast<size_t>(out_offset) * 4, static_cast<size_t>(mine) * 4);
    return w;
  }
  if (on_gpu(in) || on_gpu(out)) {  // through host memory
    Tensor h = Tensor::empty({std::max<int64_t>(mine, 1)}, cpu(0)), part = Tensor::empty({std::max<int64_t>(total, 1)}, cpu(0));
    if (total > 0) copy_bytes(in, static_cast<size_t>(in_offset) * 4, part, 0, static_cast<size_t>(total) * 4);
    reduce_scatter_async(part, h, 0, counts, g, 0).wait();
    if (mine > 0) copy_bytes(h, 0, out, static_cast<size_t>(out_offset) * 4, static_cast<size_t>(mine) * 4);
    return w;
  }
#ifdef D2L_WITH_MPI
  std::vector<int> c;
  for (int64_t n : counts) c.push_back(count_of("reduce_scatter", n));
  count(&CollectiveCounters::reduce_scatter, total, total - mine);
  const float* src = in.data() + in_offset;
  float* dst = out.data() + out_offset;
  const MPI_Comm comm = comm_of(g);
  on_comm("MPI_Ireduce_scatter", {in, out}, [src, dst, c, comm] {
    MPI_Request q;
    MPI_Ireduce_scatter(src, dst, c.data(), MPI_FLOAT, MPI_SUM, comm, &q);
    wait(q);
  }, &w.done);
  w.pending = true;
#endif
  return w;
}

void barrier() { barrier(Group()); }

void barrier(const Group& group) {
  if (group.size() == 1) return;
#ifdef D2L_WITH_MPI
  const MPI_Comm c = comm_of(group);
  on_comm_now("MPI_Ibarrier", [c] {
    MPI_Request q;
    MPI_Ibarrier(c, &q);
    wait(q);
  });
#endif
}

void allreduce(const std::vector<Tensor>& local, const std::string& local_algorithm, const std::string& algorithm) {
  check_algorithm("allreduce algorithm", algorithm);
  if (local.empty()) throw ShapeError("dist::allreduce: no tensors");
  NoGrad no_grad;
  if (local.size() > 1) d2l::allreduce(local, local_algorithm);  // inside the process: every device holds the sum
  if (world_size() == 1) return;
  allreduce(local[0], algorithm);
  for (size_t i = 1; i < local.size(); ++i) local[0].copyto(local[i]);
}

std::vector<double> sum_over_ranks(std::vector<double> values) { return sum_over_ranks(std::move(values), Group()); }

std::vector<double> sum_over_ranks(std::vector<double> values, const Group& group) {
  const int W = group.size();
  if (W == 1) return values;
#ifdef D2L_WITH_MPI
  const int n = count_of("sum_over_ranks", static_cast<int64_t>(values.size()));
  std::vector<double> all(values.size() * static_cast<size_t>(W));
  const MPI_Comm c = comm_of(group);
  on_comm_now("MPI_Iallgather", [&] {
    MPI_Request q;
    MPI_Iallgather(values.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, c, &q);
    wait(q);
  });
  for (size_t i = 0; i < values.size(); ++i) {  // in group rank order: the same bits on every rank of the group
    double s = 0;
    for (int r = 0; r < W; ++r) s += all[static_cast<size_t>(r) * values.size() + i];
    values[i] = s;
  }
#endif
  return values;
}

void broadcast_bytes(void* p, size_t n, int root) {
  if (world_size() == 1 || n == 0) return;
#ifdef D2L_WITH_MPI
  const int count = count_of("broadcast_bytes", static_cast<int64_t>(n));
  on_comm_now("MPI_Ibcast", [&] {
    MPI_Request q;
    MPI_Ibcast(p, count, MPI_BYTE, root, MPI_COMM_WORLD, &q);
    wait(q);
  });
#else
  (void)p, (void)root;
#endif
}

std::vector<std::string> gather_strings(const std::string& mine) {
  if (world_size() == 1) return {mine};
  std::vector<std::string> out;
#ifdef D2L_WITH_MPI
  const int W = world_size();
  std::vector<int> lengths(static_cast<size_t>(W)), offsets(static_cast<size_t>(W));
  std::vector<char> bytes;
  int len = count_of("gather_strings", static_cast<int64_t>(mine.size()));
  on_comm_now("MPI_Iallgatherv", [&] {
    MPI_Request q;
    MPI_Iallgather(&len, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD, &q);
    wait(q);
    int64_t total = 0;
    for (int r = 0; r < W; ++r) offsets[static_cast<size_t>(r)] = static_cast<int>(total), total += lengths[static_cast<size_t>(r)];
    bytes.resize(static_cast<size_t>(total));
    MPI_Iallgatherv(mine.data(), len, MPI_CHAR, bytes.data(), lengths.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD, &q);
    wait(q);
  });
  for (int r = 0; r < W; ++r)
    out.emplace_back(bytes.data() + offsets[static_cast<size_t>(r)], static_cast<size_t>(lengths[static_cast<size_t>(r)]));
#endif
  return out;
}

}  // namespace d2l::dist

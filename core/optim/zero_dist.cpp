#include "core/optim/zero_dist.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"

namespace d2l::optim::zero {

namespace {

constexpr size_t kFloatBytes = sizeof(float);

// Calls f(k, a, b) for every parameter k with elements in [lo, hi), [a, b) the flat range of them there.
template <class F>
void each_piece_between(const ShardLayout& layout, int64_t lo, int64_t hi, F f) {
  for (size_t k = 0; k + 1 < layout.offsets.size(); ++k) {
    const int64_t a = std::max(lo, layout.offsets[k]), b = std::min(hi, layout.offsets[k + 1]);
    if (a < b) f(k, a, b);
  }
}

// Copies the flat range [lo, lo + n) of the parameters' tensors (per parameter, one each) into flat
// (n elements), or back when `into_params`.
void copy_flat(const ShardLayout& layout, const std::vector<Tensor>& tensors, int64_t lo, int64_t n, const Tensor& flat,
               bool into_params) {
  each_piece_between(layout, lo, lo + n, [&](size_t k, int64_t a, int64_t b) {
    const size_t in_param = static_cast<size_t>(a - layout.offsets[k]) * kFloatBytes;
    const size_t in_flat = static_cast<size_t>(a - lo) * kFloatBytes, bytes = static_cast<size_t>(b - a) * kFloatBytes;
    if (into_params) copy_bytes(flat, in_flat, tensors[k], in_param, bytes);
    else copy_bytes(tensors[k], in_param, flat, in_flat, bytes);
  });
}

// dst's elements [at, at + src.numel()) += src's (gradient accumulation: a bucket packed or sent twice).
void add_at(const Tensor& dst, int64_t at, const Tensor& src) {
  const size_t bytes = static_cast<size_t>(src.numel()) * kFloatBytes, offset = static_cast<size_t>(at) * kFloatBytes;
  Tensor part = Tensor::empty(src.shape(), dst.device());
  copy_bytes(dst, offset, part, 0, bytes);
  add_(part, src);
  copy_bytes(part, 0, dst, offset, bytes);
}

}  // namespace

bool fails_in_allgather(int stage) {
  const char* v = std::getenv("D2L_FAIL_RANK_IN_ALLGATHER");
  if (!v || !*v) return false;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  if (end == v || r != dist::rank()) return false;
  if (*end == '\0') return true;  // R: whichever sharded stage runs first
  if (*end != ':') return false;
  const char* s = end + 1;
  const long only = std::strtol(s, &end, 10);
  return end != s && *end == '\0' && only == stage;  // R:S: stage S's only
}

int64_t RankShardedState::lo() const { return layout_.bounds[static_cast<size_t>(group_.rank())]; }
int64_t RankShardedState::chunk() const { return layout_.shard_size(static_cast<size_t>(group_.rank())); }
int64_t RankShardedState::piece_begin(size_t i) const {
  // Shard r h + i of W h (h holders a rank): the one split rule nests, so the rank's h pieces are its chunk.
  const int64_t h = static_cast<int64_t>(holders());
  return chunk_begin(layout_.total(), group_.rank() * h + static_cast<int64_t>(i), group_.size() * h);
}

std::vector<Device> RankShardedState::devices() const {
  return std::vector<Device>(replica_devices_.begin(), replica_devices_.begin() + static_cast<std::ptrdiff_t>(holders()));
}

Tensor RankShardedState::chunk_of_slot(size_t j) const {
  if (holders() == 1) return state_[0][j];
  Tensor flat = Tensor::empty({chunk()}, device());
  for (size_t i = 0; i < holders(); ++i)
    if (state_[i][j].numel() > 0)
      copy_bytes(state_[i][j], 0, flat, static_cast<size_t>(piece_begin(i) - lo()) * kFloatBytes,
                 static_cast<size_t>(state_[i][j].numel()) * kFloatBytes);
  return flat;
}

bool RankShardedState::fits(const std::vector<std::vector<Tensor>>& weights) const {
  if (!placed_ || weights.size() + 1 != layout_.offsets.size()) return false;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (weights[k].size() != replica_devices_.size() || weights[k][0].numel() != layout_.offsets[k + 1] - layout_.offsets[k])
      return false;
    for (size_t i = 0; i < weights[k].size(); ++i)
      if (weights[k][i].device() != replica_devices_[i]) return false;
  }
  return true;
}

void RankShardedState::place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                             std::vector<std::vector<std::vector<float>>>& host) {
  // The chunk is this process's, on its first device (the paper's setting: its one device).
  const std::string stage = std::to_string(stage_);
  std::vector<int64_t> sizes;
  std::vector<Device> devices;
  for (auto& w : weights[0]) devices.push_back(w.device());
  for (size_t k = 0; k < weights.size(); ++k) {
    std::vector<Device> on;
    for (auto& w : weights[k]) on.push_back(w.device());
    if (on != devices)
      throw ConfigError("Trainer: zero_stage " + stage + " needs every trainable parameter on the same devices, in the "
                        "same order: '" + names[0] + "' is on " + str(devices) + ", '" + names[k] + "' on " + str(on) +
                        " in rank " + std::to_string(dist::rank()));
    sizes.push_back(weights[k][0].numel());
  }
  // The unsharded values: loaded ones, else the chunks kept so far (the parameters moved), else zeros.
  if (!loaded_state_waits(host) && placed_) host = gather_state();
  for (size_t k = 0; k < host.size(); ++k)
    for (auto& slot : host[k])
      if (!slot.empty() && static_cast<int64_t>(slot.size()) != sizes[k])
        throw ShapeError("Trainer: a slot of the optimizer state of '" + names[k] + "' has " +
                         std::to_string(slot.size()) + " values but the parameter has " + std::to_string(sizes[k]));
  // A loaded state for the same parameters keeps the buckets, and what backward already sent into them.
  const ShardLayout layout = shard_layout(sizes, static_cast<size_t>(group_.size()));  // the devices' split, over the ranks
  const bool same_layout = placed_ && layout.offsets == layout_.offsets && replica_devices_ == devices;
  if (!same_layout && (!pending_.empty() || std::find(packed_.begin(), packed_.end(), true) != packed_.end()))
    throw ConfigError("Trainer: zero_stage " + stage + ": the parameters changed between backward and the step, whose "
                      "gradients are already reduce-scattered and released: step before moving them");
  layout_ = layout;
  replica_devices_ = devices;
  const int64_t n = chunk();
  state_.assign(holders(), std::vector<Tensor>(slots_));
  for (size_t i = 0; i < holders(); ++i) {  // holder i's piece [first, end), on device i
    const int64_t first = piece_begin(i), end = piece_begin(i + 1);
    for (size_t j = 0; j < slots_; ++j) {
      std::vector<float> flat(static_cast<size_t>(end - first), 0.0f);
      each_piece_between(layout_, first, end, [&](size_t k, int64_t a, int64_t b) {
        const auto& from = host[k][j];
        if (!from.empty())
          std::copy(from.begin() + (a - layout_.offsets[k]), from.begin() + (b - layout_.offsets[k]), flat.begin() + (a - first));
      });
      MemoryTagScope tag(MemoryTag::optimizer_state);
      state_[i][j] = Tensor::from_vector(flat, {end - first}, replica_devices_[i]);
    }
  }
  for (auto& slots : host)
    for (auto& slot : slots) slot.clear();
  replicas_ = weights, index_.clear();
  completed_.assign(weights.size(), 0);
  for (size_t k = 0; k < weights.size(); ++k)
    for (auto& w : weights[k]) index_[&w.impl()] = k;
  if (!same_layout) {
    MemoryTagScope tag(MemoryTag::summed_gradients);
    grad_shard_ = stage_ == 2 ? Tensor::empty({n}, device()) : Tensor();
    make_buckets();
  }
  placed_ = true;
}

RankShardedState::RankShardedState(size_t slots, int stage, double reduce_bucket_mb, dist::Group group, bool over_devices)
    : slots_(slots), stage_(stage), group_(std::move(group)), over_devices_(over_devices), bucket_mb_(reduce_bucket_mb) {
  if (!(reduce_bucket_mb >= 0) || !std::isfinite(reduce_bucket_mb))
    throw ConfigError("Trainer: reduce_bucket_mb must be finite and >= 0 (0: one reduce-scatter per parameter), got " +
                      std::to_string(reduce_bucket_mb));
  if (stage_ == 2)  // backward packs each gradient the moment it is complete on every device, and sends full buckets
    hook_ = add_grad_ready_hook([this](TensorImpl& leaf) {
      auto it = index_.find(&leaf);
      if (!placed_ || it == index_.end()) return;
      const size_t k = it->second;
      if (++completed_[k] < replica_devices_.size()) return;  // the devices run backward one after another
      completed_[k] = 0;
      pack(k, true);
    });
}

RankShardedState::~RankShardedState() {
  if (hook_ >= 0) remove_grad_ready_hook(hook_);
}

void RankShardedState::make_buckets() {
  // From the last parameter back, each bucket closing once it holds bucket_mb_ MiB (DDP's rule). At
  // stage 1 every .grad buffer stays anyway: each is sent as it is, one parameter a bucket, no packing.
  const size_t params = layout_.offsets.size() - 1;
  const double cap = stage_ == 1 ? 0.0 : bucket_mb_ * 1024 * 1024;
  buckets_.clear();
  bucket_of_.assign(params, 0);
  packed_.assign(params, false);
  for (size_t last = params; last > 0;) {
    Bucket b;
    b.first = b.last = last;
    double bytes = 0;
    do {
      --b.first;
      bytes += static_cast<double>(kFloatBytes) * static_cast<double>(layout_.offsets[b.first + 1] - layout_.offsets[b.first]);
    } while (b.first > 0 && bytes < cap);
    for (size_t k = b.first; k < b.last; ++k) bucket_of_[k] = buckets_.size();
    buckets_.push_back(b);
    last = b.first;
  }
}

Tensor RankShardedState::device_sum(size_t k) const {
  const std::vector<Tensor>& on = replicas_[k];
  const Tensor& first = on[0];
  // Added into the first device's .grad buffer in place, as the 'device' kvstore sums: the step (or,
  // at stage 2, the release after packing) is done with its contents, and a copy would hold 4 Psi more.
  Tensor sum = first.grad().defined() ? first.grad() : Tensor::zeros(first.shape(), device());
  for (size_t i = 1; i < on.size(); ++i)  // device order, as the 'device' kvstore adds
    if (on[i].grad().defined()) add_(sum, on[i].grad().to(device()));
  return sum;
}

void RankShardedState::pack(size_t k, bool release) {
  // Parameter k's gradient (summed over this rank's devices; zeros if it has none) into its place in
  // the bucket; at stage 2 the .grad buffers go (the allocator takes each back once the queued copy has read it).
  Bucket& b = buckets_[bucket_of_[k]];
  const Tensor g = device_sum(k);
  const int64_t at = layout_.offsets[k] - layout_.offsets[b.first];
  if (b.last - b.first == 1) {  // a lone parameter: its gradient is the bucket
    if (packed_[k]) add_(b.packed, g);
    else b.packed = g;
  } else {
    if (!b.packed.defined()) b.packed = Tensor::empty({layout_.offsets[b.last] - layout_.offsets[b.first]}, device());
    if (packed_[k]) add_at(b.packed, at, g);
    else copy_bytes(g, 0, b.packed, static_cast<size_t>(at) * kFloatBytes, static_cast<size_t>(g.numel()) * kFloatBytes);
  }
  if (release)
    for (auto& w : replicas_[k]) w.impl().grad.reset();
  if (!packed_[k]) packed_[k] = true, ++b.arrived;
  if (b.arrived == b.last - b.first) send(b);
}

void RankShardedState::send(Bucket& b) {
  // The bucket is elements [a, b) of the flat vector: rank r receives those inside its chunk, one
  // range of it, which starts at element max(a, lo) - lo of grad_shard_.
  const int W = group_.size();
  const int64_t a = layout_.offsets[b.first], end = layout_.offsets[b.last];
  std::vector<int64_t> counts;
  for (int r = 0; r < W; ++r)
    counts.push_back(std::max<int64_t>(0, std::min(end, layout_.bounds[r + 1]) - std::max(a, layout_.bounds[r])));
  const int64_t at = std::clamp<int64_t>(a - lo(), 0, chunk()), mine = counts[static_cast<size_t>(group_.rank())];
  if (b.sent == 0) {
    pending_.push_back(dist::reduce_scatter_async(b.packed, grad_shard_, at, counts, group_));
    if (stage_ == 2 && pending_.back().pending) {
      in_flight_.push_back(pending_.back().done);
      while (in_flight_.size() > kInFlight) {
        in_flight_.front().synchronize();
        in_flight_.pop_front();
      }
    }
  } else {  // sent before in this step: received apart, added into the sum once there
    Late late{{}, Tensor::empty({std::max<int64_t>(mine, 1)}, device()), at};
    late.work = dist::reduce_scatter_async(b.packed, late.recv, 0, counts, group_);
    if (mine > 0) late_.push_back(late);
    else late.work.wait();
  }
  b.packed = Tensor();  // the communication thread holds it until the reduce-scatter has read it
  for (size_t k = b.first; k < b.last; ++k) packed_[k] = false;
  b.arrived = 0;
  ++b.sent;
}

void RankShardedState::reduce_scatter_rest(bool release) {
  // The buckets backward has not sent (every one at stage 1, and at the first step), in bucket
  // order: the gradients not packed yet are taken from the .grad buffers, zeros where there are none.
  for (Bucket& b : buckets_) {
    if (b.sent > 0 && b.arrived == 0) continue;  // sent, and nothing added since
    std::vector<size_t> missing;
    for (size_t k = b.first; k < b.last; ++k)
      if (!packed_[k]) missing.push_back(k);
    for (size_t k : missing) pack(k, release);  // the last one sends the bucket
  }
}

void RankShardedState::wait_for_sums() {
  for (auto& work : pending_) work.wait();
  for (auto& late : late_) {
    late.work.wait();
    add_at(grad_shard_, late.at, late.recv);
  }
  pending_.clear(), late_.clear(), in_flight_.clear();
  for (Bucket& b : buckets_) b.sent = 0;
  std::fill(completed_.begin(), completed_.end(), 0);
}

void RankShardedState::step(const StepInput& in, const Step& step, GradClip* clip) {
  if (in.weights.empty()) return;
  NoGrad no_grad;
  const bool summed = in.kv.reduce_all(in.weights);  // DDP's buckets: every gradient summed already
  const auto& weights = in.weights;
  auto& host = in.host;
  if (loaded_state_waits(host) || !fits(weights)) place(weights, in.names, host);  // checks the devices before any collective
  if (stage_ == 2 && summed)
    throw ConfigError("Trainer: zero_stage 2 reduce-scatters the gradients, but the gradient buckets already all-reduced "
                      "them: use zero_stage 1 with buckets");
  std::vector<Tensor> params;  // the replicas on the chunk's device
  for (auto& replicas : weights) params.push_back(replicas[0]);
  const int64_t n = chunk(), first = lo();
  Tensor g;
  if (stage_ == 1 && summed) {
    // DDP's buckets all-reduced every gradient during backward: this rank reads chunk r of the sum.
    std::vector<Tensor> grads;
    for (const Tensor& w : params) grads.push_back(w.grad().defined() ? w.grad() : Tensor::zeros(w.shape(), w.device()));
    g = Tensor::empty({n}, device());
    copy_flat(layout_, grads, first, n, g, false);
  } else {
    // Chunk r's sum arrives in grad_shard_, no other. Stage 1 reduce-scatters every bucket now and
    // keeps the .grad buffers; at stage 2 backward sent most of them and released their gradients.
    if (stage_ == 1) grad_shard_ = Tensor::empty({n}, device());
    reduce_scatter_rest(stage_ == 2);
    wait_for_sums();
    g = grad_shard_;
    if (stage_ == 1) grad_shard_ = Tensor();  // the step's g keeps it until the update is done
  }
  // clip_grad_norm_: this rank's chunk's squares, added over the group (the same norm on every rank);
  // the pieces of a tp_group's slices apart, which apply() adds over that group too.
  Step s = step;
  if (clip) {
    double split = 0, other = 0;
    const std::vector<float> v = n > 0 ? g.to_vector() : std::vector<float>{};
    each_piece_between(layout_, first, first + n, [&](size_t k, int64_t a, int64_t b) {
      double& sum = clip->is_split(k) ? split : other;
      for (int64_t i = a; i < b; ++i) sum += static_cast<double>(v[size_t(i - first)]) * static_cast<double>(v[size_t(i - first)]);
    });
    const std::vector<double> both = dist::sum_over_ranks({split, other}, group_);
    s = clip->apply(step, both[0], both[1]);
  }
  // This rank's chunk of the weights, flat, updated with its state and summed gradient; then the
  // all-gather. With over_devices each device takes its piece of the weights from its own replicas
  // and of the sum from the first device; the all-gather collects the updated pieces.
  gather_into_ = params;
  std::vector<ReplicaStep> mine;
  if (n > 0 && holders() == 1) {
    Tensor w = Tensor::empty({n}, device());
    copy_flat(layout_, params, first, n, w, false);
    gather_from_ = w;
    mine.push_back({w, state_[0], g});
  }
  for (size_t i = 0; n > 0 && holders() > 1 && i < holders(); ++i) {
    const int64_t a = piece_begin(i), len = piece_begin(i + 1) - a;
    if (len == 0) continue;
    std::vector<Tensor> on_i;
    for (auto& replicas : weights) on_i.push_back(replicas[i]);
    Tensor wi = Tensor::empty({len}, replica_devices_[i]), gi = Tensor::empty({len}, replica_devices_[i]);
    copy_flat(layout_, on_i, a, len, wi, false);
    copy_bytes(g, static_cast<size_t>(a - first) * kFloatBytes, gi, 0, static_cast<size_t>(len) * kFloatBytes);
    mine.push_back({wi, state_[i], gi});
    updated_pieces_.push_back({wi, a - first});
  }
  if (holders() > 1) g = Tensor();  // each device has its piece of the sum (stage 2 keeps grad_shard_ still)
  update_my_shard_then_all_gather(mine, s);
  gather_from_ = Tensor(), gather_into_.clear(), updated_pieces_.clear();
}

void RankShardedState::all_gather() {
  ++steps_;
  if (steps_ == 2 && fails_in_allgather(stage_))
    throw DeviceError("injected failure inside the ZeRO-" + std::to_string(stage_) + " all-gather of step 2 "
                      "(D2L_FAIL_RANK_IN_ALLGATHER=" + std::getenv("D2L_FAIL_RANK_IN_ALLGATHER") + ")");
  // Parameter by parameter straight into its tensor: rank r gives the part of it that lies in its
  // chunk (MPI_Allgatherv's counts), so no rank holds a second whole copy.
  if (!gather_from_.defined()) gather_from_ = Tensor::empty({chunk()}, device());  // over_devices: the pieces, collected
  const Tensor& w = gather_from_;
  for (auto& [piece, at] : updated_pieces_)
    copy_bytes(piece, 0, w, static_cast<size_t>(at) * kFloatBytes, static_cast<size_t>(piece.numel()) * kFloatBytes);
  const std::vector<Tensor>& params = gather_into_;
  const int64_t n = chunk(), first = lo();
  std::vector<dist::Work> gathers;
  for (size_t k = 0; k < params.size(); ++k) {
    const int64_t a = layout_.offsets[k], b = layout_.offsets[k + 1];
    std::vector<int64_t> counts;
    for (int r = 0; r < group_.size(); ++r)
      counts.push_back(std::max<int64_t>(0, std::min(b, layout_.bounds[r + 1]) - std::max(a, layout_.bounds[r])));
    gathers.push_back(dist::allgather_async(w, std::clamp<int64_t>(a - first, 0, n), params[k], counts, group_));
  }
  for (auto& work : gathers) work.wait();
  for (size_t k = 0; k < params.size(); ++k)  // the process's other devices: replicas of the first
    for (size_t i = 1; i < replicas_[k].size(); ++i) params[k].copyto(replicas_[k][i]);
}

std::vector<std::vector<std::vector<float>>> RankShardedState::gather_state() const {
  if (!placed_) return {};
  const size_t params = layout_.offsets.size() - 1;
  std::vector<std::vector<std::vector<float>>> out(params, std::vector<std::vector<float>>(slots_));
  for (size_t j = 0; j < slots_; ++j) {
    Tensor whole = Tensor::empty({layout_.total()}, device());
    dist::allgather(chunk_of_slot(j), whole, group_);
    const std::vector<float> v = whole.to_vector();
    for (size_t k = 0; k < params; ++k)
      out[k][j].assign(v.begin() + layout_.offsets[k], v.begin() + layout_.offsets[k + 1]);
  }
  return out;
}

std::vector<std::vector<float>> RankShardedState::chunk_state() const {
  std::vector<std::vector<float>> out;
  if (!placed_) return out;
  for (size_t j = 0; j < slots_; ++j) out.push_back(chunk() > 0 ? chunk_of_slot(j).to_vector() : std::vector<float>{});
  return out;
}

int64_t RankShardedState::bytes() const {  // from the tensors held
  int64_t n = 0;
  for (const auto& piece : state_)
    for (const Tensor& t : piece)
      if (t.defined() && t.impl().storage) n += static_cast<int64_t>(kFloatBytes) * t.numel();
  return n;
}

void RankShardedState::add_memory(const std::function<DeviceMemory&(Device)>& at) const {
  if (!placed_) return;
  for (size_t i = 0; i < state_.size(); ++i)  // each holder's piece of the state, on its device
    for (const Tensor& t : state_[i])
      if (t.defined() && t.impl().storage) at(replica_devices_[i]).state_bytes += static_cast<int64_t>(kFloatBytes) * t.numel();
  at(device()).summed_gradient_bytes += gradient_bytes();  // stage 2: the chunk's sum is all the sum kept
}

int64_t RankShardedState::gradient_bytes() const {
  return stage_ == 2 && grad_shard_.defined() ? static_cast<int64_t>(kFloatBytes) * grad_shard_.numel() : 0;
}

std::vector<std::pair<size_t, size_t>> RankShardedState::buckets() const {
  std::vector<std::pair<size_t, size_t>> out;
  for (const Bucket& b : buckets_) out.emplace_back(b.first, b.last);
  return out;
}

}  // namespace d2l::optim::zero

// ZeRO-3 (core/optim/zero.hpp), what FullyShardedDataParallel calls: a unit's pieces taken out of
// the replicas, the unit made whole (over the ranks an all-gather per parameter, queued ahead by
// prefetch; over a group of one copies from every device's parts) and released, its gradients
// reduce-scattered into the pieces; the parameters read from and written into the pieces. The
// layout, the state and the step are zero.cpp's.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/ops.hpp"
#include "core/optim/zero.hpp"
#include "core/runtime.hpp"

namespace d2l::optim::zero {

void RankShards::shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units) {
  shard(in.weights, in.names, units, in.host);
}

void RankShards::shard(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                       const std::vector<std::vector<size_t>>& units, std::vector<std::vector<std::vector<float>>>& host) {
  if (placed()) {  // the pieces stay; a loaded state, if one waits, replaces the state
    if (!fits(weights))
      throw ConfigError("Trainer: zero_stage 3 keeps the parameters where they were sharded, " + str(devices_) +
                        "; they cannot move (reset_ctx) afterwards");
    if (loaded_state_waits(host)) place_state(names, host);
    return;
  }
  devices_ = devices_of(weights, names);
  replicas_ = weights;
  // This rank's replicas hold the same values as every other rank's: a part is taken from the
  // replica on its piece's device, a whole parameter's by keeping the replica's buffer, a part of one
  // by a copy. Over ranks the summed gradients are zeros that the reduce-scatters add into; over a
  // group of one they are made as the gradients arrive (add_contribution).
  std::vector<Unit> laid;
  where_.assign(weights.size(), {0, 0});
  for (const auto& params : units) {
    Unit unit = unit_of(params);
    for (size_t p = 0; p < params.size(); ++p) where_[params[p]] = {laid.size(), p};
    for (size_t i = 0; i < unit.pieces.size(); ++i)
      for (Part& part : unit.pieces[i].parts) {
        const Tensor& replica = replicas_[unit.params[part.p]][i];
        if (part.whole) {
          auto impl = std::make_shared<TensorImpl>();
          impl->shape = replica.shape(), impl->device = devices_[i], impl->storage = replica.impl().storage;
          part.param = Tensor(impl);
        } else {
          {
            MemoryTagScope tag(MemoryTag::parameters);
            part.param = Tensor::empty({part.n}, devices_[i]);
          }
          copy_flat(unit, i, part.lo, part.param, false);
        }
        MemoryTagScope tag(MemoryTag::summed_gradients);
        if (!alone()) part.grad = Tensor::zeros(part_shape(unit, part), devices_[i]);
      }
    laid.push_back(std::move(unit));
  }
  units_ = std::move(laid);
  place_state(names, host);
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i = 0; i < devices_.size(); ++i) release_unit(u, i);
}

void RankShards::gather_unit(size_t u, size_t i) {
  if (alone()) return gather_alone(u, i);
  if (i == 0) return gather(u);
  const Unit& unit = units_[u];
  if (unit.params.empty() || gathered(unit.params[0], i)) return;
  // Device i's replicas are copies of the first device's: gathered there (a collective) when they
  // are not whole already, and released again once copied (backward reaches device i's units after
  // the first device has released them: memory stays one or two units a device).
  const bool borrowed = !gathered(unit.params[0], 0);
  gather(u);
  MemoryTagScope tag(MemoryTag::gathered);
  for (size_t k : unit.params) replicas_[k][i].impl().storage = replicas_[k][0].to(devices_[i]).storage();
  if (borrowed) release_unit(u, 0);
}

void RankShards::gather_alone(size_t u, size_t i) {
  // A group of one: replica k on device i made whole from every holder's part of it, copied from
  // holder j's device (the all-gather, for one replica); a parameter whole in device i's own piece is
  // its part's buffer, no copy.
  const Unit& unit = units_[u];
  for (size_t p = 0; p < unit.params.size(); ++p) {
    TensorImpl& t = replicas_[unit.params[p]][i].impl();
    if (t.storage) continue;
    for (size_t j = 0; j < unit.pieces.size(); ++j)  // one holder (the devices replicas): piece 0 on the first
      for (const Part& part : unit.pieces[j].parts)
        if (j == i && part.p == p && part.whole) t.storage = part.param.impl().storage;
    if (t.storage) continue;
    {
      MemoryTagScope tag(MemoryTag::gathered);
      t.storage = Tensor::empty(t.shape, t.device).storage();  // for its device's compute stream
    }
    for (const Piece& piece : unit.pieces)
      for (const Part& part : piece.parts)
        if (part.p == p)
          copy_bytes(part.param, 0, replicas_[unit.params[p]][i], float_bytes(part.lo - unit.offsets[p]), float_bytes(part.n));
  }
}

void RankShards::unit_gradients_done(size_t u, size_t i) {
  if (alone()) return;  // each gradient went into the parts as it completed (add_gradient)
  // Each device's gradients reduce-scattered as they complete, added into the chunk's summed
  // gradient as a second backward pass's would be (device i's copied to the first device first).
  if (i > 0)
    for (size_t k : units_[u].params) {
      TensorImpl& t = replicas_[k][i].impl();
      if (t.grad) replicas_[k][0].impl().grad = Tensor(t.grad).to(device()).ptr();
      t.grad.reset();
    }
  reduce_scatter_gradients(u);
}

void RankShards::start_gather(size_t u) {
  Unit& unit = units_[u];
  if (!unit.gathering.empty() || (!unit.params.empty() && gathered(unit.params[0], 0))) return;
  if (steps_ == 1 && fails_in_allgather(3))
    throw DeviceError("injected failure inside the ZeRO-3 all-gather of step 2 (D2L_FAIL_RANK_IN_ALLGATHER=" +
                      std::string(std::getenv("D2L_FAIL_RANK_IN_ALLGATHER")) + ")");
  // The rate limiter: the device past the release of the unit two releases back before more memory is taken.
  while (released_.size() >= 2) {
    released_.front().synchronize();
    released_.pop_front();
  }
  if (holders() > 1) unit.sending = chunk_on_first(unit, [](const Part& p) -> const Tensor& { return p.param; });
  MemoryTagScope tag(MemoryTag::gathered);
  for (size_t k : unit.params) unit.gathering.push_back(Tensor::empty(replicas_[k][0].shape(), device()));
  unit.works = all_gather_unit(unit, unit.sending, unit.gathering);
}

void RankShards::gather(size_t u) {
  Unit& unit = units_[u];
  if (!unit.params.empty() && gathered(unit.params[0], 0)) return;
  start_gather(u);
  for (auto& work : unit.works) work.wait();  // this device's compute stream waits for them here, not before
  for (size_t p = 0; p < unit.params.size(); ++p) replicas_[unit.params[p]][0].impl().storage = unit.gathering[p].storage();
  unit.gathering.clear(), unit.works.clear(), unit.sending = Tensor();
}

void RankShards::release_unit(size_t u, size_t i) {
  if (units_[u].params.empty() || !gathered(units_[u].params[0], i)) return;
  if (i == 0 && !alone()) {  // the first device's release is what the rate limiter waits for
    Event e;
    runtime(device()).compute.record(e);
    released_.push_back(e);
  }
  for (size_t k : units_[u].params) {
    TensorImpl& t = replicas_[k][i].impl();
    t.storage.reset();
    t.grad.reset();
  }
}

void RankShards::reduce_scatter_gradients(size_t u) {
  Unit& unit = units_[u];
  NoGrad no_grad;
  // Each gradient reduce-scattered from its .grad buffer (zeros for a parameter that got none): rank
  // r receives the sum over the ranks of the part of it that lies in its chunk, in a buffer of its own.
  const int64_t P = unit.offsets.back();
  std::vector<Tensor> sums(unit.params.size());
  std::vector<dist::Work> works;
  for (size_t p = 0; p < unit.params.size(); ++p) {
    const Tensor& w = replicas_[unit.params[p]][0];
    const Tensor g = w.grad().defined() ? w.grad() : Tensor::zeros(w.shape(), device());
    const std::vector<int64_t> counts = dist::counts_in_chunks(P, unit.offsets[p], unit.offsets[p + 1], group_);
    sums[p] = Tensor::empty({std::max<int64_t>(counts[static_cast<size_t>(group_.rank())], 1)}, device());
    works.push_back(dist::reduce_scatter_async(g, sums[p], 0, counts, group_));
    replicas_[unit.params[p]][0].impl().grad.reset();  // the communication thread holds it until it is read
  }
  for (auto& work : works) work.wait();
  // Accumulated: several backward passes before a step add up. Each part's range of its parameter's
  // sum into its summed gradient: the sum itself where it is the part's (one holder), else a copy on
  // the part's device.
  for (size_t i = 0; i < unit.pieces.size(); ++i)
    for (const Part& part : unit.pieces[i].parts) {
      const Tensor& sum = sums[part.p];
      Tensor add;
      if (sum.numel() == part.n && sum.device() == part.grad.device()) {
        add = reshape(sum, part.grad.shape());
      } else {
        add = Tensor::empty(part_shape(unit, part), part.grad.device());
        copy_bytes(sum, float_bytes(part.lo - std::max(unit.lo, unit.offsets[part.p])), add, 0, float_bytes(part.n));
      }
      add_(part.grad, add);
    }
}

std::vector<std::vector<float>> RankShards::parameters() const {
  if (stage_ < 3) return Shards::parameters();  // stages 1 and 2 keep the parameters whole: not sharded
  std::vector<std::vector<float>> out(replicas_.size());
  for (const Unit& unit : units_) {
    const Tensor whole = Tensor::empty({unit.offsets.back()}, device());
    dist::allgather(chunk_on_first(unit, [](const Part& p) -> const Tensor& { return p.param; }), whole, group_);
    const std::vector<float> v = whole.to_vector();
    for (size_t p = 0; p < unit.params.size(); ++p)
      out[unit.params[p]].assign(v.begin() + unit.offsets[p], v.begin() + unit.offsets[p + 1]);
  }
  return out;
}

void RankShards::set_parameters(const std::vector<std::vector<float>>& full) {
  if (stage_ < 3) return Shards::set_parameters(full);
  for (Unit& unit : units_)
    for (Piece& piece : unit.pieces)
      for (Part& part : piece.parts) {
        const auto flat = from_host(unit, part, [&](size_t k) -> const std::vector<float>& { return full.at(k); });
        copy_bytes(Tensor::from_vector(flat, {part.n}, part.param.device()), 0, part.param, 0, float_bytes(part.n));
      }
}

}  // namespace d2l::optim::zero

#include "core/checkpoint/sharded_checkpoint.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/checkpoint/parameters_file.hpp"
#include "core/optim/zero.hpp"

namespace d2l::io {

namespace {

const std::string kFormat = "d2l-sharded-checkpoint";
const int kVersion = 1;
const std::string kIndex = "index.json";
const std::string kParameters = "parameters.safetensors";
const int64_t kMaxEpoch = 2147483647;

using json = nlohmann::json;

// A problem with one file of the checkpoint: the message names it.
struct Problem : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& path, const std::string& what) { throw Problem("checkpoint " + path + ": " + what); }

std::string join(const std::string& dir, const std::string& name) { return (std::filesystem::path(dir) / name).string(); }
std::string rank_file(int r, int W) { return "rank-" + std::to_string(r) + "-of-" + std::to_string(W) + ".safetensors"; }

std::string checksum(const std::string& bytes) {  // FNV-1a, 64 bits, as 16 hex digits
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The trainable parameters in the Trainer's order, their names and sizes (a ConfigError when the net's
// trainable parameters are not the trainer's, in its order).
struct Flat {
  std::vector<std::string> names;
  std::vector<int64_t> sizes, offsets;  // offsets: where each starts in the flat vector
  int64_t total = 0;
};
Flat flat_layout(const nn::Block& net, const optim::Trainer& trainer, const std::string& what) {
  Flat f;
  for (auto& [name, p] : net.collect_params()) {
    if (!p->differentiable()) continue;
    if (trainer.index_of(*p) != static_cast<int64_t>(f.names.size()))
      throw ConfigError(what + ": the trainer's parameters are not this net's trainable ones, in its order ('" + name + "')");
    if (!p->shape_known())
      throw ConfigError(what + ": parameter '" + name + "' has no shape yet (deferred initialization); run a forward pass first");
    f.names.push_back(name);
    f.sizes.push_back(numel(p->shape()));
    f.offsets.push_back(f.total);
    f.total += f.sizes.back();
  }
  if (f.names.size() != trainer.num_parameters())
    throw ConfigError(what + ": the trainer has " + std::to_string(trainer.num_parameters()) +
                      " trainable parameters, this net " + std::to_string(f.names.size()));
  return f;
}

// chunk_begin's split for W ranks (dist::chunk_begin uses the world's size; a saved layout may have another).
int64_t bound(int64_t n, int r, int W) { return n * r / W; }

std::string tensor_name(const std::string& slot, const std::string& param, int64_t a) {
  return slot + "/" + param + "/" + std::to_string(a);
}

// Every rank's message ("" where it went well); throws the first one, the same on every rank.
void agree(const std::string& mine) {
  for (auto& m : dist::gather_strings(mine))
    if (!m.empty()) throw ConfigError(m);
}

std::string draw_run_id() {
  std::random_device rd;
  uint64_t x = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
               (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (static_cast<uint64_t>(::getpid()) << 16);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

uint64_t whole(const std::string& path, const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) fail(path, "no \"" + key + "\" in its __metadata__");
  try {
    size_t used = 0;
    unsigned long long v = std::stoull(it->second, &used);
    if (used != it->second.size() || it->second[0] == '-') throw std::invalid_argument("");
    return v;
  } catch (const std::exception&) {
    fail(path, "__metadata__ \"" + key + "\" is \"" + it->second.substr(0, 40) + "\", expected a whole number");
  }
}

// Where this rank's files go, and the ranks that share them: the world in `dir`, or on the dp x tp grid
// (a dp_group smaller than the world, with a tp_group) tp slice t's dp group in dir/tp-<t>-of-<T>. The
// slices hold different parameters (each its part of every split layer), so each is a checkpoint of its
// own, over its own ranks; the collectives that check and agree stay over the world.
struct Slice {
  dist::Group group;  // its ranks: W = group.size(), this rank r = group.rank()
  std::string dir;
};
Slice slice_of(const optim::Trainer& trainer, const std::string& dir, const std::string& what) {
  const auto& o = trainer.options();
  if (!o.dp_group) return {dist::Group(), dir};
  if (o.dp_group->size() == dist::world_size()) return {*o.dp_group, dir};  // every rank: the world's files
  if (!o.tp_group)
    throw ConfigError(what + ": the shards are over the group " + o.dp_group->str() + ", not the world, and the trainer has no "
                      "tp_group: files are written per tp slice of the dp x tp grid, or for shards over the world");
  const std::string name = "tp-" + std::to_string(o.tp_group->rank()) + "-of-" + std::to_string(o.tp_group->size());
  return {*o.dp_group, join(dir, name)};
}

}  // namespace

void save_sharded_checkpoint(const std::string& top, const nn::Block& net, const optim::Trainer& trainer, int64_t epoch) {
  const std::string what = "save_sharded_checkpoint " + top;
  if (epoch < 0 || epoch > kMaxEpoch) throw ConfigError(what + ": epoch " + std::to_string(epoch) + " is out of range");
  const Slice slice = slice_of(trainer, top, what);
  const std::string& dir = slice.dir;
  const Flat f = flat_layout(net, trainer, what);
  const int W = slice.group.size(), r = slice.group.rank();
  const auto& slots = trainer.state_names();
  const int64_t lo = bound(f.total, r, W), hi = bound(f.total, r + 1, W);
  // ZeRO-1 and ZeRO-2 over the ranks: this rank's chunk is the file's, read without communication.
  // Otherwise (stage 0, no step yet, a loaded state not yet placed) from state_dict(): the same choice
  // on every rank, as they run in step; a collective when sharded (every chunk gathered).
  const optim::zero::RankShards* own = trainer.rank_shards();
  if (own && own->stage() == 3) own = nullptr;
  if (own) {
    std::vector<int64_t> bounds, offsets = f.offsets;
    for (int q = 0; q <= W; ++q) bounds.push_back(bound(f.total, q, W));
    offsets.push_back(f.total);
    if (!own->placed() || trainer.loaded_state_waiting() || own->layout().bounds != bounds || own->layout().offsets != offsets)
      own = nullptr;
  }
  const std::vector<std::vector<float>> chunk = own ? own->chunk_state() : std::vector<std::vector<float>>{};
  const auto state = own ? std::map<std::string, optim::HostTensor>{} : trainer.state_dict();
  // ZeRO-3 with its parameters sharded: the trainable ones read from the shards (a collective).
  const bool sharded_params = trainer.options().zero_stage == 3 && trainer.shards() && trainer.shards()->placed();
  const std::vector<std::vector<float>> full = sharded_params ? trainer.shards()->parameters() : std::vector<std::vector<float>>{};
  // Elements [a, b) of parameter k's slot j (inside this rank's chunk).
  auto piece = [&](size_t k, size_t j, int64_t a, int64_t b) {
    if (own) {
      auto from = chunk[j].begin() + (f.offsets[k] + a - lo);
      return std::vector<float>(from, from + (b - a));
    }
    const auto& v = state.at(slots[j] + "/" + f.names[k]).values;
    return std::vector<float>(v.begin() + a, v.begin() + b);
  };
  const int64_t step = trainer.num_update();

  // The run token, world rank 0's (every tp slice's files carry the same), and the directory; the old
  // index goes before any file is written.
  char run[17] = {};
  std::string err;
  if (dist::rank() == 0) std::snprintf(run, sizeof run, "%s", draw_run_id().c_str());
  if (r == 0) {
    try {
      std::filesystem::create_directories(dir);
      std::filesystem::remove(join(dir, kIndex));
    } catch (const std::exception& e) {
      err = "checkpoint " + dir + ": cannot prepare the directory: " + e.what();
    }
  }
  agree(err);
  dist::broadcast_bytes(run, 16, 0);  // over the world
  const std::string run_id(run, 16);

  // This rank's file: its chunk of every slot of every parameter.
  SafetensorsFile file;
  for (size_t k = 0; k < f.names.size(); ++k) {
    const int64_t a = std::max(lo, f.offsets[k]) - f.offsets[k], b = std::min(hi, f.offsets[k] + f.sizes[k]) - f.offsets[k];
    if (a >= b) continue;
    for (size_t j = 0; j < slots.size(); ++j)
      file.tensors[tensor_name(slots[j], f.names[k], a)] = FileTensor::from_floats({b - a}, piece(k, j, a, b));
  }
  file.metadata = {{"format", kFormat},          {"version", std::to_string(kVersion)},
                   {"rank", std::to_string(r)},  {"world", std::to_string(W)},
                   {"step", std::to_string(step)}, {"run", run_id},
                   {"parameters", std::to_string(f.names.size())}};
  const std::string bytes = safetensors_bytes(file);
  const std::string name = rank_file(r, W);
  std::string params_info;  // rank 0's: "<bytes> <checksum>" of the parameters file
  err.clear();
  try {
    write_file_atomic(join(dir, name), {bytes});
    if (r == 0) {
      if (sharded_params) {  // the replicas are released: the trainable values from the shards, the rest from the net
        SafetensorsFile params;
        nn::ParameterDict others;
        for (auto& [name, p] : net.collect_params()) {
          const int64_t k = trainer.index_of(*p);
          if (k >= 0) params.tensors[name] = FileTensor::from_floats(p->shape(), full[static_cast<size_t>(k)]);
          else others.add(name, p);
        }
        for (auto& [name, t] : parameter_tensors(others)) params.tensors[name] = t;
        save_safetensors(join(dir, kParameters), params);
      } else {
        save_parameters(net, join(dir, kParameters));
      }
      const std::string written = read_file(join(dir, kParameters));
      params_info = std::to_string(written.size()) + " " + checksum(written);
    }
  } catch (const std::exception& e) {
    err = std::string("checkpoint: ") + e.what();
  }
  agree(err);  // every file written (a barrier too)
  const auto all_infos = dist::gather_strings(std::to_string(bytes.size()) + " " + checksum(bytes));  // world ranks'
  std::vector<std::string> infos;  // this slice's ranks'
  for (int q : slice.group.ranks()) infos.push_back(all_infos[static_cast<size_t>(q)]);
  dist::barrier();

  err.clear();
  if (r == 0) {
    try {
      json index;
      index["format"] = kFormat;
      index["version"] = kVersion;
      index["world"] = W;
      index["step"] = step;
      index["learning_rate"] = trainer.learning_rate();
      index["epoch"] = epoch;
      index["run"] = run_id;
      index["optimizer"] = trainer.optimizer();
      index["slots"] = slots;
      index["parameters"] = json::array();
      for (size_t k = 0; k < f.names.size(); ++k) index["parameters"].push_back({{"name", f.names[k]}, {"size", f.sizes[k]}});
      std::vector<int64_t> bounds;
      for (int q = 0; q <= W; ++q) bounds.push_back(bound(f.total, q, W));
      index["bounds"] = bounds;
      const size_t space = params_info.find(' ');
      index["parameters_file"] = {{"name", kParameters},
                                  {"bytes", std::stoll(params_info.substr(0, space))},
                                  {"fnv1a64", params_info.substr(space + 1)}};
      index["files"] = json::array();
      for (int q = 0; q < W; ++q) {
        const std::string& info = infos[static_cast<size_t>(q)];
        const size_t space = info.find(' ');
        index["files"].push_back({{"rank", q},
                                  {"name", rank_file(q, W)},
                                  {"bytes", std::stoll(info.substr(0, space))},
                                  {"fnv1a64", info.substr(space + 1)}});
      }
      const std::string text = index.dump(1) + "\n";
      write_file_atomic(join(dir, kIndex), {text});
    } catch (const std::exception& e) {
      err = std::string("checkpoint: ") + e.what();
    }
  }
  agree(err);
}

int64_t load_sharded_checkpoint(const std::string& top, nn::Block& net, optim::Trainer& trainer) {
  const std::string what = "load_sharded_checkpoint " + top;
  const Slice slice = slice_of(trainer, top, what);
  const std::string& dir = slice.dir;
  const Flat f = flat_layout(net, trainer, what);
  std::string run;  // the save's token, to compare across the tp slices
  std::map<std::string, optim::HostTensor> state;
  SafetensorsFile params_file;
  std::vector<ParameterValues> matched;
  int64_t epoch = 0;
  std::string err;
  try {
    const std::string index_path = join(dir, kIndex);
    if (!std::filesystem::exists(index_path)) fail(index_path, "missing (no checkpoint here, or its save did not finish)");
    json index;
    try {
      index = json::parse(read_file(index_path));
    } catch (const json::exception& e) {
      fail(index_path, std::string("not JSON: ") + e.what());
    }
    try {
      if (index.value("format", "") != kFormat) fail(index_path, "not a sharded checkpoint (its \"format\" is not \"" + kFormat + "\")");
      if (index.at("version").get<int>() != kVersion)
        fail(index_path, "version " + index.at("version").dump() + ", this program reads version " + std::to_string(kVersion));
      const int W = index.at("world").get<int>();
      if (W < 1 || W > 1 << 20) fail(index_path, "world " + std::to_string(W) + " is out of range");
      const int64_t step = index.at("step").get<int64_t>();
      epoch = index.at("epoch").get<int64_t>();
      if (epoch < 0 || epoch > kMaxEpoch) fail(index_path, "epoch " + std::to_string(epoch) + " is out of range");
      const float lr = index.at("learning_rate").get<float>();
      run = index.at("run").get<std::string>();
      if (index.at("optimizer").get<std::string>() != trainer.optimizer())
        fail(index_path, "written for optimizer " + index.at("optimizer").get<std::string>() + ", this trainer's is " + trainer.optimizer());
      if (index.at("slots").get<std::vector<std::string>>() != trainer.state_names())
        fail(index_path, "its optimizer slots are not this trainer's");
      const auto& ps = index.at("parameters");
      if (ps.size() != f.names.size())
        fail(index_path, "written for " + std::to_string(ps.size()) + " parameters, this net has " + std::to_string(f.names.size()));
      for (size_t k = 0; k < f.names.size(); ++k) {
        const std::string n = ps[k].at("name").get<std::string>();
        const int64_t s = ps[k].at("size").get<int64_t>();
        if (n != f.names[k] || s != f.sizes[k])
          fail(index_path, "parameter " + std::to_string(k) + " is '" + n + "' of " + std::to_string(s) + " elements, this net's '" +
                               f.names[k] + "' of " + std::to_string(f.sizes[k]));
      }
      const auto bounds = index.at("bounds").get<std::vector<int64_t>>();
      bool bounds_ok = bounds.size() == static_cast<size_t>(W) + 1;
      for (int q = 0; bounds_ok && q <= W; ++q) bounds_ok = bounds[static_cast<size_t>(q)] == bound(f.total, q, W);
      if (!bounds_ok) fail(index_path, "its chunk bounds are not chunk_begin's split of " + std::to_string(f.total) + " elements over " + std::to_string(W));
      const auto& files = index.at("files");
      if (files.size() != static_cast<size_t>(W)) fail(index_path, "lists " + std::to_string(files.size()) + " files for a world of " + std::to_string(W));

      // Every element of every slot, from the file that holds it.
      const auto& slots = trainer.state_names();
      std::map<std::string, std::vector<float>> values;
      std::map<std::string, std::vector<char>> seen;
      for (size_t k = 0; k < f.names.size(); ++k)
        for (auto& slot : slots) {
          values[slot + "/" + f.names[k]].assign(static_cast<size_t>(f.sizes[k]), 0.0f);
          seen[slot + "/" + f.names[k]].assign(static_cast<size_t>(f.sizes[k]), 0);
        }
      for (int q = 0; q < W; ++q) {
        const auto& entry = files[static_cast<size_t>(q)];
        const std::string name = entry.at("name").get<std::string>();
        if (name != rank_file(q, W)) fail(index_path, "file " + std::to_string(q) + " is '" + name + "', expected " + rank_file(q, W));
        const std::string path = join(dir, name);
        if (!std::filesystem::exists(path)) fail(path, "missing");
        const std::string bytes = read_file(path);
        const auto recorded = entry.at("bytes").get<uint64_t>();
        if (bytes.size() < recorded)
          fail(path, "truncated: " + std::to_string(bytes.size()) + " bytes, the index records " + std::to_string(recorded));
        SafetensorsFile file;
        try {
          file = parse_safetensors(bytes, path);
        } catch (const FileError& e) {
          fail(path, std::string("unreadable: ") + e.what());
        }
        auto fmt = file.metadata.find("format");
        if (fmt == file.metadata.end() || fmt->second != kFormat) fail(path, "not a shard of a sharded checkpoint");
        if (whole(path, file.metadata, "rank") != static_cast<uint64_t>(q) || whole(path, file.metadata, "world") != static_cast<uint64_t>(W))
          fail(path, "written as rank " + file.metadata["rank"] + " of " + file.metadata["world"] + ", the index lists it as rank " +
                         std::to_string(q) + " of " + std::to_string(W));
        const uint64_t file_step = whole(path, file.metadata, "step");
        if (file_step != static_cast<uint64_t>(step))
          fail(path, "stale: step " + std::to_string(step) + " in the index, " + std::to_string(file_step) + " in the file");
        if (file.metadata["run"] != run)
          fail(path, "from another run: run " + run + " in the index, " + file.metadata["run"] + " in the file");
        const uint64_t nparams = whole(path, file.metadata, "parameters");
        if (nparams != f.names.size())
          fail(path, "written for " + std::to_string(nparams) + " parameters, this net has " + std::to_string(f.names.size()));
        if (bytes.size() != recorded || checksum(bytes) != entry.at("fnv1a64").get<std::string>())
          fail(path, "damaged: " + std::to_string(bytes.size()) + " bytes, checksum " + checksum(bytes) + "; the index records " +
                         std::to_string(recorded) + " bytes, checksum " + entry.at("fnv1a64").get<std::string>());
        // Exactly the tensors of chunk q, F32, finite.
        const int64_t lo = bounds[static_cast<size_t>(q)], hi = bounds[static_cast<size_t>(q) + 1];
        size_t expected = 0;
        for (size_t k = 0; k < f.names.size(); ++k) {
          const int64_t a = std::max(lo, f.offsets[k]) - f.offsets[k], b = std::min(hi, f.offsets[k] + f.sizes[k]) - f.offsets[k];
          if (a >= b) continue;
          for (auto& slot : slots) {
            const std::string tname = tensor_name(slot, f.names[k], a);
            auto it = file.tensors.find(tname);
            if (it == file.tensors.end()) fail(path, "has no tensor '" + tname + "'");
            const FileTensor& t = it->second;
            if (t.dtype != FileDtype::f32 || t.shape != Shape{b - a})
              fail(path, "tensor '" + tname + "' has dtype " + dtype_name(t.dtype) + " and shape " + str(t.shape) + ", expected F32 and (" +
                             std::to_string(b - a) + ")");
            const auto v = t.floats();
            for (float x : v)
              if (!std::isfinite(x)) fail(path, "tensor '" + tname + "' has values that are not finite; refusing to resume from it");
            auto& dst = values[slot + "/" + f.names[k]];
            auto& mark = seen[slot + "/" + f.names[k]];
            std::copy(v.begin(), v.end(), dst.begin() + a);
            std::fill(mark.begin() + a, mark.begin() + b, 1);
            ++expected;
          }
        }
        if (file.tensors.size() != expected)
          fail(path, "holds " + std::to_string(file.tensors.size()) + " tensors, chunk " + std::to_string(q) + " has " + std::to_string(expected));
      }
      for (auto& [key, mark] : seen)
        if (std::find(mark.begin(), mark.end(), 0) != mark.end()) fail(index_path, "its files do not cover every element of '" + key + "'");
      for (size_t k = 0; k < f.names.size(); ++k)
        for (auto& slot : slots) {
          const std::string key = slot + "/" + f.names[k];
          state[key] = optim::HostTensor{net.collect_params()[f.names[k]].shape(), std::move(values[key])};
        }
      state["num_update"] = optim::HostTensor{{1}, {static_cast<float>(step)}};
      state["learning_rate"] = optim::HostTensor{{1}, {lr}};

      const auto& pentry = index.at("parameters_file");
      const std::string params_path = join(dir, pentry.at("name").get<std::string>());
      if (!std::filesystem::exists(params_path)) fail(params_path, "missing");
      const std::string params_bytes = read_file(params_path);
      const auto params_recorded = pentry.at("bytes").get<uint64_t>();
      if (params_bytes.size() != params_recorded || checksum(params_bytes) != pentry.at("fnv1a64").get<std::string>())
        fail(params_path, "damaged or from another save: " + std::to_string(params_bytes.size()) + " bytes, checksum " +
                              checksum(params_bytes) + "; the index records " + std::to_string(params_recorded) +
                              " bytes, checksum " + pentry.at("fnv1a64").get<std::string>());
      try {
        params_file = parse_safetensors(params_bytes, params_path);
        matched = match_parameters(net.collect_params(), params_file, params_path);
      } catch (const std::exception& e) {
        throw Problem(std::string("checkpoint ") + e.what());
      }
    } catch (const json::exception& e) {
      fail(index_path, std::string("malformed: ") + e.what());
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(err);  // every rank learns any rank's problem before anything changes
  // The tp slices' files: all of one save (their run tokens agree), or one line on every rank.
  const auto runs = dist::gather_strings(run);
  for (size_t q = 0; q < runs.size(); ++q)
    if (runs[q] != runs[0])
      throw ConfigError("checkpoint " + top + ": its tp slices are from different saves: run " + runs[0] +
                        " on rank 0, " + runs[q] + " on rank " + std::to_string(q));

  // Trainer::load_state_dict checks again before it changes anything; the same on every rank.
  try {
    trainer.load_state_dict(state);
  } catch (const std::exception& e) {
    throw ConfigError("checkpoint " + dir + ": " + e.what());
  }
  std::vector<Device> devices;
  for (auto& [name, p] : net.collect_params()) {
    devices = p->list_ctx();
    break;
  }
  if (trainer.options().zero_stage == 3 && trainer.shards() && trainer.shards()->placed()) {
    // ZeRO-3 with its parameters sharded: each holder takes its part of the trainable ones.
    std::vector<std::vector<float>> full(trainer.num_parameters());
    std::vector<ParameterValues> others;
    for (const ParameterValues& m : matched) {
      const int64_t k = trainer.index_of(*m.param);
      if (k >= 0) full[static_cast<size_t>(k)] = m.values->floats();
      else others.push_back(m);
    }
    trainer.shards()->set_parameters(full);
    matched = others;
  }
  assign_parameters(matched, devices);
  return epoch;
}

}  // namespace d2l::io

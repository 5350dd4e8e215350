// distributed: chapter 4, data parallelism over processes (d2l "Parameter Servers" and PyTorch DDP).
// Run under mpirun (./d2l chapter4 runs `mpirun -np 2`); rank 0 prints, plots and writes the trace.
//   mpirun -np 2 distributed                       (all four parts)
//   mpirun -np 2 distributed bandwidth             (ring synchronization: the collectives benchmark)
//   mpirun -np 2 distributed ddp --trace ddp.json  (DDP's buckets; one timeline for all ranks)
//   mpirun -np 2 distributed equivalence | kv
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "chapters/harness/harness.hpp"
#include "chapters/distributed/distributed.hpp"
#include "core/cli.hpp"
#include "core/dist/buckets.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/plot.hpp"

namespace dd = d2l::distributed;

namespace {

std::string human(double bytes) {
  char b[32];
  if (bytes >= 1e6) std::snprintf(b, sizeof b, "%g MB", bytes / 1e6);
  else std::snprintf(b, sizeof b, "%g KB", bytes / 1e3);
  return b;
}

void run_bandwidth(const dd::Config& cfg) {
  const bool say = cfg.verbose && d2l::dist::rank() == 0;
  if (say)
    std::printf("\n1. Ring synchronization: allreduce of float32 tensors over %d processes (%s each), the real "
                "transport (Open MPI over shared memory on one machine)\n%10s  %-8s %11s %12s %12s\n",
                d2l::dist::world_size(), d2l::str(cfg.devices).c_str(), "size", "algorithm", "time (us)", "algbw GB/s",
                "busbw GB/s");
  auto rows = dd::bandwidth(cfg);
  if (!say) return;
  for (auto& r : rows)
    std::printf("%10s  %-8s %11.1f %12.3f %12.3f\n", human(r.bytes).c_str(), r.algorithm.c_str(), r.seconds * 1e6,
                r.algbw, r.busbw);
  for (const char* algo : {"naive", "ring", "library"}) {
    const double from = dd::latency_bound_below(rows, algo);
    double peak = 0;
    for (auto& r : rows)
      if (r.algorithm == algo) peak = std::max(peak, r.busbw);
    std::printf("%-8s latency-bound below %s (busbw under half its peak of %.2f GB/s), bandwidth-bound from there\n", algo,
                human(from).c_str(), peak);
  }
  if (cfg.out_dir.empty()) return;
  d2l::PlotSpec spec;
  spec.title = "allreduce over " + std::to_string(d2l::dist::world_size()) + " processes";
  spec.xlabel = "message size (KB)";
  spec.ylabel = "busbw (GB/s)";
  spec.logx = true;
  for (const char* algo : {"naive", "ring", "library"}) {
    d2l::Series s{algo, {}, {}, {}};
    for (auto& r : rows)
      if (r.algorithm == algo) s.x.push_back(r.bytes / 1e3), s.y.push_back(r.busbw);
    spec.series.push_back(s);
  }
  const std::string path = cfg.out_dir + "/bandwidth.png", why = d2l::plot_png(spec, path);
  std::printf("%s\n", why.empty() ? ("plot: " + path).c_str() : ("no plot: " + why).c_str());
}

void print_variants(const char* title, const std::vector<dd::Variant>& v) {
  std::printf("%s\n%-34s %7s %10s %18s %10s %8s\n", title, "variant", "buckets", "MB handed", "step s (mean+-std)", "comm s",
              "hidden");
  for (auto& x : v)
    std::printf("%-34s %7zu %10.2f %10.3f +- %5.3f %10.3f %7.0f%%\n", x.name.c_str(), x.buckets, x.allreduce_bytes / 1e6, x.mean,
                x.std, x.comm_seconds, 100 * x.hidden);
}

void run_ddp(const dd::Config& cfg) {
  const bool say = cfg.verbose && d2l::dist::rank() == 0;
  if (say)
    std::printf("\n2. DDP on ResNet-18 (10 classes, batch %lld of 1x%lldx%lld per process, %d processes x %s): %d warm-up "
                "and %d timed steps per variant\n",
                (long long)cfg.batch, (long long)cfg.image, (long long)cfg.image, d2l::dist::world_size(),
                d2l::str(cfg.devices).c_str(), cfg.warmup, cfg.repeats);
  std::vector<d2l::trace::Record> events;
  auto modeled = dd::ddp(cfg, cfg.link.on(), &events);
  if (say) {
    char title[200];
    if (cfg.link.on())
      std::snprintf(title, sizeof title,
                    "over a MODELLED link (each allreduce held back to what %g Gbit/s and %g us per message would take):",
                    cfg.link.gbps, cfg.link.latency_us);
    else
      std::snprintf(title, sizeof title, "on the real transport (no link model):");
    print_variants(title, modeled);
  }
  if (cfg.link.on() && cfg.measure_without_model) {
    auto real = dd::ddp(cfg, false);
    if (say) print_variants("the same on the real transport (shared memory, no model):", real);
  }
  if (say && !cfg.out_dir.empty()) {
    d2l::BarSpec spec;
    spec.title = cfg.link.on() ? "ResNet-18 step, modelled link" : "ResNet-18 step";
    spec.ylabel = "seconds per step";
    for (auto& v : modeled) {
      std::string label = v.overlap ? std::to_string(static_cast<int>(v.bucket_mb)) + " MB" : v.bucket_mb == 0 ? "per param" : "flat";
      if (v.comm_type != cfg.comm_type) label += " bf16";
      spec.labels.push_back(label);
      spec.means.push_back(v.mean);
      spec.errors.push_back(v.std);
    }
    const std::string path = cfg.out_dir + "/ddp_step_time.png", why = d2l::bar_png(spec, path);
    std::printf("%s\n", why.empty() ? ("plot: " + path).c_str() : ("no plot: " + why).c_str());
  }
  if (!cfg.trace_file.empty()) {
    d2l::harness::write_timeline(cfg.trace_file, events);
    if (say) std::printf("timeline of one step with buckets of %g MB, every rank: %s\n", cfg.bucket_mb, cfg.trace_file.c_str());
  }
}

void run_equivalence(const dd::Config& cfg) {
  auto [diff, scale] = dd::equivalence(cfg);
  if (cfg.verbose && d2l::dist::rank() == 0)
    std::printf("\n3. Equivalence: %d processes x %zu device(s) against 1 process x %zu devices, ResNet-18, %d steps: "
                "largest parameter difference %.3g (%.3g of the largest parameter)\n",
                d2l::dist::world_size(), cfg.devices.size(), cfg.devices.size() * static_cast<size_t>(d2l::dist::world_size()),
                cfg.equivalence_steps, diff, scale > 0 ? diff / scale : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Distributed data parallelism over processes: ring allreduce, DDP's buckets, key-value store"};
  d2l::DeviceFlags dev;
  dev.num_gpus = 1;
  dd::Config cfg;
  bool quick = false;
  int64_t seed = 0;
  std::string sizes_kb, buckets, comm_hook = "allreduce";
  d2l::add_device_flags(app, dev);
  auto* bandwidth = app.add_subcommand("bandwidth", "1. the collectives benchmark: naive, ring and library allreduce by size");
  auto* ddp = app.add_subcommand("ddp", "2. DDP's buckets on ResNet-18: step time and hidden communication");
  auto* equivalence = app.add_subcommand("equivalence", "3. N processes x k devices == 1 process x N*k devices");
  auto* kv = app.add_subcommand("kv", "4. the key-value store: kv.init, kv.push, kv.pull");
  app.require_subcommand(0, 1);
  for (auto* sub : {bandwidth, ddp, equivalence, kv}) sub->fallthrough();  // flags may follow the subcommand
  auto* sizes_opt = app.add_option("--sizes-kb", sizes_kb, "bandwidth: message sizes in KB, e.g. 4,64,1024");
  auto* batch = app.add_option("--batch-size", cfg.batch, "ddp: images per process")->capture_default_str();
  auto* image = app.add_option("--image-size", cfg.image, "ddp: image height and width")->capture_default_str();
  auto* repeats = app.add_option("--repeats", cfg.repeats, "ddp: timed steps per variant")->capture_default_str();
  auto* buckets_opt = app.add_option("--buckets", buckets, "ddp: the bucket sizes (MB) launched during backward, e.g. 1,5,25,100");
  auto* bucket_mb = app.add_option("--bucket-mb", cfg.bucket_mb, "the bucket size of the traced step and of equivalence")->capture_default_str();
  app.add_option("--comm-hook", comm_hook, "ddp and equivalence: the buckets summed as allreduce (float32), bf16_compress or fp16_compress (16 bits, half the bytes), DDP's communication hooks")->capture_default_str();
  auto* link_gbps = app.add_option("--link-gbps", cfg.link.gbps, "ddp: the modelled link's bandwidth in Gbit/s, 0.001 to 1e5 (0 and --link-latency-us 0: no model)")->capture_default_str();
  auto* link_latency = app.add_option("--link-latency-us", cfg.link.latency_us, "ddp: the modelled link's latency per message in microseconds, 0 to 1e6")->capture_default_str();
  app.add_option("--out-dir", cfg.out_dir, "directory of bandwidth.png and ddp_step_time.png ('' for none)")->capture_default_str();
  app.add_option("--trace", cfg.trace_file, "ddp: one step's timeline for every rank (Chrome-trace JSON: Perfetto)");
  app.add_option("--seed", seed, "seed of the initial parameters and the data")->capture_default_str();
  dd::Config tiny;  // --quick's sizes, as make_quick writes them (quick.cpp)
  dd::make_quick(tiny);
  auto bytes = [](double b) {
    char s[32];
    std::snprintf(s, sizeof s, b >= 1e6 ? "%g MB" : "%g KB", b >= 1e6 ? b / 1e6 : b / 1e3);
    return std::string(s);
  };
  app.add_flag("--quick", quick, "tiny sizes (" + std::to_string(tiny.image) + "x" + std::to_string(tiny.image) + " images, batch " +
                                     std::to_string(tiny.batch) + ", sizes " + bytes(tiny.sizes.front()) + "-" + bytes(tiny.sizes.back()) +
                                     "): seconds");
  d2l::harness::Conv conv;
  conv.precision.mixed = true;  // --precision bf16 / fp16: ddp and equivalence train under autocast
  conv.add_flags(app);
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop between steps, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    conv.apply();
    cfg.autocast = conv.precision.autocast();
    cfg.comm_type = d2l::dist::comm_hook_type("--comm-hook", comm_hook);
    dd::Config given = cfg;
    if (quick) dd::make_quick(cfg);  // flags given explicitly keep their values
    if (*batch) cfg.batch = given.batch;
    if (*image) cfg.image = given.image;
    if (*repeats) cfg.repeats = given.repeats;
    if (*bucket_mb) cfg.bucket_mb = given.bucket_mb;
    if (*link_gbps) cfg.link.gbps = given.link.gbps;
    if (*link_latency) cfg.link.latency_us = given.link.latency_us;
    if (*sizes_opt) {
      // Each size a whole number of floats (what an allreduce of float32 moves), at least one, and no
      // two sizes the same number of floats.
      cfg.sizes.clear();
      for (double kb : d2l::parse_list("--sizes-kb", sizes_kb, /*distinct=*/true)) {
        if (!(kb >= 0.004 && kb <= 1e6))
          throw d2l::ConfigError(d2l::bad_value("--sizes-kb", kb, "expected sizes from 0.004 KB (one float) to 1e6 KB"));
        const double floats = std::floor(kb * 1e3 / 4);
        for (double b : cfg.sizes)
          if (b == 4 * floats)
            throw d2l::ConfigError(d2l::bad_value("--sizes-kb", kb, "the same number of floats (" + std::to_string(int64_t(floats)) +
                                                                    ") as another size"));
        cfg.sizes.push_back(4 * floats);
      }
      std::sort(cfg.sizes.begin(), cfg.sizes.end());
    }
    if (*buckets_opt) {
      cfg.bucket_mbs = d2l::parse_list("--buckets", buckets, /*distinct=*/true);
      for (double mb : cfg.bucket_mbs)
        if (!(mb > 0 && mb <= 1e6)) throw d2l::ConfigError("bad --buckets " + std::to_string(mb) + ": expected sizes in (0, 1e6] MB");
    }
    if (!(cfg.batch >= 1 && cfg.batch <= 4096)) throw d2l::ConfigError("bad --batch-size " + std::to_string(cfg.batch) + ": expected 1 to 4096 images per process");
    if (!(cfg.image >= 8 && cfg.image <= 256)) throw d2l::ConfigError("bad --image-size " + std::to_string(cfg.image) + ": expected 8 to 256");
    if (!(cfg.repeats >= 2 && cfg.repeats <= 1000)) throw d2l::ConfigError("bad --repeats " + std::to_string(cfg.repeats) + ": expected 2 to 1000 (a standard deviation needs two)");
    if (!std::isfinite(cfg.bucket_mb) || !(cfg.bucket_mb >= 0 && cfg.bucket_mb <= 1e6))
      throw d2l::ConfigError("bad --bucket-mb: expected 0 to 1e6 MB");
    // A modelled link every collective can finish on: at most a second per message, at least 1 Mbit/s
    // (a 45 MB gradient then takes minutes, not days).
    if (!(cfg.link.gbps == 0 || (cfg.link.gbps >= 1e-3 && cfg.link.gbps <= 1e5)))
      throw d2l::ConfigError(d2l::bad_value("--link-gbps", cfg.link.gbps, "expected 0 (no bandwidth limit) or 0.001 to 1e5 Gbit/s"));
    if (!(cfg.link.latency_us >= 0 && cfg.link.latency_us <= 1e6))
      throw d2l::ConfigError(d2l::bad_value("--link-latency-us", cfg.link.latency_us, "expected 0 to 1e6 microseconds"));
    if (seed < 0) throw d2l::ConfigError("bad --seed " + std::to_string(seed) + ": expected a number >= 0");
    cfg.seed = static_cast<uint64_t>(seed);
    d2l::check_output_dir("--out-dir", cfg.out_dir, {"bandwidth.png", "ddp_step_time.png"});
    if (!cfg.trace_file.empty()) d2l::trace::check_writable(cfg.trace_file);
    const bool all = !*bandwidth && !*ddp && !*equivalence && !*kv;
    cfg.devices = d2l::choose_devices(dev, d2l::dist::rank() == 0);
    if (d2l::dist::world_size() < 2)
      throw d2l::ConfigError("chapter 4 runs as several processes: start it with mpirun -np 2 (./d2l chapter4), "
                             "this is a world of one");
    if (d2l::dist::rank() > 0) cfg.verbose = false;
    // Every rank must run the same parts with the same sizes, or a collective would wait forever:
    // one line on every rank instead ("rank 1 has batch 8, rank 0 has 16").
    auto list = [](const std::vector<double>& v) {
      std::string t;
      for (double x : v) t += std::to_string(x) + ",";
      return t;
    };
    // The flags as given (all but the paths of this rank's own files), then what follows from them.
    d2l::dist::Fingerprint mine = d2l::harness::flag_fingerprint(app, {"--out-dir", "--trace"});
    mine.insert(mine.end(), {{"program", "distributed"},
                                  {"part", all ? "all" : app.get_subcommands()[0]->get_name()},
                                  {"devices per process", std::to_string(cfg.devices.size())},
                                  {"sizes", list(cfg.sizes)}, {"batch", std::to_string(cfg.batch)},
                                  {"image", std::to_string(cfg.image)}, {"repeats", std::to_string(cfg.repeats)},
                                  {"buckets", list(cfg.bucket_mbs)}, {"bucket_mb", std::to_string(cfg.bucket_mb)},
                                  {"link", std::to_string(cfg.link.gbps) + " Gbit/s " + std::to_string(cfg.link.latency_us) + " us"},
                                  {"seed", std::to_string(cfg.seed)}, {"quick", quick ? "yes" : "no"}});
    d2l::dist::check_same_config(mine);
    if (d2l::dist::rank() == 0)
      std::printf("%d processes (ranks) x %s; rank 0 speaks\n", d2l::dist::world_size(), d2l::str(cfg.devices).c_str());
    if (d2l::dist::rank() == 0 && cfg.autocast != d2l::DType::f32)
      std::printf("mixed precision: the DDP steps and the equivalence under autocast in %s, float32 master weights%s\n",
                  d2l::dtype_name(cfg.autocast), cfg.autocast == d2l::DType::f16 ? ", dynamic loss scaling over every rank" : "");
    if (all || *bandwidth) run_bandwidth(cfg);
    if (all || *ddp) run_ddp(cfg);
    if (all || *equivalence) run_equivalence(cfg);
    if (all || *kv) {
      if (cfg.verbose) std::printf("\n4. The key-value store across the processes:\n");
      dd::kv_walkthrough(cfg);
    }
    return 0;
  });
}

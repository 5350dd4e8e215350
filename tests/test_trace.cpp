// core/trace: stream tasks become records with the right device, stream, name, label and order; two
// devices overlap in time; idle fractions equal hand-computed values; the Chrome-trace JSON parses
// (nlohmann-json, an independent reader) and has a process per device and a lane per stream.
// Timing is only used as a lower bound (a task that sleeps 20 ms lasts at least 20 ms).
#include <doctest/doctest.h>
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "core/runtime.hpp"
#include "core/tensor.hpp"
#include "core/trace.hpp"

using namespace d2l;
using namespace std::chrono_literals;

namespace {

void sleep_task(Device d, const char* name, std::chrono::milliseconds ms) {
  launch(d, name, {}, [ms](const LaunchCtx&) { std::this_thread::sleep_for(ms); });
}

std::vector<trace::Record> only(const std::vector<trace::Record>& ev, Device d, const std::string& stream) {
  std::vector<trace::Record> out;
  for (auto& e : ev)
    if (e.device == d && e.stream == stream) out.push_back(e);
  return out;
}

const trace::Record* find(const std::vector<trace::Record>& ev, const std::string& name) {
  for (auto& e : ev)
    if (e.name == name) return &e;
  return nullptr;
}

// A fresh temporary directory, and the files in it.
std::string make_temp_dir() {
  std::string tmpl = "/tmp/d2l_test_trace_XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}
std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

}  // namespace

TEST_CASE("recording off records nothing") {
  use_devices({cpu(0), cpu(1)});
  trace::start();
  trace::stop();
  CHECK_FALSE(trace::recording());
  sleep_task(cpu(0), "untraced", 1ms);
  Tensor::from_vector(std::vector<float>{1.f, 2.f}, {2}, cpu(0)).to(cpu(1)).to_vector();
  waitall();
  CHECK(trace::events().empty());
}

TEST_CASE("tasks on two cpu devices are recorded with their device, stream, name and order") {
  use_devices({cpu(0), cpu(1)});
  trace::start();
  sleep_task(cpu(0), "first", 20ms);
  sleep_task(cpu(0), "second", 10ms);
  sleep_task(cpu(1), "third", 15ms);
  Tensor y = Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3}, cpu(0)).to(cpu(1));  // a copy on cpu(1)'s copy stream
  waitall();
  trace::stop();
  auto ev = trace::events();

  auto c0 = only(ev, cpu(0), "compute"), c1 = only(ev, cpu(1), "compute"), k1 = only(ev, cpu(1), "copy");
  REQUIRE(c0.size() == 2);
  CHECK(c0[0].name == "first");
  CHECK(c0[1].name == "second");
  CHECK(c0[0].end_us <= c0[1].start_us);  // one stream runs its tasks one after another
  CHECK(c0[0].end_us - c0[0].start_us >= 20000.0);
  CHECK(c0[1].end_us - c0[1].start_us >= 10000.0);
  REQUIRE(c1.size() == 1);
  CHECK(c1[0].name == "third");
  CHECK(c1[0].end_us - c1[0].start_us >= 15000.0);
  REQUIRE(k1.size() == 1);
  CHECK(k1[0].name == "copy");  // the copy into cpu(1) runs on cpu(1)'s copy stream
  const trace::Record* staged = find(ev, "copy from host");
  REQUIRE(staged != nullptr);
  CHECK(staged->device == cpu(0));
  CHECK(staged->stream == "copy");
  CHECK(staged->end_us <= k1[0].start_us);  // the copy waits for its source
  for (auto& e : ev) {
    CHECK(e.start_us >= 0);
    CHECK(e.end_us >= e.start_us);
    CHECK(e.label.empty());
    CHECK_FALSE(e.tag.has_value());
  }
  for (size_t i = 1; i < ev.size(); ++i) CHECK(ev[i - 1].start_us <= ev[i].start_us);  // events() is sorted
  CHECK(y.to_vector() == std::vector<float>{1.f, 2.f, 3.f});
}

TEST_CASE("tasks enqueued together on two devices overlap in the timeline") {
  use_devices({cpu(0), cpu(1)});
  // Each task waits (up to 10 s) until both have started, so they overlap when the devices run in
  // parallel; the timeline must show it.
  std::atomic<int> arrived{0};
  auto meet = [&](const LaunchCtx&) {
    arrived.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(5ms);
  };
  trace::start();
  launch(cpu(0), "meet", {}, meet);
  launch(cpu(1), "meet", {}, meet);
  waitall();
  auto ev = trace::events();
  trace::stop();
  auto c0 = only(ev, cpu(0), "compute"), c1 = only(ev, cpu(1), "compute");
  REQUIRE(c0.size() == 1);
  REQUIRE(c1.size() == 1);
  CHECK(c1[0].start_us < c0[0].end_us);
  CHECK(c0[0].start_us < c1[0].end_us);
  auto sum = trace::summarize(ev);
  REQUIRE(sum.size() == 2);
  CHECK(sum[0].device == cpu(0));
  CHECK(sum[1].device == cpu(1));
  CHECK(sum[0].idle_fraction < 0.5);  // both busy for most of the common window
  CHECK(sum[1].idle_fraction < 0.5);
}

TEST_CASE("a Label names the tasks enqueued inside it, nested labels restore the outer one") {
  use_devices({cpu(0), cpu(1)});
  trace::start();
  {
    trace::Label stage("stage 0 fwd", 3);
    sleep_task(cpu(0), "inner a", 0ms);
    {
      trace::Label inner("stage 1 fwd mb 4", 4);
      sleep_task(cpu(1), "inner b", 0ms);
    }
    sleep_task(cpu(0), "inner c", 0ms);
    std::thread other([] { sleep_task(cpu(1), "other thread", 0ms); });  // labels are per thread
    other.join();
  }
  sleep_task(cpu(0), "outside", 0ms);
  waitall();
  auto ev = trace::events();
  trace::stop();
  auto label_of = [&](const char* name) {
    const trace::Record* r = find(ev, name);
    REQUIRE(r != nullptr);
    return std::make_pair(r->label, r->tag);
  };
  CHECK(label_of("inner a") == std::make_pair(std::string("stage 0 fwd"), std::optional<int64_t>(3)));
  CHECK(label_of("inner b") == std::make_pair(std::string("stage 1 fwd mb 4"), std::optional<int64_t>(4)));
  CHECK(label_of("inner c") == std::make_pair(std::string("stage 0 fwd"), std::optional<int64_t>(3)));
  CHECK(label_of("other thread") == std::make_pair(std::string(), std::optional<int64_t>()));
  CHECK(label_of("outside") == std::make_pair(std::string(), std::optional<int64_t>()));
}

TEST_CASE("start() discards earlier records; max_records stops the recording") {
  use_devices({cpu(0), cpu(1)});
  trace::start();
  sleep_task(cpu(0), "old", 0ms);
  waitall();
  trace::start(3);
  for (int i = 0; i < 5; ++i) sleep_task(cpu(0), "new", 0ms);
  waitall();
  auto ev = trace::events();
  CHECK(ev.size() == 3);
  for (auto& e : ev) CHECK(e.name == "new");
  CHECK(trace::full());
  CHECK_FALSE(trace::recording());
  trace::start();
  CHECK_FALSE(trace::full());
  CHECK(trace::events().empty());
  trace::stop();
}

TEST_CASE("tasks on emulated GPUs are recorded on their device") {
  use_devices({emu(0), emu(1)});
  trace::start();
  sleep_task(emu(1), "on emu", 1ms);
  waitall();
  auto ev = trace::events();
  trace::stop();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].device == emu(1));
  CHECK(ev[0].stream == "compute");
}

// Hand-made: cpu(0) computes [0,10) [5,15) [20,30), copies [0,100); cpu(1) computes [40,50).
static std::vector<trace::Record> hand_made() {
  return {{cpu(0), "compute", "a", "", 0, 10, {}},     {cpu(0), "compute", "b", "", 5, 15, {}},
          {cpu(0), "compute", "c", "", 20, 30, {}},    {cpu(0), "copy", "copy", "", 0, 100, {}},
          {cpu(1), "compute", "d", "stage 1", 40, 50, 7}};
}

TEST_CASE("idle_fraction of a hand-made timeline equals the hand-computed value") {
  auto ev = hand_made();
  CHECK(trace::idle_fraction(ev, cpu(0), 0, 40) == doctest::Approx(15.0 / 40));  // busy [0,15) + [20,30)
  CHECK(trace::idle_fraction(ev, cpu(0), 10, 25) == doctest::Approx(5.0 / 15));  // busy [10,15) + [20,25)
  CHECK(trace::idle_fraction(ev, cpu(0), 30, 40) == doctest::Approx(1.0));       // copies do not count
  CHECK(trace::idle_fraction(ev, cpu(1), 0, 40) == doctest::Approx(1.0));
  CHECK(trace::idle_fraction(ev, cpu(1), 45, 100) == doctest::Approx(50.0 / 55));
  CHECK(trace::idle_fraction(ev, cpu(2), 0, 100) == doctest::Approx(1.0));
  CHECK_THROWS_AS(trace::idle_fraction(ev, cpu(0), 10, 10), std::invalid_argument);

  auto sum = trace::summarize(ev);  // window [0, 100)
  REQUIRE(sum.size() == 2);
  CHECK(sum[0].device == cpu(0));
  CHECK(sum[0].compute_tasks == 3);
  CHECK(sum[0].copy_tasks == 1);
  CHECK(sum[0].busy_us == doctest::Approx(25));
  CHECK(sum[0].idle_fraction == doctest::Approx(0.75));
  CHECK(sum[1].device == cpu(1));
  CHECK(sum[1].idle_fraction == doctest::Approx(0.9));
  CHECK(trace::idle_line(sum) == "cpu(0) 0.75, cpu(1) 0.90");
}

TEST_CASE("op_times sums the compute stream's task durations by kind of op") {
  auto rec = [](const char* name, const char* stream, double a, double b) {
    return trace::Record{cpu(0), stream, name, "", a, b, std::nullopt};
  };
  const std::vector<trace::Record> ev{rec("conv2d", "compute", 0, 1000),         rec("conv2d_backward_data", "compute", 0, 500),
                                      rec("batch_norm_backward", "compute", 0, 260), rec("multi_sgd_mom_update", "compute", 0, 100),
                                      rec("add_", "compute", 0, 20),               rec("matmul", "compute", 0, 3000),
                                      rec("conv2d", "copy", 0, 9000)};  // a copy stream task: not counted
  const trace::OpTimes t = trace::op_times(ev);
  CHECK(t.convolutions_ms == doctest::Approx(1.5));
  CHECK(t.batch_norm_ms == doctest::Approx(0.26));
  CHECK(t.optimizer_ms == doctest::Approx(0.12));
  CHECK(t.other_ms == doctest::Approx(3.0));
  CHECK(trace::op_times_line(t) == "convolutions 1.5, batch_norm 0.3, optimizer 0.1, other 3.0");
}

TEST_CASE("the Chrome-trace JSON parses and has a process per device and a lane per stream") {
  auto ev = hand_made();
  ev.push_back({cpu(1), "copy", "copy", "say \"hi\"\n\\", 60, 61.5, {}});  // escaping
  std::string dir = make_temp_dir(), path = dir + "/trace.json";
  trace::write_chrome_json(path, ev);
  CHECK(files_in(dir) == std::set<std::string>{"trace.json"});  // no temporary file left behind
  std::ifstream in(path);
  nlohmann::json doc = nlohmann::json::parse(in);
  REQUIRE(doc["traceEvents"].is_array());

  std::map<int, std::string> process;                // pid -> "cpu(0)"
  std::map<std::pair<int, int>, std::string> lane;   // (pid, tid) -> "compute"
  std::vector<nlohmann::json> complete;
  for (auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") process[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_name") lane[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] == "X") complete.push_back(e);
  }
  CHECK(process.size() == 2);
  std::set<std::string> names;
  for (auto& [pid, name] : process) names.insert(name);
  CHECK(names == std::set<std::string>{"cpu(0)", "cpu(1)"});
  CHECK(lane.size() == 4);  // compute and copy on each device
  REQUIRE(complete.size() == ev.size());
  for (size_t i = 0; i < ev.size(); ++i) {  // written in the given order
    auto& e = complete[i];
    CAPTURE(i);
    CHECK(process[e["pid"]] == ev[i].device.str());
    CHECK(lane[{e["pid"], e["tid"]}] == ev[i].stream);
    CHECK(e["ts"].get<double>() == doctest::Approx(ev[i].start_us));
    CHECK(e["dur"].get<double>() == doctest::Approx(ev[i].end_us - ev[i].start_us));
    CHECK(e["name"] == (ev[i].label.empty() ? ev[i].name : ev[i].label));
    CHECK(e["args"]["op"] == ev[i].name);
  }
  CHECK(complete[4]["args"]["tag"] == 7);
  CHECK(complete[5]["name"] == "say \"hi\"\n\\");
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("check_writable rejects a missing directory and a directory, naming the path") {
  std::string dir = make_temp_dir();
  CHECK_NOTHROW(trace::check_writable(dir + "/t.json"));
  try {
    trace::check_writable(dir + "/missing/t.json");
    FAIL("accepted a missing directory");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find(dir + "/missing/t.json") != std::string::npos);
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
  CHECK_THROWS_AS(trace::check_writable(dir), ConfigError);
  CHECK_THROWS_AS(trace::check_writable(""), ConfigError);
  CHECK_THROWS_AS(trace::write_chrome_json(dir + "/missing/t.json", hand_made()), ConfigError);
  CHECK(files_in(dir).empty());
  ::rmdir(dir.c_str());
}

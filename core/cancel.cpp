#include "core/cancel.hpp"

#include <atomic>

namespace d2l {

static std::atomic<bool> g_cancelled{false};

void cancel_queued_work() { g_cancelled.store(true, std::memory_order_release); }
bool work_cancelled() { return g_cancelled.load(std::memory_order_acquire); }
static_assert(std::atomic<bool>::is_always_lock_free, "cancel_queued_work() runs in a signal handler");

}  // namespace d2l

// What every class that owns a resource (a thread, a file, a stack, a scope to undo) derives from:
// it can be neither copied nor assigned, so the resource has one owner and is released once.
#pragma once

namespace d2l {

struct NoCopy {
  NoCopy() = default;
  NoCopy(const NoCopy&) = delete;
  NoCopy& operator=(const NoCopy&) = delete;
};

}  // namespace d2l

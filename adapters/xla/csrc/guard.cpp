// handoff-xla's guard around PJRT calls: a C++ exception thrown inside a plugin must
// never unwind into Rust frames (Rust aborts the process on a foreign exception). Every
// PJRT C API function has the shape `PJRT_Error* fn(Args*)`, so one trampoline guards
// them all; `PJRT_Error_Destroy` and `PJRT_Error_Message` return nothing and have their
// own. See src/result/guard.rs.
#include <cxxabi.h>

#include <cstddef>
#include <cstring>
#include <exception>

namespace {

// Copies `what` into `buf` (NUL-terminated, truncated to `cap - 1` bytes); returns
// the length written.
std::size_t copy_message(const char* what, char* buf, std::size_t cap) noexcept {
  if (buf == nullptr || cap == 0) {
    return 0;
  }
  if (what == nullptr) {
    what = "";
  }
  std::size_t n = std::strlen(what);
  if (n > cap - 1) {
    n = cap - 1;
  }
  std::memcpy(buf, what, n);
  buf[n] = '\0';
  return n;
}

}  // namespace

extern "C" {

struct PJRT_Error;

// What `handoff_xla_guarded_call` saw.
enum HandoffXlaGuard : int {
  // The function returned; its result is in `*out`.
  HANDOFF_XLA_RETURNED = 0,
  // A `std::exception` escaped; its `what()` is in `buf`.
  HANDOFF_XLA_THREW_STD = 1,
  // Something else was thrown; `buf` holds its type's name where the runtime knows it.
  HANDOFF_XLA_THREW_OTHER = 2,
};

typedef PJRT_Error* (*handoff_xla_pjrt_fn)(void* args);
typedef void (*handoff_xla_void_fn)(void* args);

// Calls `fn(args)`. On return, stores the result in `*out` and returns
// HANDOFF_XLA_RETURNED. If a C++ exception escapes `fn`, catches it, writes its
// message into `buf` (`cap` bytes, NUL-terminated; `*len` is its length) and returns
// HANDOFF_XLA_THREW_STD or HANDOFF_XLA_THREW_OTHER. Never throws.
int handoff_xla_guarded_call(handoff_xla_pjrt_fn fn, void* args, PJRT_Error** out, char* buf, std::size_t cap,
                             std::size_t* len) noexcept {
  try {
    *out = fn(args);
    return HANDOFF_XLA_RETURNED;
  } catch (abi::__forced_unwind&) {
    // Thread cancellation is not an error and may not be swallowed; it cannot
    // unwind through Rust frames either, so the process ends here, as it would there.
    // PJRT does not cancel the threads that call it.
    std::terminate();
  } catch (const std::exception& e) {
    *len = copy_message(e.what(), buf, cap);
    return HANDOFF_XLA_THREW_STD;
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    *len = copy_message(t != nullptr ? t->name() : "(unknown type)", buf, cap);
    return HANDOFF_XLA_THREW_OTHER;
  }
}

// `handoff_xla_guarded_call` for the functions that return nothing.
int handoff_xla_guarded_call_void(handoff_xla_void_fn fn, void* args, char* buf, std::size_t cap,
                                  std::size_t* len) noexcept {
  try {
    fn(args);
    return HANDOFF_XLA_RETURNED;
  } catch (abi::__forced_unwind&) {
    // Thread cancellation is not an error and may not be swallowed; it cannot
    // unwind through Rust frames either, so the process ends here, as it would there.
    // PJRT does not cancel the threads that call it.
    std::terminate();
  } catch (const std::exception& e) {
    *len = copy_message(e.what(), buf, cap);
    return HANDOFF_XLA_THREW_STD;
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    *len = copy_message(t != nullptr ? t->name() : "(unknown type)", buf, cap);
    return HANDOFF_XLA_THREW_OTHER;
  }
}

}  // extern "C"

// For handoff-xla's own tests of the guard: throws what a plugin could. `kind` 0 throws a
// std::runtime_error with `what`, 1 an int, 2 a std::exception-derived type whose
// what() is empty.
#include <stdexcept>

namespace {
struct EmptyWhat : std::exception {
  const char* what() const noexcept override { return ""; }
};
}  // namespace

extern "C" PJRT_Error* handoff_xla_test_throw(void* args) {
  struct Args {
    int kind;
    const char* what;
  };
  const Args* a = static_cast<const Args*>(args);
  switch (a->kind) {
    case 0:
      throw std::runtime_error(a->what);
    case 1:
      throw 7;
    default:
      throw EmptyWhat();
  }
}

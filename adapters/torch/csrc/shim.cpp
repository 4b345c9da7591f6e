// handoff-torch's shim over libtorch: tensor facts, zero-copy views of foreign memory
// with a deleter, and PyTorch's CUDA streams and caching allocator. See shim.h.
#include "shim.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/ScalarType.h>

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <sstream>
#include <string>

#ifdef HANDOFF_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

char* message(const std::string& s) {
  char* m = static_cast<char*>(std::malloc(s.size() + 1));
  if (m != nullptr) {
    std::memcpy(m, s.c_str(), s.size() + 1);
  }
  return m;
}

void copy_name(char* dst, const std::string& s) {
  std::strncpy(dst, s.c_str(), 31);
  dst[31] = '\0';
}

}  // namespace

// Runs `body`; turns every exception into a returned message.
#define HF_TRY(body)                                                    \
  try {                                                                 \
    body;                                                               \
    return nullptr;                                                     \
  } catch (const c10::Error& e) {                                       \
    return message(e.what_without_backtrace());                         \
  } catch (const std::exception& e) {                                   \
    return message(e.what());                                           \
  } catch (...) {                                                       \
    return message("unknown C++ exception");                            \
  }

extern "C" {

void hf_free_message(char* m) { std::free(m); }

char* hf_describe(const void* tensor, hf_facts* out, int64_t* sizes, int64_t* strides, int32_t cap,
                  int32_t what) {
  HF_TRY({
    std::memset(out, 0, sizeof(*out));
    const at::Tensor& t = *static_cast<const at::Tensor*>(tensor);
    if (!t.defined()) {
      return nullptr;
    }
    out->defined = 1;
    out->layout = static_cast<int32_t>(t.layout());
    out->scalar_type = static_cast<int32_t>(t.scalar_type());
    out->device_type = static_cast<int32_t>(t.device().type());
    out->device_index = t.device().has_index() ? t.device().index() : -1;
    // Names are for refusals only, and formatting them costs more than the rest of
    // the description: the caller asks for them again when it refuses.
    if ((what & HF_DESCRIBE_NAMES) != 0) {
      std::ostringstream layout;
      layout << t.layout();
      copy_name(out->layout_name, layout.str());
      copy_name(out->dtype_name, c10::toString(t.scalar_type()));
      copy_name(out->device_name, t.device().str());
    }
    out->is_conj = t.is_conj() ? 1 : 0;
    out->is_neg = t.is_neg() ? 1 : 0;
    out->requires_grad = t.requires_grad() ? 1 : 0;
    out->ndim = static_cast<int32_t>(t.dim());
    out->itemsize = static_cast<int32_t>(t.element_size());
    if (t.layout() != at::kStrided || t.is_quantized() || t.device().is_meta()) {
      return nullptr;
    }
#ifdef HANDOFF_TORCH_CUDA
    if ((what & HF_DESCRIBE_STREAM) != 0 && t.device().is_cuda()) {
      out->stream = reinterpret_cast<uint64_t>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
      out->has_stream = 1;
    }
#endif
    // A tensor without storage (a functional or fake wrapper) throws here.
    out->data = t.numel() == 0 ? nullptr : const_cast<void*>(t.const_data_ptr());
    if (out->ndim <= cap) {
      for (int32_t i = 0; i < out->ndim; ++i) {
        sizes[i] = t.size(i);
        strides[i] = t.stride(i);
      }
    }
  })
}

char* hf_from_blob(void* data, int32_t ndim, const int64_t* sizes, const int64_t* strides,
                   int32_t scalar_type, int32_t device_type, int32_t device_index, void* ctx,
                   hf_deleter deleter, void** out_tensor) {
  bool owned = false;  // whether a DataPtr owns ctx (then it, not we, calls the deleter)
  try {
    *out_tensor = nullptr;
    auto st = static_cast<c10::ScalarType>(scalar_type);
    c10::Device device(static_cast<c10::DeviceType>(device_type),
                       static_cast<c10::DeviceIndex>(device_index));
    c10::DataPtr data_ptr(data, ctx, deleter, device);
    owned = true;
    c10::IntArrayRef sz(sizes, static_cast<size_t>(ndim));
    c10::IntArrayRef sd(strides, static_cast<size_t>(ndim));
    size_t nbytes = at::detail::computeStorageNbytes(sz, sd, c10::elementSize(st));
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data_ptr),
                         /*allocator=*/nullptr, /*resizable=*/false);
    auto options = at::TensorOptions().dtype(st).device(device);
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), options.computeDispatchKey(),
                                                            options.dtype());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sz, sd);
    *out_tensor = new at::Tensor(std::move(t));
    return nullptr;
  } catch (const c10::Error& e) {
    if (!owned) deleter(ctx);
    return message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    if (!owned) deleter(ctx);
    return message(e.what());
  } catch (...) {
    if (!owned) deleter(ctx);
    return message("unknown C++ exception");
  }
}

}  // extern "C"

// ---------------------------------------------------------------------------------
// CUDA: loading libtorch_cuda, streams, the caching allocator.

namespace {

// Constant-initialized: the constructor below may run before this file's dynamic
// initializers, which would otherwise reset a std::string set by it.
std::once_flag load_once;
void* torch_cuda = nullptr;
char load_error[1024];

void set_load_error(const std::string& s) {
  std::strncpy(load_error, s.c_str(), sizeof(load_error) - 1);
  load_error[sizeof(load_error) - 1] = '\0';
}

void load_torch_cuda() {
  std::call_once(load_once, [] {
    if (const char* off = std::getenv("HANDOFF_TORCH_NO_CUDA"); off != nullptr && off[0] != '\0' &&
                                                                 std::strcmp(off, "0") != 0) {
      set_load_error("HANDOFF_TORCH_NO_CUDA is set");
      return;
    }
    torch_cuda = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL);
    if (torch_cuda != nullptr) return;
    const char* e = dlerror();
    set_load_error(e != nullptr ? e : "dlopen(libtorch_cuda.so) failed");
    // Next to libtorch_cpu.so, which this process has loaded already.
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) != 0 && info.dli_fname != nullptr) {
      std::string path(info.dli_fname);
      auto slash = path.rfind('/');
      if (slash != std::string::npos) {
        path = path.substr(0, slash + 1) + "libtorch_cuda.so";
        torch_cuda = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
        if (torch_cuda != nullptr) {
          load_error[0] = '\0';
          return;
        }
        const char* e2 = dlerror();
        set_load_error(e2 != nullptr ? std::string(e2) : ("dlopen(" + path + ") failed"));
      }
    }
  });
}

// Before anything in the process asks ATen whether CUDA exists (it caches the answer).
__attribute__((constructor)) void load_at_start() {
  try {
    load_torch_cuda();
  } catch (...) {
  }
}

}  // namespace

extern "C" {

char* hf_load_torch_cuda(int32_t* loaded) {
  HF_TRY({
    load_torch_cuda();
    *loaded = torch_cuda != nullptr ? 1 : 0;
    if (torch_cuda == nullptr && load_error[0] != '\0') {
      return message(load_error);
    }
  })
}

#ifdef HANDOFF_TORCH_CUDA

namespace {
c10::cuda::CUDAStream stream_of(int32_t device, uint64_t raw) {
  auto index = static_cast<c10::DeviceIndex>(device);
  if (raw == 0) {
    return c10::cuda::getDefaultCUDAStream(index);
  }
  return c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(raw), index);
}
}  // namespace

int32_t hf_cuda_compiled(void) { return 1; }

char* hf_cuda_current_stream(int32_t device, uint64_t* out) {
  HF_TRY({
    auto s = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    *out = reinterpret_cast<uint64_t>(s.stream());
  })
}

char* hf_cuda_set_current_stream(int32_t device, uint64_t raw) {
  HF_TRY({ c10::cuda::setCurrentCUDAStream(stream_of(device, raw)); })
}

char* hf_cuda_stream_from_pool(int32_t device, int32_t high_priority, uint64_t* out) {
  HF_TRY({
    auto s = c10::cuda::getStreamFromPool(high_priority != 0, static_cast<c10::DeviceIndex>(device));
    *out = reinterpret_cast<uint64_t>(s.stream());
  })
}

char* hf_cuda_record_stream(const void* tensor, int32_t device, uint64_t raw, int32_t* recorded) {
  HF_TRY({
    *recorded = 0;
    const at::Tensor& t = *static_cast<const at::Tensor*>(tensor);
    if (!t.has_storage()) return nullptr;
    const c10::DataPtr& dp = t.storage().data_ptr();
    auto* allocator = c10::cuda::CUDACachingAllocator::get();
    if (dp.get() == nullptr || allocator == nullptr || allocator->raw_deleter() == nullptr ||
        dp.get_deleter() != allocator->raw_deleter()) {
      return nullptr;
    }
    c10::cuda::CUDACachingAllocator::recordStream(dp, stream_of(device, raw));
    *recorded = 1;
  })
}

char* hf_cuda_sleep(int32_t device, int64_t cycles) {
  HF_TRY({
    load_torch_cuda();
    if (torch_cuda == nullptr) {
      return message(std::string("libtorch_cuda.so is not loaded: ") + load_error);
    }
    using sleep_fn = void (*)(int64_t);
    auto f = reinterpret_cast<sleep_fn>(dlsym(torch_cuda, "_ZN2at4cuda5sleepEl"));
    if (f == nullptr) {
      return message("at::cuda::sleep(int64_t) is not in libtorch_cuda.so");
    }
    // Not CUDAGuard: its inline event methods would make the shim link libcudart.
    auto previous = c10::cuda::current_device();
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    try {
      f(cycles);
    } catch (...) {
      c10::cuda::set_device(previous);
      throw;
    }
    c10::cuda::set_device(previous);
  })
}

// at::cuda::CUDAGraph, reached through libtorch_cuda.so's symbols (the shim does not
// link it): constructed in memory the shim allocates, its methods called as the
// functions they are (`this` first).
}  // extern "C"
namespace {
using Graph = at::cuda::CUDAGraph;

template <typename F>
F graph_fn(const char* symbol) {
  load_torch_cuda();
  if (torch_cuda == nullptr) {
    throw std::runtime_error(std::string("libtorch_cuda.so is not loaded: ") + load_error);
  }
  auto f = reinterpret_cast<F>(dlsym(torch_cuda, symbol));
  if (f == nullptr) {
    throw std::runtime_error(std::string("at::cuda::CUDAGraph's ") + symbol + " is not in libtorch_cuda.so");
  }
  return f;
}
}  // namespace
extern "C" {

char* hf_graph_new(void** out) {
  HF_TRY({
    *out = nullptr;
    auto construct = graph_fn<void (*)(Graph*, bool)>("_ZN2at4cuda9CUDAGraphC1Eb");
    void* memory = ::operator new(sizeof(Graph), std::align_val_t(alignof(Graph)));
    try {
      construct(static_cast<Graph*>(memory), /*keep_graph=*/true);
    } catch (...) {
      ::operator delete(memory, std::align_val_t(alignof(Graph)));
      throw;
    }
    *out = memory;
  })
}

char* hf_graph_capture_begin(void* graph, int32_t device, int32_t mode) {
  HF_TRY({
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto begin = graph_fn<void (*)(Graph*, at::cuda::MempoolId_t, cudaStreamCaptureMode)>(
        "_ZN2at4cuda9CUDAGraph13capture_beginESt4pairIyyE21cudaStreamCaptureMode");
    begin(static_cast<Graph*>(graph), at::cuda::MempoolId_t{0, 0}, static_cast<cudaStreamCaptureMode>(mode));
  })
}

char* hf_graph_capture_end(void* graph, void** raw_graph) {
  HF_TRY({
    *raw_graph = nullptr;
    graph_fn<void (*)(Graph*)>("_ZN2at4cuda9CUDAGraph11capture_endEv")(static_cast<Graph*>(graph));
    *raw_graph = graph_fn<cudaGraph_t (*)(Graph*)>("_ZN2at4cuda9CUDAGraph14raw_cuda_graphEv")(
        static_cast<Graph*>(graph));
  })
}

char* hf_graph_instantiate(void* graph) {
  HF_TRY({ graph_fn<void (*)(Graph*)>("_ZN2at4cuda9CUDAGraph11instantiateEv")(static_cast<Graph*>(graph)); })
}

char* hf_graph_replay(void* graph) {
  HF_TRY({ graph_fn<void (*)(Graph*)>("_ZN2at4cuda9CUDAGraph6replayEv")(static_cast<Graph*>(graph)); })
}

char* hf_graph_free(void* graph) {
  HF_TRY({
    if (graph == nullptr) return nullptr;
    graph_fn<void (*)(Graph*)>("_ZN2at4cuda9CUDAGraphD1Ev")(static_cast<Graph*>(graph));
    ::operator delete(graph, std::align_val_t(alignof(Graph)));
  })
}

#else  // no CUDA headers at build time

namespace {
char* no_cuda() {
  return message("handoff-torch's shim was built without the CUDA headers (see build.rs)");
}
}  // namespace

int32_t hf_cuda_compiled(void) { return 0; }
char* hf_cuda_current_stream(int32_t, uint64_t*) { return no_cuda(); }
char* hf_cuda_set_current_stream(int32_t, uint64_t) { return no_cuda(); }
char* hf_cuda_stream_from_pool(int32_t, int32_t, uint64_t*) { return no_cuda(); }
char* hf_cuda_record_stream(const void*, int32_t, uint64_t, int32_t* recorded) {
  *recorded = 0;
  return no_cuda();
}
char* hf_cuda_sleep(int32_t, int64_t) { return no_cuda(); }
char* hf_graph_new(void** out) {
  *out = nullptr;
  return no_cuda();
}
char* hf_graph_capture_begin(void*, int32_t, int32_t) { return no_cuda(); }
char* hf_graph_capture_end(void*, void** raw_graph) {
  *raw_graph = nullptr;
  return no_cuda();
}
char* hf_graph_instantiate(void*) { return no_cuda(); }
char* hf_graph_replay(void*) { return no_cuda(); }
char* hf_graph_free(void*) { return no_cuda(); }

#endif

}  // extern "C"

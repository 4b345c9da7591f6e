// The C ABI of handoff-torch's shim: what tch 0.24 does not expose.
//
// Every function that can fail returns NULL on success or a malloc'd message on
// failure (free it with hf_free_message). No C++ exception leaves this library.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*hf_deleter)(void* ctx);

// What an exporter needs to know about a tensor, read without throwing.
typedef struct hf_facts {
  int32_t defined;
  int32_t layout;       // c10::Layout (0 = strided)
  int32_t scalar_type;  // c10::ScalarType
  int32_t device_type;  // c10::DeviceType (0 = CPU, 1 = CUDA)
  int32_t device_index;
  int32_t is_conj;
  int32_t is_neg;
  int32_t requires_grad;
  int32_t ndim;
  int32_t itemsize;
  int32_t has_stream;  // 1 when `stream` holds the current stream (HF_DESCRIBE_STREAM)
  void* data;  // address of the first element (NULL when the tensor is empty)
  uint64_t stream;  // PyTorch's current CUDA stream of the tensor's device
  char layout_name[32];
  char device_name[32];
  char dtype_name[32];
} hf_facts;

void hf_free_message(char* message);

// What hf_describe reads besides the facts: the names (layout, dtype, device), for
// refusals; PyTorch's current stream of a CUDA tensor's device, for an export (one
// call instead of two).
#define HF_DESCRIBE_NAMES 1
#define HF_DESCRIBE_STREAM 2

// Reads a tensor's facts; sizes and strides get `ndim` values when ndim <= cap.
// `what` is a set of HF_DESCRIBE_* bits.
char* hf_describe(const void* tensor, hf_facts* out, int64_t* sizes, int64_t* strides, int32_t cap,
                  int32_t what);

// A tensor viewing `data` (no copy). `ctx` is consumed in every case: on success the
// tensor owns it and calls deleter(ctx) once when its storage dies; on failure
// deleter(ctx) has already been called, once.
char* hf_from_blob(void* data, int32_t ndim, const int64_t* sizes, const int64_t* strides,
                   int32_t scalar_type, int32_t device_type, int32_t device_index, void* ctx,
                   hf_deleter deleter, void** out_tensor);

// 1 when the shim was compiled with the CUDA headers.
int32_t hf_cuda_compiled(void);
// Loads libtorch_cuda.so once (RTLD_NOW | RTLD_GLOBAL); *loaded is 1 when it is loaded.
char* hf_load_torch_cuda(int32_t* loaded);
char* hf_cuda_current_stream(int32_t device, uint64_t* out);
char* hf_cuda_set_current_stream(int32_t device, uint64_t raw);
char* hf_cuda_stream_from_pool(int32_t device, int32_t high_priority, uint64_t* out);
// recordStream on the consumer stream when the tensor's storage comes from the CUDA
// caching allocator (*recorded = 1); otherwise nothing is done (*recorded = 0).
char* hf_cuda_record_stream(const void* tensor, int32_t device, uint64_t raw, int32_t* recorded);
// at::cuda::sleep(cycles) on the current stream of the current device.
char* hf_cuda_sleep(int32_t device, int64_t cycles);

// PyTorch's CUDA graph (at::cuda::CUDAGraph with keep_graph = true), whose capture
// uses PyTorch's own capture memory pool. The capture runs on the current stream of
// `device` (made the current device) (not the default stream); `mode` is a cudaStreamCaptureMode
// (0 global, 1 thread-local, 2 relaxed). After hf_graph_capture_end, *raw_graph is the
// cudaGraph_t, which may be edited before hf_graph_instantiate. hf_graph_free destroys
// the graph and its executable graph.
char* hf_graph_new(void** out);
char* hf_graph_capture_begin(void* graph, int32_t device, int32_t mode);
char* hf_graph_capture_end(void* graph, void** raw_graph);
char* hf_graph_instantiate(void* graph);
char* hf_graph_replay(void* graph);
char* hf_graph_free(void* graph);

#ifdef __cplusplus
}
#endif

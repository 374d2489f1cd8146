/* The slice of TFLite's C API a libedgetpu stand-in needs.
 *
 * TfLiteDelegate mirrors the struct in tensorflow/lite/core/c/common.h (fields
 * are only ever appended there, so this prefix layout is what every TFLite
 * since 2.x and ai-edge-litert read). The plugin entry points are those of
 * tensorflow/lite/delegates/external/external_delegate_interface.h, which
 * `load_delegate` looks up with ctypes.
 */
#include <stddef.h>
#include <stdint.h>

typedef struct TfLiteDelegate {
  void* data_;
  int (*Prepare)(void* context, struct TfLiteDelegate* delegate);
  int (*CopyFromBufferHandle)(void* context, struct TfLiteDelegate* delegate, int handle, void* tensor);
  int (*CopyToBufferHandle)(void* context, struct TfLiteDelegate* delegate, int handle, void* tensor);
  void (*FreeBufferHandle)(void* context, struct TfLiteDelegate* delegate, int* handle);
  int64_t flags;
  void* opaque_delegate_builder;
} TfLiteDelegate;

typedef void (*ReportError)(const char*);

const char* edgetpu_version(void) {
  return "BuildLabel(COMPILER=fake,DATE=redacted,TIME=redacted,CL_NUMBER=0), RuntimeVersion(14)";
}

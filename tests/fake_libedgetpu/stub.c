/* A working libedgetpu stand-in: a delegate that claims no node, so the
 * interpreter runs every op on the CPU. */
#include <stdlib.h>
#include "common.h"

static int prepare(void* context, TfLiteDelegate* delegate) { return 0; /* kTfLiteOk */ }

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, ReportError report) {
  TfLiteDelegate* delegate = calloc(1, sizeof(TfLiteDelegate));
  delegate->Prepare = prepare;
  return delegate;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { free(delegate); }

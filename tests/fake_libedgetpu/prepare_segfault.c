/* A libedgetpu whose delegate loads, then crashes the interpreter that applies it
 * (its Prepare dereferences NULL): what a probe sees when the interpreter build
 * itself crashes on the model after the delegate loaded. */
#include <stdlib.h>
#include "common.h"

static int prepare(void* context, TfLiteDelegate* delegate) {
  volatile int* nowhere = NULL;
  return *nowhere;
}

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, ReportError report) {
  TfLiteDelegate* delegate = calloc(1, sizeof(TfLiteDelegate));
  delegate->Prepare = prepare;
  return delegate;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { free(delegate); }

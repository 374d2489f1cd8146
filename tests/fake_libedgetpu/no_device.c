/* A libedgetpu that finds no Edge TPU: it logs as libedgetpu does and
 * returns no delegate. */
#include <stdio.h>
#include "common.h"

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, ReportError report) {
  fprintf(stderr, "E edgetpu_delegate_for_custom_op.cc] Failed to open device: no Edge TPU found\n");
  report("Failed to open device\n");
  return NULL;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) {}
